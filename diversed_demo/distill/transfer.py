"""Whether the draft's held-out figures carry over to an evaluation set: the target's own T = 1 responses to
Spec-Bench first turns, scored exactly as training scores its held-out records (`train.evaluate`:
teacher-forced top-1 agreement and 1 − TV per draft depth, and the expected accepted length per block).

Against exact SD's τ on the same prompts this has no sampled drafts and no stopping rule in it, so two
drafts compare on identical text with far less noise, and a gap to the held-out figures is the prompts'
(the draft never saw their kind), not decoding's. Spec-Bench is read for evaluation only.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from ..core.prompt import encode_prompt
from ..eval.tasks import load_spec_bench
from ..models.loading import is_eagle3_dir, load_eagle3
from ..runtime.batch_generation import generate_batch, padding_id
from .config import DraftTrainConfig
from .train import evaluate, score


def spec_bench_responses(generating_pair, per_category: int, max_new_tokens: int, seed: int, batch_size: int):
    """The target's T = 1 responses to Spec-Bench first turns, as records (`source` is the category)."""
    tokenizer = generating_pair.tokenizer
    pad_id = padding_id(tokenizer)
    questions = load_spec_bench(per_category=per_category)
    generator = torch.Generator(device=generating_pair.target.device).manual_seed(seed)
    records = []
    for first in range(0, len(questions), batch_size):
        chunk = questions[first : first + batch_size]
        prompts = [encode_prompt(tokenizer, q.prompt) for q in chunk]
        out = generate_batch(
            generating_pair.target, prompts, [False] * len(chunk), max_new_tokens, tokenizer.eos_token_id,
            pad_id, generator,
        )  # fmt: skip
        records += [
            {"key": q.id, "source": q.category, "prompt_ids": ids, "response_ids": response, "ended": ended}
            for q, ids, (response, ended) in zip(chunk, prompts, out)
        ]
    return records, pad_id


def transfer_figures(draft, target, records: list[dict], pad_id: int, bf16: bool) -> dict:
    """`train.evaluate`'s figures of `draft` over `target` on `records`, overall and per category."""
    config = DraftTrainConfig(bf16=bf16)

    def figures(subset):
        metrics = evaluate(draft, target, subset, pad_id, config)
        rounded = {k: [round(x, 4) for x in metrics[k]] for k in ("agreement", "one_minus_tv")}
        return rounded | {
            "expected_accepted_per_block": round(score(metrics), 4),
            "tokens": metrics["tokens"],
        }

    categories = dict.fromkeys(r["source"] for r in records)
    return {
        "overall": figures(records),
        "by_category": {c: figures([r for r in records if r["source"] == c]) for c in categories},
    }


def paired_difference(baseline: dict, other: dict) -> dict:
    """`other`'s expected accepted length per block minus `baseline`'s, category by category (each draft
    scored on the same text): their mean and its standard error over the categories."""
    categories = [c for c in baseline["by_category"] if c in other["by_category"]]
    differences = [
        other["by_category"][c]["expected_accepted_per_block"]
        - baseline["by_category"][c]["expected_accepted_per_block"]
        for c in categories
    ]
    error = statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else float("nan")
    return {
        "mean": round(statistics.fmean(differences), 4),
        "standard_error": round(error, 4),
        "categories": len(differences),
    }


def check_drafts(drafts: list[str]) -> None:
    """Refuse, before any model loads, a folder that holds no saved EAGLE-3 draft."""
    missing = [d for d in drafts if not is_eagle3_dir(Path(d))]
    if missing:
        raise ValueError(f"not saved EAGLE-3 drafts (no speculators config.json): {', '.join(missing)}")


def transfer_report(
    records: list[dict], pad_id: int, drafts: list[str], scoring, bf16: bool, command: str
) -> dict:
    """`distill transfer`'s report: each saved draft's figures over the `scoring` target on `records`
    (spec_bench_responses), and each later draft's expected accepted length per block against the first's,
    paired by category."""
    report = {
        "command": command,
        "prompts": len(records),
        "response_tokens": sum(len(r["response_ids"]) for r in records),
    }
    report["drafts"] = {
        draft: transfer_figures(load_eagle3(Path(draft), scoring), scoring, records, pad_id, bf16)
        for draft in drafts
    }
    baseline = report["drafts"][drafts[0]]
    report["against_first_per_category"] = {
        draft: paired_difference(baseline, report["drafts"][draft]) for draft in drafts[1:]
    }
    return report
