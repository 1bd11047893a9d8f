"""The embedded draft's card: how it was made (data, training, learning curves) and what it measures.

`export` copies the best checkpoint of a training run to assets/draft/ with the card; `measure` adds
Spec-Bench figures of the embedded pair. Every number in the card is written by one of these.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import torch

from ..common.files import atomic_write
from ..core.generate import generate
from ..core.prompt import encode_prompt
from ..core.stats import Counts
from ..eval.schemas import DraftCard, checked
from ..eval.tasks import load_spec_bench
from ..models.embedded import EMBEDDED_DRAFT_DIR
from ..runtime.costs import measure_costs
from . import data, passages, prompts

CARD = "card.json"


def read_card(directory=EMBEDDED_DRAFT_DIR) -> dict:
    path = Path(directory) / CARD
    return json.loads(path.read_text()) if path.exists() else {}


def write_card(card: dict, directory=EMBEDDED_DRAFT_DIR) -> None:
    text = json.dumps(checked(DraftCard, card), indent=1) + "\n"
    atomic_write(Path(directory) / CARD, lambda tmp: tmp.write_text(text))


def data_summary(records: list[dict], data_dir=data.SHARDS_DIR) -> dict:
    """Every shard in the folder (the card's `training.split` says what the run trained and held out)."""
    by_source = defaultdict(Counter)
    for r in records:
        kind = "greedy" if r["greedy"] else "sampled_t1"
        by_source[r["source"]][f"{kind}_responses"] += 1
        by_source[r["source"]][f"{kind}_tokens"] += len(r["response_ids"])
    return (
        {
            "scope": "every shard in the folder when the card was written; training.split is what the run "
            "trained on (its --sources and --replay) and held out",
            "responses": len(records),
            "response_tokens": sum(len(r["response_ids"]) for r in records),
            "prompt_tokens": sum(len(r["prompt_ids"]) for r in records),
            "ended_at_eos": sum(r["ended"] for r in records) / max(len(records), 1),
            "by_source": {k: dict(v) for k, v in sorted(by_source.items())},
            "commands": data.read_runs(data_dir),
        }
        | ({"broad_prompts": broad_prompts_summary()} if "broad" in by_source else {})
        | ({"passage_prompts": passage_prompts_summary()} if "passages" in by_source else {})
    )


def broad_prompts_summary() -> dict:
    """How the `broad` source's prompts were made, and how many of each category."""
    rows = prompts.read_prompts()
    return {
        "prompts": len(rows),
        "by_category": dict(sorted(Counter(r["category"] for r in rows).items())),
        "by_how": dict(sorted(Counter(r["how"] for r in rows).items())),
        "how": f"diversed-demo distill prompts (seed 0): the target (bf16, T = {prompts.TEMPERATURE}) wrote "
        "two passages per seed topic of assets/prompts/topics.txt, one request per category and topic, "
        "a question per passage and a translation of each passage's first sentence; requests cleaned "
        "and de-duplicated (ROUGE-L >= 0.7), the project's templates filled with topics, passages and "
        "sentences; never Spec-Bench",
    }


def passage_prompts_summary() -> dict:
    """Where the `passages` source's prompts come from, and how many of each category and language."""
    return passages.counts(passages.read_passage_prompts()) | {
        "how": "diversed-demo distill passages over Debian's documentation packages debian-handbook "
        "(GPL-2+ or CC-BY-SA 3.0), debian-reference-en/-de (GPL-2+) and python3.11-doc (PSF License), "
        "versions and seed in docs/cli.md: each section's English text as a summary, an extraction and a "
        "question over its paragraphs as retrieved passages; German, French, Spanish and Italian "
        "sentences to translate into English; never Spec-Bench",
    }


STATE, DATA_SUMMARY = "state.json", "data.json"


def portable_run(work_dir, data_dir) -> None:
    """What `export` needs of a run, in small files beside it (its state, the data's summary), so that the
    run travels without its checkpoint (the optimiser's moments: 60 MB) or its shards (tens of MB)."""
    work_dir = Path(work_dir)
    state = torch.load(work_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["state"]
    (work_dir / STATE).write_text(json.dumps(state))
    (work_dir / DATA_SUMMARY).write_text(json.dumps(data_summary(data.load_records(data_dir), data_dir)))


def run_state(work_dir: Path) -> dict:
    """A run's state (step, history, best): from its checkpoint, else from `portable_run`'s state.json."""
    if (work_dir / "checkpoint.pt").exists():
        return torch.load(work_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["state"]
    return json.loads((work_dir / STATE).read_text())


def export(work_dir, out=None, data_dir=data.SHARDS_DIR, earlier=()) -> Path:
    """The best draft of a training run, with a new card, into `out` (default assets/draft). `earlier`: the
    work dirs of the sittings it continued from (each started from the last one's best, `--init`), oldest
    first; their figures go in the card too.

    The card is written from scratch: nothing of an earlier draft's card (or its files) may describe
    this one. `distill measure` adds the Spec-Bench figures afterwards.
    """
    work_dir, out = Path(work_dir), Path(out or EMBEDDED_DRAFT_DIR)
    best = work_dir / "best"
    if not (best / "config.json").exists():
        raise FileNotFoundError(f"{best} holds no draft yet: run `diversed-demo distill train` first")
    summary = work_dir / DATA_SUMMARY
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        atomic_write(out / name, lambda tmp, name=name: shutil.copyfile(best / name, tmp))
    (out / "vocab.json").unlink(missing_ok=True)  # a standalone draft's vocabulary file; d2t holds this one's
    card = {
        "model": "EAGLE-3 feature draft for SmolLM2-135M-Instruct (speculators format)",
        "reads": "the target's hidden states at the inputs of layers "
        f"{json.loads((best / 'config.json').read_text())['eagle_aux_hidden_state_layer_ids']} "
        "and the next token's embedding (the target's own, not stored)",
        "data": json.loads(summary.read_text())
        if summary.exists()
        else data_summary(data.load_records(data_dir), data_dir),
        "training": sitting(work_dir)
        | {
            "note": "held-out figures per draft position 1..N: teacher-forced on the target's own "
            "responses (an accepted chain); 1 − TV against the target's full distribution at "
            "T = 1; the checkpoint with the highest expected accepted length is kept",
        },
    }
    if earlier:
        card["training"]["earlier_sittings"] = [sitting(Path(d)) for d in earlier]
    write_card(card, out)
    return out


def sitting(work_dir: Path) -> dict:
    """One training run, for the card: its command, machine, settings, split, steps and learning curve."""
    run, state = json.loads((work_dir / "run.json").read_text()), run_state(work_dir)
    return {
        "command": run["command"],
        "machine": run.get("machine", "not recorded"),
        "config": run["config"],
        "split": run["data"],
        "steps": state["step"],
        "total_steps": state.get("total_steps"),
        "wall_time_s": round(state["wall_time_s"], 1),
        "best": state["best"],
        "learning_curve": [
            {
                k: h[k]
                for k in ("step", "train_tokens", "agreement", "one_minus_tv", "score", "by_group")
                if k in h
            }
            for h in state["history"]
        ],
    }


@torch.inference_mode()
def measure(
    pair,
    per_category: int = 2,
    max_new_tokens: int = 64,
    n_draft: int = 4,
    card_dir=EMBEDDED_DRAFT_DIR,
    command: str = "",
) -> dict:
    """Spec-Bench first turns: exact SD acceptance and τ at T = 1 and greedy, overall and per category, and
    the draft's cost c; written into the card in `card_dir` (the pair's draft)."""
    from tqdm import tqdm

    questions = load_spec_bench(per_category=per_category)
    totals = {"t1": Counts(), "greedy": Counts()}
    by_category = defaultdict(lambda: {"t1": Counts(), "greedy": Counts()})
    for i, question in enumerate(tqdm(questions, desc="measuring", unit="prompt", dynamic_ncols=True)):
        for name, temperature in (("t1", 1.0), ("greedy", 0.0)):
            summary, _ = generate(
                pair,
                question.prompt,
                mode="exact",
                n_draft=n_draft,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=i,
            )
            totals[name] += summary.counts
            by_category[question.category][name] += summary.counts
    costs = measure_costs(pair, encode_prompt(pair.tokenizer, questions[0].prompt), n_draft)
    figures = {
        "prompts": len(questions),
        "per_category": per_category,
        "max_new_tokens": max_new_tokens,
        "n_draft": n_draft,
        "threads": torch.get_num_threads(),
        "dtype": str(pair.target.dtype),
        "cost_ratio": costs["c"],
        "target_ms_per_token": costs["target_ms"],
        "draft_ms_per_token": costs["draft_ms"],
        "command": command,
    }
    figures.update({name: acceptance(counts) for name, counts in totals.items()})
    figures["by_category"] = {
        category: {name: acceptance(counts) for name, counts in counts_by_mode.items()}
        for category, counts_by_mode in by_category.items()
    }
    card = read_card(card_dir)
    card["spec_bench"] = figures
    write_card(card, card_dir)
    return figures


def acceptance(counts: Counts) -> dict:
    return {
        "tau": counts.tau,
        "acceptance_per_verified_draft": counts.verified_acceptance,
        "accepted_per_drafted": counts.acceptance_rate,
    }
