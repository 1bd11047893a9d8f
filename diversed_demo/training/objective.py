"""The head's training objective: the loss (REINFORCE with group advantages, the acceptance term, the
dense fidelity term, the target acceptance's penalty), the multiplier's update, and the λ of an acceptance."""

from __future__ import annotations

import torch

from ..core.head import CostHead, pq_terms
from .config import GREEDY_SOFTNESS
from .rollouts import Rollouts


def draft_share(w: torch.Tensor, positions: Rollouts, hard: bool = False) -> torch.Tensor:
    """How much of each position the draft decides, as a function of w_t: its share 1 − w_t of nu when
    sampling; in greedy decoding 1 where the draft's token is kept (w_t below the position's greedy limit)
    and 0 where not, smoothed to σ((limit − w_t)/GREEDY_SOFTNESS) so that training has a gradient. With it,
    acceptance is 1 − TV·(1 − share) and the expected log p is −H − share·(CE − H) in both cases."""
    limit = positions.greedy_limit
    sampled = torch.isnan(limit)
    limit = torch.nan_to_num(limit, nan=0.0)  # a NaN in the unused branch would still poison the gradient
    greedy = (w < limit).float() if hard else torch.sigmoid((limit - w) / GREEDY_SOFTNESS)
    return torch.where(sampled, 1 - w, greedy)


def head_weights(head, positions: Rollouts, lam: float, hard: bool = False) -> torch.Tensor:
    """w_t [B, T] at recorded positions: an EnsembleHead's from the hidden states (and the p/q terms, where
    it reads them); a CostHead's smoothed threshold at λ (training's), or with `hard` the threshold decoding
    applies."""
    model = getattr(head, "module", head)  # as the accelerator may have wrapped it
    rule_cost = positions.cross_entropy - positions.target_entropy
    if not isinstance(model, CostHead):
        terms = pq_terms(rule_cost, positions.tv, positions.target_entropy) if model.reads_pq else None
        return head(positions.target_hidden, positions.draft_hidden, terms)
    args = (
        positions.target_hidden,
        positions.draft_hidden,
        rule_cost,
        positions.tv,
        positions.target_entropy,
        lam,
    )
    return (model.cost(*args) > lam * positions.tv).float() if hard else head(*args)


def lam_for_acceptance(positions: Rollouts, target: float) -> float:
    """The λ at which the dense objective's per-token optimum (w_t = 1 where CE − H > λ·TV, else 0) has
    mean acceptance `target` over these positions; ValueError where no λ reaches it."""
    tv, gain = positions.tv[0], (positions.cross_entropy - positions.target_entropy)[0]
    ratio = torch.where(tv > 1e-6, gain / tv.clamp_min(1e-6), torch.full_like(tv, float("inf")))
    order = ratio.argsort(descending=True)  # w = 1 goes first where the target gains most per unit of TV
    acceptance = 1 - tv[order].cumsum(0) / len(tv)  # after setting w = 1 on the first k positions
    if not acceptance[-1] <= target <= 1:
        raise ValueError(
            f"a target acceptance of {target} is out of reach here: it lies in "
            f"[{acceptance[-1]:.3f}, 1] (exact decoding's acceptance is the lower end)"
        )
    k = min(int((acceptance > target).sum()) + 1, len(tv))  # w = 1 on the first k: acceptance reaches target
    ranked = ratio[order].clamp(max=1e3)
    # halfway to the next position's ratio, so that the strict rule CE − H > λ·TV keeps exactly the first k
    # λ < 0 would reward rejections: where the target is at exact decoding's own acceptance, λ = 0
    return max(float((ranked[k - 1] + ranked[k]) / 2) if k < len(tv) else float(ranked[-1]) / 2, 0.0)


def head_loss(
    head,
    rollouts: Rollouts,
    advantages: torch.Tensor,
    lam: float,
    dense_fidelity: float = 0.0,
    target_acceptance: float | None = None,
    penalty: float = 0.0,
):
    """Policy-gradient term, acceptance term and, optionally, the dense fidelity term and the augmented
    Lagrangian's penalty on the gap to a target acceptance; returns (loss, acceptance, mean_w)."""
    w = head_weights(head, rollouts, lam)
    mask = rollouts.mask
    log_nu = torch.log(w * rollouts.target_prob + (1 - w) * rollouts.draft_prob + 1e-12)
    tokens = mask.sum().clamp_min(1)
    policy = -(advantages[:, None] * log_nu * mask).sum() / tokens
    share = draft_share(w, rollouts)
    acceptance = ((1 - rollouts.tv * (1 - share)) * mask).sum() / tokens
    mean_w = (w * mask).sum() / tokens
    loss = policy - lam * acceptance
    if dense_fidelity:
        expected_log_p = -(
            rollouts.target_entropy + share * (rollouts.cross_entropy - rollouts.target_entropy)
        )
        loss = loss - dense_fidelity * (expected_log_p * mask).sum() / tokens
    if target_acceptance is not None:
        loss = loss + penalty / 2 * (acceptance - target_acceptance) ** 2
    return loss, acceptance, mean_w


def multiplier_update(lam: float, acceptance: float, target: float, penalty: float) -> float:
    """The augmented Lagrangian's multiplier step for the constraint mean acceptance = target (λ ≥ 0).

    Why not a fixed λ: lower w makes the rollouts draft-like text on which the target is flatter, so
    relaxing looks cheaper still, and w moves as a whole. Why not the multiplier alone: the head answers a
    change of λ a few steps late, and λ overshoots. The penalty in head_loss pulls the mean back within the
    step, which bounds the drift without damping it fully, as the rollouts' contexts answer a step or more
    late (docs/measurements/training.md)."""
    return max(lam + penalty * (target - acceptance), 0.0)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """reward − its prompt group's mean, normalised by the batch's standard deviation."""
    grouped = rewards.view(-1, group_size)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).flatten()
    return advantages / (advantages.std() + 1e-6) if advantages.numel() > 1 else advantages
