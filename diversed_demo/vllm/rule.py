"""The DIVERSED rule in the form vLLM's rejection sampler needs it: pure tensor functions, no vLLM import.

vLLM's EAGLE-3 path drafts greedily by default (`draft_sample_method="greedy"`), so q is a point mass on
the drafted token x and `draft_probs` is None; with `draft_sample_method="probabilistic"` it samples x from
the draft's distribution and passes that q. Either way nu = w·p + (1 − w)·q, and:
- sampled requests keep x with probability min(1, w·p(x)/q(x) + (1 − w)) (for a point mass: w·p(x) + 1 − w);
  a rejected x is redrawn from norm(max(0, nu − q)) = norm(max(0, p − q)) (w > 0), which is vLLM's own
  recovered distribution (for a point mass: p without x). So only the acceptance test changes.
- greedy requests keep x while it is argmax nu; at the first mismatch the next token is argmax nu (with q
  the draft's distribution where vLLM keeps it: greedy_q.py keeps it for greedy batches too).

The per-token rule (`diversed_lambda`, core/cost_rule.py) is a w_t ∈ {0, 1} per drafted token from p and q,
which the rejection step already holds: sampled, w_t = 1 where CE(q, p) − H(p) > λ·TV(p, q), which for a
point mass on x is −log p(x) − H(p) > λ·(1 − p(x)); greedy, w_t = 0 (keep x) where x is the draft's own
choice and log max p − log p(x) ≤ λ. Those w_t then go through the same two paths as a static w, and
so do a learned head's (`diversed_head`, sampler.py), which also reads both models' hidden states.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..core.cost_rule import TINY, cost_weights, greedy_cost_weights
from ..core.sampling import greedy_tokens
from ..core.verify import ensemble_probs
from ..models.heads import is_head_name

WEIGHT_KEY = "diversed_w"  # in SamplingParams.extra_args, an OpenAI request's body, or additional_config
LAMBDA_KEY = "diversed_lambda"  # the per-token rule's λ, in the same places
HEAD_KEY = "diversed_head"  # a learned head by name, in the same places
HEADS_KEY = "diversed_heads"  # in additional_config: the heads a server loads at start
VERIFIER_KEYS = (WEIGHT_KEY, LAMBDA_KEY, HEAD_KEY)  # a request's own verifier, where it sets one


def parse_ensemble_weight(value, source: str = WEIGHT_KEY) -> float:
    """w as given by a request or the server's config: a real number in [0, 1], else a ValueError that says
    what was wrong (never a traceback for the user)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{source} must be a number in [0, 1], not {value!r}")
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"{source} must be in [0, 1], not {value!r}")
    return float(value)


def parse_lambda(value, source: str = LAMBDA_KEY) -> float:
    """λ as given by a request or the server's config: a finite number ≥ 0, else a ValueError that says what
    was wrong."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{source} must be a number ≥ 0, not {value!r}")
    if not 0.0 <= value < math.inf:  # NaN fails this too
        raise ValueError(f"{source} must be a finite number ≥ 0, not {value!r}")
    return float(value)


class Verifier(NamedTuple):
    """One request's verifier: a static w (1: exact), the per-token rule's λ (NaN: none), or a head's name
    (a cost head thresholded at λ, or at its default where λ is NaN)."""

    w: float = 1.0
    lam: float = math.nan
    head: str | None = None

    @property
    def relaxed(self) -> bool:
        return self.w < 1 or not math.isnan(self.lam) or self.head is not None


def parse_head_name(value, source: str = HEAD_KEY) -> str:
    """A head's name as a request or the server's config gives it (which heads exist, the server says)."""
    if not is_head_name(value):
        raise ValueError(f"{source} must be a head's name (letters, digits, _ - .), not {value!r}")
    return value


def request_verifier(extra_args: dict | None, default: Verifier = Verifier()) -> Verifier:
    """One request's verifier: its own `diversed_head` (with `diversed_lambda` for a cost head), its own
    `diversed_lambda` (the rule) or its own `diversed_w` (a static w), else the server's default. A request
    that sets a w beside either of the others is refused."""
    args = extra_args or {}
    if WEIGHT_KEY in args and (LAMBDA_KEY in args or HEAD_KEY in args):
        raise ValueError(
            f"set one of {WEIGHT_KEY}, {LAMBDA_KEY} or {HEAD_KEY}, not both: one request has one verifier "
            f"(only a cost head takes a {LAMBDA_KEY} beside it)"
        )
    lam = parse_lambda(args[LAMBDA_KEY]) if LAMBDA_KEY in args else math.nan
    if HEAD_KEY in args:
        return Verifier(lam=lam, head=parse_head_name(args[HEAD_KEY]))
    if LAMBDA_KEY in args:
        return Verifier(lam=lam)
    if WEIGHT_KEY in args:
        return Verifier(w=parse_ensemble_weight(args[WEIGHT_KEY]))
    return default


def rule_weights(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    lams: torch.Tensor,
    greedy: torch.Tensor,
) -> torch.Tensor:
    """w_t ∈ {0, 1} [num_tokens] of the per-token rule at each token's λ (lams [num_tokens]), sampled or
    greedy per token (greedy [num_tokens] bool), from target_probs [num_tokens, V] and the drafted tokens
    [num_tokens] (−1: none); q is draft_probs [num_tokens, V], or where None the point mass on each x."""
    x = draft_token_ids.clamp_min(0).long()
    rows = torch.arange(len(x), device=x.device)
    lams = lams.to(target_probs.dtype)
    if draft_probs is None:  # q = δ_x: CE(q, p) = −log p(x), TV(p, q) = 1 − p(x), and x is q's own choice
        log_p = target_probs.clamp_min(TINY).log()
        log_p_x, entropy = log_p[rows, x], -(target_probs * log_p).sum(-1)
        sampled = (-log_p_x - entropy > lams * (1 - log_p_x.exp())).float()
        greedy_w = (log_p.max(-1).values - log_p_x > lams).float()
    else:
        sampled = cost_weights(target_probs, draft_probs, lams)
        greedy_w = greedy_cost_weights(target_probs, draft_probs, x, lams)
    return torch.where(greedy, greedy_w, sampled)


def token_weights(request_weights: torch.Tensor, num_draft_tokens: list[int]) -> torch.Tensor:
    """[batch] request weights -> [num_tokens] weights, one per drafted token (vLLM's flat layout)."""
    counts = torch.as_tensor(num_draft_tokens, device=request_weights.device)
    return request_weights.repeat_interleave(counts, output_size=sum(num_draft_tokens))


def ensemble_uniforms(uniform_probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """vLLM keeps x when u ≤ p(x)/q(x); DIVERSED keeps it when u ≤ w·p(x)/q(x) + (1 − w), that is when
    (u − (1 − w))/w ≤ p(x)/q(x). So vLLM's own kernel, fed these shifted uniforms, applies the DIVERSED
    test. w = 1 leaves u as it is, bit for bit; w = 0 keeps every real draft (a shifted uniform of −1)."""
    w = weights.to(uniform_probs.dtype)
    shifted = (uniform_probs - (1.0 - w)) / w.clamp_min(torch.finfo(w.dtype).tiny)
    return torch.where(w > 0, shifted, torch.full_like(uniform_probs, -1.0))


def ensemble_argmax(
    target_argmax: torch.Tensor,
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    weights: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """argmax nu per drafted position, for greedy requests, from target_probs [num_tokens, V] (p at
    temperature 1, as in greedy SD: the step's softmax of the logits) and q: draft_probs [num_tokens, V], or
    where vLLM kept none (greedy drafting) the point mass on the drafted x.

    With the point mass, nu(x) = w·p(x) + 1 − w and nu(y) = w·p(y), so x is argmax nu iff
    w·(max p − p(x)) ≤ 1 − w; otherwise argmax nu is argmax p. vLLM's greedy kernel keeps a draft that
    equals the token given here and emits that token at the first mismatch, so this is the whole greedy
    rule. Rows with w = 1 are left untouched.
    """
    drafted = draft_token_ids >= 0  # vLLM pads missing drafts with −1, which must be rejected
    w = weights.to(torch.float32)
    if draft_probs is not None:
        nu = ensemble_probs(target_probs, draft_probs, w)
        choice = greedy_tokens(nu).to(target_argmax.dtype)
        return torch.where(drafted & (w < 1), choice, target_argmax)
    x = draft_token_ids.clamp_min(0).long()
    p_x = target_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    p_max = target_probs.max(dim=-1).values
    keep = drafted & (w < 1) & (w * (p_max - p_x) <= 1 - w)
    return torch.where(keep, x.to(target_argmax.dtype), target_argmax)
