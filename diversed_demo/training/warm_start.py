"""The warm start: positions recorded once (decodes of training prompts at a static w, or teacher-forced
passes at scale: positions.py), then the head fitted offline to the dense objective's per-token optimum
on them, before any RL step."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..core.head import ConstantHead
from ..core.prompt import encode_prompt
from .config import HeadTrainConfig
from .diagnostics import frontier_gain, what_separates
from .objective import draft_share, head_weights, lam_for_acceptance
from .positions import POSITIONS_MAX_NEW_TOKENS, load_positions, record_positions
from .rollouts import Rollouts, flat_positions, sample_rollouts

WARM_START_BATCH = 8  # prompts decoded together: a few rows cost the target little more than one
# positions of one fitting step: at 100k positions a full batch took 1.6 s a step on 2 CPU cores; heads
# fitted on 16k a step keep 93–95% of the optimum's held-out gain (docs/training.md)
FIT_BATCH = 16_384
FIELDS = [key for key in Rollouts.__dataclass_fields__ if key != "outputs"]


def fit_to_positions(
    head,
    train: Rollouts,
    lam: float,
    steps: int,
    lr: float,
    weight_decay: float = 0.01,
    progress: bool = False,
    hidden_dropout: float = 0.0,
) -> list[float]:
    """AdamW towards the dense objective's per-token optimum on recorded positions (one row [1, P]), before
    any sequence reward is sampled: the head learns which positions to hand to the draft. Each step takes
    FIT_BATCH positions at random (all of them when there are fewer).

    The objective is linear in w_t, so its optimum is w_t ∈ {0, 1} and plain gradient ascent saturates the
    sigmoid for every position at once, the majority drowning the rest. Its convex surrogate is used
    instead: cross-entropy of the target's share (w_t, or at greedy positions whether w_t reaches the
    limit) against the optimum's choice, each position weighted by what the choice is worth there,
    |CE − H − λ·TV| (cost-sensitive classification of the same objective).

    `hidden_dropout` zeroes that share of the hidden states' entries at each step (the layer norm rescales
    the rest), so that the head learns what the p/q terms say instead of remembering fitted positions by
    their hidden states (measured in docs/training.md)."""
    gain = (train.cross_entropy - train.target_entropy - lam * train.tv)[0]
    label, weight = (gain > 0).float(), gain.abs() / gain.abs().mean().clamp_min(1e-9)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    losses, count = [], train.tv.shape[1]
    for _ in tqdm(range(steps), desc="warm start: fitting", unit="step", disable=not progress or not steps):
        rows = torch.randperm(count, device=gain.device)[:FIT_BATCH] if count > FIT_BATCH else slice(None)
        batch = Rollouts(**{key: getattr(train, key)[:, rows] for key in FIELDS})
        if hidden_dropout:
            for key in ("target_hidden", "draft_hidden"):
                hidden = getattr(batch, key)
                setattr(batch, key, hidden * (torch.rand_like(hidden) >= hidden_dropout))
        optimizer.zero_grad()
        target_share = 1 - draft_share(head_weights(head, batch, lam), batch)[0]
        loss = torch.nn.functional.binary_cross_entropy(
            target_share.clamp(1e-6, 1 - 1e-6), label[rows], weight[rows]
        )
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def warm_start(
    pair, head, examples, config: HeadTrainConfig, generator: torch.Generator, progress: bool = True
) -> dict:
    """Fit the head to the per-token optimum on recorded positions (decodes of the first
    `warm_start_prompts` training prompts, three quarters fitted; or `warm_start_positions` recorded at
    scale, held out by prompt) and report on the held-back ones how much of the gain over a static w
    (same acceptance) the head captures next to the optimum. Returns the figures with the λ used."""
    if config.warm_start_positions:
        fit, held_back, source = scaled_positions(pair, config, progress)
    else:
        fit, held_back = decoded_positions(
            pair, examples[: config.warm_start_prompts], config, generator, progress
        )
        source = {"prompts": min(len(examples), config.warm_start_prompts)}
    lam = (
        lam_for_acceptance(fit, config.target_acceptance)
        if config.target_acceptance is not None
        else config.lam
    )
    # A CostHead starts as the rule, the optimum this fit aims at: it is measured, not fitted.
    steps = 0 if config.kind == "cost" else config.warm_start_steps
    losses = fit_to_positions(
        head, fit, lam, steps, config.warm_start_lr, progress=progress,
        hidden_dropout=config.warm_start_hidden_dropout,
    )  # fmt: skip
    with torch.no_grad():
        w = {
            split: head_weights(head, r, lam, hard=True)[0]
            for split, r in (("fit", fit), ("held_back", held_back))
        }
        figures = {"fit": frontier_gain(w["fit"], fit), "held_back": frontier_gain(w["held_back"], held_back)}
        figures["held_back"]["separates"] = what_separates(w["held_back"], held_back, pair.tokenizer)
    return {"lam": lam, **source, "final_loss": losses[-1] if losses else None, **figures}


def decoded_positions(pair, examples, config: HeadTrainConfig, generator, progress: bool):
    """The positions of static-w (w_init) decodes of `examples`, as (the first three quarters of the
    prompts', the rest's)."""
    rollouts = []  # one per prompt, decoded WARM_START_BATCH prompts at a time
    for first in tqdm(
        range(0, len(examples), WARM_START_BATCH),
        desc="warm start: decoding",
        unit="batch",
        disable=not progress,
    ):
        chunk = [encode_prompt(pair.tokenizer, e.prompt) for e in examples[first : first + WARM_START_BATCH]]
        batch = sample_rollouts(
            pair,
            ConstantHead(config.w_init),
            chunk,
            config.max_new_tokens,
            config.temperature,
            generator,
            config.n_draft,
        )
        rollouts += [batch.select(slice(i, i + 1)) for i in range(len(chunk))]
    cut = max(1, round(0.75 * len(rollouts)))
    return flat_positions(rollouts[:cut]), flat_positions(rollouts[cut:])


def held_out_figures(head, held_back: Rollouts, lams) -> list[dict]:
    """The head's frontier_gain on held-out positions at each λ of `lams` (an ensemble head's w does not
    depend on λ: one λ is enough), each with its λ: what the card reports of the final head."""
    with torch.no_grad():
        return [
            {"lam": lam, **frontier_gain(head_weights(head, held_back, lam, hard=True)[0], held_back)}
            for lam in lams
        ]


def positions_folder(config: HeadTrainConfig) -> Path:
    """Where the positions of a config's task, temperature and N are recorded."""
    from ..models.heads import user_heads_dir

    root = Path(config.positions_dir) if config.positions_dir else user_heads_dir() / "positions"
    return root / f"{config.task}-T{config.temperature:g}-N{config.n_draft}"


def scaled_positions(pair, config: HeadTrainConfig, progress: bool):
    """`warm_start_positions` fit positions and the held-out ones, recorded under positions_dir (or read
    back from it), with what the card says of them."""
    folder = positions_folder(config)
    record_positions(
        pair, config.task, folder, config.warm_start_positions, config.temperature, config.n_draft,
        POSITIONS_MAX_NEW_TOKENS, seed=config.seed, progress=progress,
    )  # fmt: skip
    fit, held_back = load_positions(folder, pair.target.device, limit=config.warm_start_positions)
    source = {"positions": {"folder": folder.name, "fit": fit.tv.shape[1], "held_out": held_back.tv.shape[1]}}
    return fit, held_back, source
