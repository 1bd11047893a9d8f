"""The verification rule of (relaxed) speculative decoding, as pure functions over probability tensors.

Shapes: a block of N drafted tokens has `draft_probs` [N, V] (the draft's distribution at each drafted
position) and `target_probs` [N + 1, V] (the target's distribution at the same positions plus the bonus
position). `ensemble_weight` is a float or a tensor [N], one w_t per drafted position.

Exact speculative decoding is the special case w = 1 (nu = p).
"""

from __future__ import annotations

import torch

from .sampling import greedy_tokens, sample


def _weight_column(ensemble_weight, like: torch.Tensor) -> torch.Tensor:
    w = torch.as_tensor(ensemble_weight, dtype=like.dtype, device=like.device)
    return w.unsqueeze(-1) if w.dim() > 0 else w


def ensemble_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor, ensemble_weight) -> torch.Tensor:
    """nu = w·p + (1 − w)·q, with w a scalar or one value per position. One `lerp` pass over the vocabulary
    instead of four; it returns p itself where w = 1 and q itself where w = 0, so exact decoding's choices
    are p's, bit for bit."""
    return torch.lerp(draft_probs, target_probs, _weight_column(ensemble_weight, target_probs))


def acceptance_prob(nu_of_x: torch.Tensor, draft_of_x: torch.Tensor) -> torch.Tensor:
    """min(1, nu(x)/q(x)) for the drafted tokens x (q(x) > 0 since x was drawn from q)."""
    return torch.clamp(nu_of_x / draft_of_x.clamp_min(torch.finfo(draft_of_x.dtype).tiny), max=1.0)


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)): where a rejected token is redrawn from.

    For nu = w·p + (1 − w)·q with w > 0, max(0, nu − q) = w·max(0, p − q), so the residual of nu is the
    residual of p. When p ≈ q the residual is numerically zero (and rejection was nearly impossible):
    fall back to p, which is then the same distribution.
    """
    residual = torch.clamp(target_probs - draft_probs, min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    safe = mass > 1e-12
    return torch.where(safe, residual / mass.clamp_min(1e-30), target_probs)


def total_variation(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = ½·Σ|p − q|; the rejection probability of exact SD at that position."""
    return 0.5 * (target_probs - draft_probs).abs_().sum(dim=-1)  # in place: one [n, V] buffer fewer


def verify_block(draft_tokens, draft_probs, target_probs, ensemble_weight, generator=None):
    """Sampled verification of N drafted tokens against nu = w·p + (1 − w)·q.

    Returns (n_accepted, next_token, accept_probs): the first n_accepted drafts are kept; next_token
    is the resampled token at the first rejection, or the bonus token from p when all N pass.
    Every emitted token is distributed as nu at its position (the bonus as p).
    """
    n = draft_tokens.shape[0]
    positions = torch.arange(n, device=draft_tokens.device)
    # Only nu(x) at the drafted tokens is needed: gathered first, the rule never sweeps the vocabulary.
    target_of_x, draft_of_x = target_probs[positions, draft_tokens], draft_probs[positions, draft_tokens]
    nu_of_x = ensemble_probs(target_of_x[:, None], draft_of_x[:, None], ensemble_weight)[:, 0]
    accept_probs = acceptance_prob(nu_of_x, draft_of_x)
    coins = torch.rand(n, generator=generator, device=draft_tokens.device)
    rejected = coins >= accept_probs
    n_accepted = int(rejected.int().cumsum(0).eq(0).sum())  # the one host sync per block
    if n_accepted < n:
        next_probs = residual_probs(target_probs[n_accepted], draft_probs[n_accepted])
    else:
        next_probs = target_probs[n]
    next_token = sample(next_probs, generator)
    return n_accepted, next_token, accept_probs


def verify_block_greedy(draft_tokens, draft_probs, target_probs, ensemble_weight):
    """Greedy verification: keep drafts while they equal argmax nu; then argmax nu at the first mismatch,
    or argmax p at the bonus position. Returns (n_accepted, next_token, accept_probs) with accept_probs
    1 or 0, the greedy analogue."""
    n = draft_tokens.shape[0]
    choice = greedy_tokens(target_probs[n:])  # p at the bonus position
    if n:  # nu at the drafted ones; the choices joined, not the [n + 1, V] scores (a fifth of the time)
        choice = torch.cat(
            [greedy_tokens(ensemble_probs(target_probs[:n], draft_probs, ensemble_weight)), choice]
        )
    matches = choice[:n].eq(draft_tokens)
    n_accepted = int(matches.int().cumprod(0).sum())
    return n_accepted, choice[n_accepted], matches.float()
