"""Rollouts: on-policy decodes by the speculative decoder with the head choosing w_t, and at every
position w_t decided, what the training loss needs (hidden states, p and q of the token, TV, H, CE)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.config import DecodeConfig
from ..core.cost_rule import greedy_position_costs, position_costs
from ..core.decode import decode_rows
from ..models.pair import text_config


@dataclass
class Rollouts:
    """Per rollout, the positions where w_t decided the emitted token, left-aligned and padded."""

    tokens: torch.Tensor  # [B, T] the emitted token at each such position
    mask: torch.Tensor  # [B, T] 1 where a position is recorded, 0 in the padding
    target_hidden: torch.Tensor  # [B, T, Ht] at the position that predicts each token
    draft_hidden: torch.Tensor  # [B, T, Hd]
    target_prob: torch.Tensor  # [B, T] p_t(y_t)
    draft_prob: torch.Tensor  # [B, T] q_t(y_t)
    tv: torch.Tensor  # [B, T] TV(p_t, q_t)
    target_entropy: torch.Tensor  # [B, T] H(p_t) = −Σ p log p
    cross_entropy: torch.Tensor  # [B, T] CE(q_t, p_t) = −Σ q log p
    # [B, T] greedy decoding keeps the draft's token iff w_t < this; NaN when sampled
    greedy_limit: torch.Tensor
    outputs: list = field(default_factory=list)  # each rollout's whole output ids (bonus tokens too)

    def select(self, rows: slice) -> Rollouts:
        """The rollouts of `rows` (a prompt's group, one prompt of a batch)."""
        return Rollouts(**{key: getattr(self, key)[rows] for key in self.__dataclass_fields__})


# What a rollout records at each position w_t decided (the mask and outputs are the batch's).
RECORDED = [key for key in Rollouts.__dataclass_fields__ if key not in ("mask", "outputs")]


@torch.no_grad()
def sample_rollouts(
    pair,
    head,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    n_draft: int = 4,
    lam: float = 1.0,
) -> Rollouts:
    """One decode of each prompt (ids; repeat a prompt for a group of rollouts) by the speculative decoder
    itself, with the head choosing w_t; all as one batch, so each target pass serves every rollout.

    With a feature draft, q at a position depends on how far it is from the last verification, so only
    the real decoding process has the law the head will serve under. Each verified position (where w_t
    decided the token) is recorded with what the loss needs; bonus tokens, which w never touches, are
    not, but they are part of each output (`outputs`) that the reward scores.
    """
    seeds = [int(torch.randint(2**31 - 1, (), generator=generator)) for _ in prompts]
    blocks = [[] for _ in prompts]  # per rollout, what each of its verification steps recorded
    outputs = [[] for _ in prompts]
    decoding = DecodeConfig(  # λ: a CostHead's threshold
        "dynamic", head=head, n_draft=n_draft, max_new_tokens=max_new_tokens, temperature=temperature, lam=lam
    )
    for r, step in decode_rows(pair, prompts, [decoding.replace(seed=seed) for seed in seeds]):
        recorded = decided_positions(step, temperature)
        if recorded is not None:
            blocks[r].append(recorded)
        outputs[r] += step.new_ids
    return Rollouts(**padded_batch(pair, blocks), outputs=outputs)


def decided_positions(step, temperature: float) -> dict[str, torch.Tensor] | None:
    """What the loss needs (RECORDED) at the positions of one verification step whose token w decided: the
    accepted drafts and the resampled one, up to an EOS. None where there are none."""
    v = step.verdict
    k = min(v.n_accepted + (v.n_accepted < len(v.draft_tokens)), len(step.new_ids))
    if not k:
        return None
    tokens = torch.tensor(step.new_ids[:k], device=v.target_probs.device)
    return position_terms(
        v.target_probs[:k], v.draft_probs[:k], tokens, v.draft_tokens[:k], temperature,
        v.target_hidden[:k], v.draft_hidden[:k],
    )  # fmt: skip


def position_terms(
    p, q, tokens, draft_tokens, temperature: float, target_hidden, draft_hidden
) -> dict[str, torch.Tensor]:
    """RECORDED at k positions from p, q [k, V], the emitted and the drafted tokens [k] and the hidden
    states [k, H]: what decoding (decided_positions) and the teacher-forced record (positions.py) keep."""
    rows_k = torch.arange(len(tokens), device=tokens.device)
    limit = torch.full((len(tokens),), float("nan"), device=p.device)
    if temperature == 0:
        # Greedy verification compares argmaxes: the loss sees the one-hot limits of p and q, so TV is 1
        # where the draft's token differs from the target's, H is −log p of the target's own token and CE
        # that of the draft's; whether the draft's token is kept is a threshold on w_t set by the true p
        # and q (see greedy_limit). The terms are the decoder's own (a head reads them), from the true p.
        limit = greedy_limit(p, q, draft_tokens)
        cost, tv, entropy = greedy_position_costs(p, q)
        p, q = one_hot_of_argmax(p), one_hot_of_argmax(q)
    else:
        cost, tv, entropy = position_costs(p, q)
    return {
        "tokens": tokens,
        "target_hidden": target_hidden.float(),
        "draft_hidden": draft_hidden.float(),
        "target_prob": p[rows_k, tokens],
        "draft_prob": q[rows_k, tokens],
        "tv": tv,
        "target_entropy": entropy,
        "cross_entropy": cost + entropy,
        "greedy_limit": limit,
    }


def padded_batch(pair, blocks: list[list[dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """Each rollout's recorded positions left-aligned in one tensor per field, [B, T] or [B, T, H], padded
    with 0 (NaN in greedy_limit), and the mask of the recorded ones."""
    counts = [sum(len(block["tokens"]) for block in row) for row in blocks]
    n, length, device = len(blocks), max(1, max(counts)), pair.target.device
    widths = {
        "target_hidden": text_config(pair.target).hidden_size,
        "draft_hidden": text_config(pair.draft).hidden_size,
    }
    batch = {"mask": torch.zeros(n, length, device=device)}
    for key in RECORDED:
        batch[key] = torch.full(
            (n, length, widths[key]) if key in widths else (n, length),
            float("nan") if key == "greedy_limit" else 0,
            device=device,
            dtype=torch.long if key == "tokens" else torch.float32,
        )
    for i, (row, count) in enumerate(zip(blocks, counts)):
        batch["mask"][i, :count] = 1
        if count:
            for key in RECORDED:
                batch[key][i, :count] = torch.cat([block[key] for block in row])
    return batch


def flat_positions(rollouts: list[Rollouts]) -> Rollouts:
    """Every recorded position of several Rollouts as one row [1, P] (the per-token terms need no
    sequence)."""
    keep = [r.mask > 0 for r in rollouts]
    fields = {
        key: torch.cat([getattr(r, key)[k] for r, k in zip(rollouts, keep)])[None]
        for key in Rollouts.__dataclass_fields__
        if key != "outputs"
    }
    return Rollouts(**fields)


def one_hot_of_argmax(probs: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)


def greedy_limit(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor
) -> torch.Tensor:
    """[k] the largest w at which argmax(w·p + (1 − w)·q) is still the draft's token x (its argmax of q):
    greedy verification keeps x iff w_t < this. A token y overtakes x once w·(p(y) − p(x)) exceeds
    (1 − w)·(q(x) − q(y)); the first to do so sets the limit (1 where no token has more target mass than
    x)."""
    rows = torch.arange(len(draft_tokens), device=draft_tokens.device)
    target_gap = target_probs - target_probs[rows, draft_tokens][:, None]
    draft_gap = draft_probs[rows, draft_tokens][:, None] - draft_probs
    crossing = torch.where(
        target_gap > 0, draft_gap / (draft_gap + target_gap).clamp_min(1e-30), torch.ones_like(target_gap)
    )
    return crossing.min(-1).values.clamp(0, 1)
