"""The warm start: decode training prompts once at a static w, then fit the head offline to the dense
objective's per-token optimum on the recorded positions, before any RL step."""

from __future__ import annotations

import torch

from ..core.head import ConstantHead
from ..core.prompt import encode_prompt
from .config import HeadTrainConfig
from .diagnostics import frontier_gain, what_separates
from .objective import draft_share, head_weights, lam_for_acceptance
from .rollouts import Rollouts, flat_positions, sample_rollouts

WARM_START_BATCH = 8  # prompts decoded together: a few rows cost the target little more than one


def fit_to_positions(
    head, train: Rollouts, lam: float, steps: int, lr: float, weight_decay: float = 0.01
) -> list[float]:
    """Full-batch AdamW towards the dense objective's per-token optimum on recorded positions, before any
    sequence reward is sampled: the head learns which positions to hand to the draft.

    The objective is linear in w_t, so its optimum is w_t ∈ {0, 1} and plain gradient ascent saturates the
    sigmoid for every position at once, the majority drowning the rest. Its convex surrogate is used
    instead: cross-entropy of the target's share (w_t, or at greedy positions whether w_t reaches the
    limit) against the optimum's choice, each position weighted by what the choice is worth there,
    |CE − H − λ·TV| (cost-sensitive classification of the same objective)."""
    kept = train.mask > 0
    gain = (train.cross_entropy - train.target_entropy - lam * train.tv)[kept]
    label, weight = (gain > 0).float(), gain.abs() / gain.abs().mean().clamp_min(1e-9)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        target_share = 1 - draft_share(head_weights(head, train, lam), train)[kept]
        loss = torch.nn.functional.binary_cross_entropy(target_share.clamp(1e-6, 1 - 1e-6), label, weight)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def warm_start(
    pair, head, examples, config: HeadTrainConfig, generator: torch.Generator, progress: bool = True
) -> dict:
    """Record positions of static-w decodes of the first `warm_start_prompts` training prompts, fit the head
    to the per-token optimum on three quarters of the prompts, and report on the held-back quarter how much
    of the gain over a static w (same acceptance) the head captures next to the optimum. Returns the
    figures with the λ used."""
    from tqdm.auto import tqdm

    prompts = examples[: config.warm_start_prompts]
    rollouts = []  # one per prompt, decoded WARM_START_BATCH prompts at a time
    for first in tqdm(
        range(0, len(prompts), WARM_START_BATCH),
        desc="warm start: decoding",
        unit="batch",
        disable=not progress,
    ):
        chunk = [encode_prompt(pair.tokenizer, e.prompt) for e in prompts[first : first + WARM_START_BATCH]]
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
    fit, held_back = flat_positions(rollouts[:cut]), flat_positions(rollouts[cut:])
    lam = (
        lam_for_acceptance(fit, config.target_acceptance)
        if config.target_acceptance is not None
        else config.lam
    )
    # A CostHead starts as the rule, the optimum this fit aims at: it is measured, not fitted.
    steps = 0 if config.kind == "cost" else config.warm_start_steps
    losses = fit_to_positions(head, fit, lam, steps, config.warm_start_lr)
    with torch.no_grad():
        w = {
            split: head_weights(head, r, lam, hard=True)[0]
            for split, r in (("fit", fit), ("held_back", held_back))
        }
        figures = {"fit": frontier_gain(w["fit"], fit), "held_back": frontier_gain(w["held_back"], held_back)}
        figures["held_back"]["separates"] = what_separates(w["held_back"], held_back, pair.tokenizer)
    return {"lam": lam, "prompts": len(prompts), "final_loss": losses[-1] if losses else None, **figures}
