"""The per-token rule: a w_t for each drafted position from p and q alone, with one knob λ and no training.

Per position, with nu = w·p + (1 − w)·q, the emitted token follows nu, so the target's expected
log-probability of it (fidelity) is w·(−H(p)) + (1 − w)·(−CE(q, p)) and the chance of keeping the draft is
1 − w·TV(p, q). Both are linear in w, so fidelity + λ·acceptance is maximised per position by

    w_t = 1 where CE(q, p) − H(p) > λ·TV(p, q), else 0:

relax (w = 0, keep the draft's token) where the draft's token costs the target little. λ prices a
rejected draft in nats: at λ = 0 the rule relaxes only where drafting from q raises the target's expected
log-probability (a draft sharper than p on p's likely tokens), a large λ keeps nearly every draft.
Greedy decoding has no law to weigh, so its form keeps the draft's own choice x where the target's
log-probability margin log max p − log p(x) is at most λ, and checks every other position exactly.
"""

from __future__ import annotations

import torch

from .sampling import greedy_tokens
from .verify import total_variation

TINY = 1e-30  # log 0 guard: a token with p = 0 costs about 69 nats, never −inf times 0


def position_costs(target_probs: torch.Tensor, draft_probs: torch.Tensor):
    """Per position, from target_probs, draft_probs [n, V]: the cost of relaxing CE(q, p) − H(p) in nats,
    its price TV(p, q), and H(p), each [n]."""
    log_p = target_probs.clamp_min(TINY).log_()  # in place on clamp's copy: one [n, V] buffer fewer
    cross_entropy = -(draft_probs * log_p).sum(-1)
    entropy = -(target_probs * log_p).sum(-1)
    return cross_entropy - entropy, total_variation(target_probs, draft_probs), entropy


def greedy_position_costs(target_probs: torch.Tensor, draft_probs: torch.Tensor):
    """The same three terms [n] for greedy decoding, which compares argmaxes: p and q as point masses on
    their choices, so the cost is the margin log max p − log p(the draft's choice), the price TV is 1 where
    the two choices differ (else 0), and H is −log max p. A head reads these where it serves greedy."""
    best, target_choice = target_probs.max(-1)  # two logs a row, not one per vocabulary entry
    draft_choice = greedy_tokens(draft_probs)
    log_best = best.clamp_min(TINY).log()
    cost = log_best - target_probs.gather(-1, draft_choice[..., None]).squeeze(-1).clamp_min(TINY).log()
    return cost, target_choice.ne(draft_choice).to(log_best.dtype), -log_best


def cost_weights(target_probs: torch.Tensor, draft_probs: torch.Tensor, lam: float) -> torch.Tensor:
    """w_t ∈ {0, 1} of sampled decoding: target_probs, draft_probs [n, V] -> [n]."""
    cost, tv, _ = position_costs(target_probs, draft_probs)
    return (cost > lam * tv).float()


def greedy_cost_weights(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, lam: float
) -> torch.Tensor:
    """w_t ∈ {0, 1} of greedy decoding: 0 where the drafted token [n] is the draft's own choice and within λ
    of the target's best in log-probability (so nu = q keeps it), 1 elsewhere (exact greedy verification)."""
    positions = torch.arange(len(draft_tokens), device=draft_tokens.device)
    log_p = target_probs.clamp_min(TINY).log()
    margin = log_p.max(-1).values - log_p[positions, draft_tokens]
    own_choice = greedy_tokens(draft_probs).eq(draft_tokens)  # a copy from lookup is checked exactly
    return (~(own_choice & (margin <= lam))).float()
