"""Train the EAGLE-3 feature draft on the target's own responses, with EAGLE-3's training-time test.

Each batch runs the target once (no gradient) for its features at the aux layers and its distribution
at every position, then unrolls the draft `ttt_steps` times (ttt.ttt_forward): step j at position i
sees the target's features up to i and its own outputs after, as when drafting, and learns the target's
distribution of the token at i + 2 + j. The loss is the forward KL over the draft vocabulary (the
target's logits renormalised over it, as in speculators), on response tokens only, weighted by
`step_decay`**j. Held-out agreement and 1 − TV per draft position choose the checkpoint: EAGLE heads
overfit after about an epoch, and the loss does not show it.

Checkpoints (model, optimiser, schedule, step and history; the data order is a function of the seed) are
written atomically and resumed automatically.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..common.optim import adamw_with_schedule, load_checkpoint, save_checkpoint
from ..models.eagle import Eagle3Draft, new_config
from ..runtime.batch_generation import padding_id
from .batches import batches, coverage, frequent_tokens, is_heldout, make_batch, select_sources
from .config import DraftTrainConfig
from .passages import heldout_groups, read_passage_prompts
from .prompts import prompt_groups, read_prompts
from .ttt import label_rows, target_pass, ttt_loss, unroll


@torch.no_grad()
def evaluate(draft: Eagle3Draft, target, records: list[dict], pad_id: int, config: DraftTrainConfig) -> dict:
    """Per draft position (1..ttt_steps): top-1 agreement with the target and 1 − TV against its full
    distribution (q is 0 outside the draft vocabulary), on response tokens of held-out records.
    Tokens are teacher-forced, as in an accepted chain."""
    lm_head = target.get_output_embeddings().weight
    draft_ids = draft.draft_token_ids
    agree, overlap, count = [0.0] * config.ttt_steps, [0.0] * config.ttt_steps, [0] * config.ttt_steps
    for group in batches(records, 1024, config.max_length, seed=0):  # small: p spans the whole vocabulary
        batch = make_batch([records[i] for i in group], pad_id, config.max_length, lm_head.device)
        features, final = target_pass(target, batch, draft.aux_layer_ids, config.bf16)
        outputs = unroll(draft, features, batch, config.ttt_steps, config.bf16)
        p_all = torch.softmax(final[batch["predicts_response"]] @ lm_head.float().T, dim=-1)
        for step, (hidden, (mask, rows)) in enumerate(
            zip(outputs, label_rows(batch, config.ttt_steps, outputs[0].shape[1]))
        ):
            p = p_all[rows]
            q_small = torch.softmax(draft.draft_logits(hidden[mask].float()).float(), dim=-1)
            agree[step] += float((draft_ids[q_small.argmax(-1)] == p.argmax(-1)).sum())
            overlap[step] += float(torch.minimum(p[:, draft_ids], q_small).sum())
            count[step] += len(rows)
    return {
        "agreement": [a / max(c, 1) for a, c in zip(agree, count)],
        "one_minus_tv": [o / max(c, 1) for o, c in zip(overlap, count)],
        "tokens": count[0],
        "counts": count,
    }


def merged(parts: list[dict]) -> dict:
    """evaluate()'s figures over the union of the records that gave `parts` (at least one)."""
    counts = [sum(c) for c in zip(*(p["counts"] for p in parts))]

    def mean(key):
        return [
            sum(p[key][j] * p["counts"][j] for p in parts) / max(counts[j], 1) for j in range(len(counts))
        ]

    return {
        "agreement": mean("agreement"),
        "one_minus_tv": mean("one_minus_tv"),
        "tokens": counts[0],
        "counts": counts,
    }


def evaluate_by_group(draft, target, records: list[dict], pad_id: int, config: DraftTrainConfig) -> dict:
    """evaluate() over all held-out records, with the figures of the broad prompts, the passage prompts and
    the earlier sources apart (`by_group`) where more than one is held out."""
    groups = {
        "broad": [r for r in records if r["source"] == "broad"],
        "passages": [r for r in records if r["source"] == "passages"],
        "earlier": [r for r in records if r["source"] not in ("broad", "passages")],
    }
    parts = {name: evaluate(draft, target, group, pad_id, config) for name, group in groups.items() if group}
    if not parts:
        return evaluate(draft, target, records, pad_id, config)
    metrics = merged(list(parts.values()))
    if len(parts) > 1:
        metrics["by_group"] = {
            name: {k: part[k] for k in ("agreement", "one_minus_tv", "tokens")} | {"score": score(part)}
            for name, part in parts.items()
        }
    return metrics


def score(metrics: dict) -> float:
    """Expected accepted drafts per block of ttt_steps under exact SD if position j's acceptance were its
    held-out 1 − TV: the quantity speculative decoding pays for, and the checkpoint selector."""
    total, running = 0.0, 1.0
    for a in metrics["one_minus_tv"]:
        running *= a
        total += running
    return total


def init_draft(
    target, vocab_ids: list[int], config: DraftTrainConfig, aux_layer_ids=None, verifier: str = ""
) -> Eagle3Draft:
    torch.manual_seed(config.seed)
    draft = Eagle3Draft(new_config(target.config, aux_layer_ids, len(vocab_ids), verifier))
    draft.embed_tokens.weight = target.get_input_embeddings().weight
    draft.set_vocab(torch.tensor(vocab_ids), target.get_output_embeddings().weight.detach().float())
    with torch.no_grad():  # the draft's output goes through the target's LM head: start from its final norm
        draft.norm.weight.copy_(target.model.norm.weight.float())
    return draft.to(target.device)


def continue_from(directory, target) -> Eagle3Draft:
    """A saved draft, in fp32 and trainable, except the embedding and LM head (the target's, as in
    init_draft)."""
    from ..models.loading import load_eagle3

    draft = load_eagle3(directory, target)
    # The embedding is the target's own tensor: converting it with the draft would change the target's dtype.
    embedding, draft.embed_tokens = draft.embed_tokens, None
    draft = draft.float().train()
    draft.embed_tokens = embedding
    for name, parameter in draft.named_parameters():
        parameter.requires_grad_(not name.startswith(("embed_tokens", "lm_head")))
    return draft


@dataclass
class DraftRun:
    """What a draft training run carries from step to step; its checkpoint holds the state and weights."""

    draft: Eagle3Draft
    params: list[torch.nn.Parameter]  # what trains: all but the embedding and LM head
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    state: dict  # step, history, best, wall_time_s, total_steps and (after a step) train_tokens
    started: float  # time.time() at which the run would have begun had it never stopped
    work_dir: Path
    config: DraftTrainConfig


def train(
    draft: Eagle3Draft,
    target,
    train_records: list[dict],
    heldout: list[dict],
    pad_id: int,
    config: DraftTrainConfig,
    work_dir: Path,
    log=print,
    minutes: float | None = None,
) -> dict:
    """Train with resumable atomic checkpoints in work_dir; the best held-out draft is saved to
    work_dir/best. `minutes` stops early (after a held-out evaluation and a checkpoint); a rerun resumes."""
    schedule = batch_schedule(train_records, config)
    run = start_or_resume(draft, config, len(schedule), Path(work_dir), target.device, log)
    draft.train()
    if not run.state["history"]:  # the curve starts where the draft does: a continued draft's baseline
        evaluate_and_keep_best(run, target, heldout, pad_id, log)
    deadline = time.time() + minutes * 60 if minutes else None
    while run.state["step"] < len(schedule):
        if deadline and time.time() > deadline:
            if run.state["history"][-1]["step"] != run.state["step"]:  # a sitting's last weights count too
                evaluate_and_keep_best(run, target, heldout, pad_id, log)
            write_checkpoint(run)
            log(f"stopped at step {run.state['step']} of {len(schedule)} (time limit); rerun to resume")
            break
        group = schedule[run.state["step"]]
        batch = make_batch([train_records[i] for i in group], pad_id, config.max_length, target.device)
        loss, per_step = training_step(run, target, batch)
        step = run.state["step"]
        if step % 10 == 0:
            log(
                f"step {step}/{len(schedule)} loss {loss.item():.3f} per step "
                f"{[round(x, 2) for x in per_step]} lr {run.scheduler.get_last_lr()[0]:.2e} "
                f"{run.state['train_tokens'] / (time.time() - run.started):.0f} tok/s"
            )
        if step % config.eval_every == 0 or step == len(schedule):
            evaluate_and_keep_best(run, target, heldout, pad_id, log)
            write_checkpoint(run)
    return run.state


def batch_schedule(train_records: list[dict], config: DraftTrainConfig) -> list[list[int]]:
    """Every training batch in order (record indices): config.epochs passes, each shuffled by its own seed,
    the last one cut short where epochs is fractional."""
    epoch_batches = [
        batches(train_records, config.batch_tokens, config.max_length, seed=config.seed + e)
        for e in range(math.ceil(config.epochs))
    ]
    return [g for epoch in epoch_batches for g in epoch][: round(config.epochs * len(epoch_batches[0]))]


def start_or_resume(
    draft: Eagle3Draft, config: DraftTrainConfig, total_steps: int, work_dir: Path, device, log
) -> DraftRun:
    """The optimiser and schedule for `draft`, and the run's state: restored (with the draft's weights)
    from work_dir's checkpoint where there is one, else fresh."""
    # the embedding and LM head are the target's (the embedding is its very tensor): never trained
    params = [p for name, p in draft.named_parameters() if not name.startswith(("embed_tokens", "lm_head"))]
    optimizer, scheduler = adamw_with_schedule(
        params, config.lr, config.warmup_steps, total_steps, weight_decay=0.0, betas=(0.9, 0.95)
    )
    state = {"step": 0, "history": [], "best": None, "wall_time_s": 0.0, "total_steps": total_steps}
    saved = load_checkpoint(work_dir / "checkpoint.pt", optimizer, scheduler, map_location=device)
    if saved is not None:
        draft.load_state_dict(saved["model"], strict=False)
        state = saved["state"]
        log(f"resumed at step {state['step']} of {total_steps}")
    started = time.time() - state["wall_time_s"]
    return DraftRun(draft, params, optimizer, scheduler, state, started, work_dir, config)


def training_step(run: DraftRun, target, batch: dict) -> tuple[torch.Tensor, list[float]]:
    """One optimiser step on a batch's TTT loss; returns the loss and its per-step parts."""
    loss, per_step = ttt_loss(run.draft, target, batch, run.config)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.params, 1.0)
    run.optimizer.step()
    run.scheduler.step()
    run.state["step"] += 1
    run.state["train_tokens"] = run.state.get("train_tokens", 0) + int(batch["predicts_response"].sum())
    return loss, per_step


def evaluate_and_keep_best(run: DraftRun, target, heldout: list[dict], pad_id: int, log) -> None:
    """Held-out figures of the draft into the run's history; a new best score saves it to work_dir/best."""
    state = run.state
    run.draft.eval()
    metrics = evaluate_by_group(run.draft, target, heldout, pad_id, run.config)
    run.draft.train()
    metrics.update(
        step=state["step"],
        train_tokens=state.get("train_tokens", 0),
        wall_time_s=round(time.time() - run.started, 1),
        score=score(metrics),
    )
    state["history"].append(metrics)
    log(
        f"step {state['step']}: agreement {[round(a, 3) for a in metrics['agreement']]} "
        f"1-TV {[round(a, 3) for a in metrics['one_minus_tv']]} score {metrics['score']:.3f}"
        + "".join(f" {name} {part['score']:.3f}" for name, part in metrics.get("by_group", {}).items())
    )
    if state["best"] is None or metrics["score"] > state["best"]["score"]:
        state["best"] = metrics
        run.draft.save(run.work_dir / "best")


def write_checkpoint(run: DraftRun) -> None:
    """The run's state and the draft's weights, but not the embedding: that is the target's own tensor."""
    run.state["wall_time_s"] = time.time() - run.started
    save_checkpoint(
        run.work_dir / "checkpoint.pt",
        run.optimizer,
        run.scheduler,
        model={k: v for k, v in run.draft.state_dict().items() if not k.startswith("embed_tokens")},
        state=run.state,
        config=asdict(run.config),
    )


def train_draft(
    pair,
    records: list[dict],
    config: DraftTrainConfig,
    work_dir,
    minutes: float | None = None,
    command: str = "",
    init_from=None,
) -> dict:
    """The whole stage: split, draft vocabulary, initialisation (or resume), training. Logs to
    work_dir/train.log.

    `init_from` (a saved draft, e.g. the committed assets/draft) starts from its weights and vocabulary
    instead of a fresh draft: training goes on across machines, where work_dir's checkpoints are lost.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    check_same_config(work_dir, config, records)
    groups = prompt_groups_by_source()
    heldout = [r for r in records if is_heldout(r, config.heldout_fraction, groups)]
    train_records = [r for r in records if not is_heldout(r, config.heldout_fraction, groups)]
    train_records = select_sources(train_records, config.sources, config.replay, config.seed)
    if not train_records:
        raise ValueError(f"no training records from the sources {config.sources}")
    tokenizer = pair.tokenizer
    specials = sorted(
        {i for i in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) if i is not None}
    )
    if init_from is not None:
        draft = continue_from(init_from, pair.target)
        vocab = draft.draft_token_ids.tolist()
    else:
        vocab = frequent_tokens(train_records, config.draft_vocab_size, always=specials)
        draft = init_draft(pair.target, vocab, config, verifier="HuggingFaceTB/SmolLM2-135M-Instruct")
    pad_id = padding_id(tokenizer)
    run = {
        "command": command,
        "config": asdict(config),
        "machine": machine(pair.target.device),
        "data": split_summary(records, train_records, heldout, vocab),
        "records_sha256": records_digest(records),
    }
    (work_dir / "run.json").write_text(json.dumps(run, indent=2))
    with open(work_dir / "train.log", "a", encoding="utf-8") as log_file:

        def log(message):
            line = f"{time.strftime('%H:%M:%S')} {message}"
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        log(f"data: {run['data']}")
        return train(draft, pair.target, train_records, heldout, pad_id, config, work_dir, log, minutes)


def prompt_groups_by_source() -> dict[str, list]:
    """Each broad and passage prompt's group, for the held-out split: broad prompts sharing a passage's words,
    passage prompts made from one section in any language or sharing a run of its words."""
    return {
        "broad": prompt_groups(read_prompts()),
        "passages": heldout_groups(read_passage_prompts()),
    }


def split_summary(records, train_records, heldout, vocab) -> dict:
    """What a run trains and is held out on, and how much of it the draft vocabulary covers."""
    return {
        "records": len(records),
        "train_records": len(train_records),
        "heldout_records": len(heldout),
        "train_response_tokens": sum(len(r["response_ids"]) for r in train_records),
        "heldout_response_tokens": sum(len(r["response_ids"]) for r in heldout),
        "vocab_coverage": coverage(train_records, vocab),
        "vocab_coverage_by_source": {  # of the training records
            source: coverage([r for r in train_records if r["source"] == source], vocab)
            for source in sorted({r["source"] for r in train_records})
        },
    }


def check_same_config(work_dir: Path, config: DraftTrainConfig, records: list[dict]) -> None:
    """A checkpoint resumes only under the settings and data it was made with: its batches are record
    indices, and its data order and schedule are functions of both."""
    path = work_dir / "run.json"
    if not ((work_dir / "checkpoint.pt").exists() and path.exists()):
        return
    saved = json.loads(path.read_text())
    defaults = asdict(DraftTrainConfig())  # a setting added since the run was saved had its default
    changed = {
        k: (saved["config"].get(k, defaults[k]), v)
        for k, v in asdict(config).items()
        if saved["config"].get(k, defaults[k]) != v
    }
    if changed:
        raise ValueError(
            f"{work_dir} holds a run with other settings {changed} (saved, now): "
            "resume with the same options or pick another --work-dir"
        )
    if saved.get("records_sha256", records_digest(records)) != records_digest(records):
        raise ValueError(
            f"{work_dir} holds a run on other data (shards were added or changed since): "
            "resume with the same shards or pick another --work-dir"
        )


def records_digest(records: list[dict]) -> str:
    """The identity of the data a run trains on: its records' keys, in order."""
    return hashlib.sha256("\n".join(r["key"] for r in records).encode()).hexdigest()


def machine(device: torch.device) -> str:
    """Where a run trained, for the card: wall times mean little without it."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (cuda)"
    return f"cpu, {torch.get_num_threads()} threads"
