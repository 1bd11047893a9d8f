"""What a head learned, measured offline on recorded positions: its gain over a static w of the same
acceptance, what separates the positions it hands to the draft, and the scale on which to choose λ."""

from __future__ import annotations

import torch

from ..core.head import ConstantHead
from ..core.prompt import encode_prompt
from .config import HeadTrainConfig, training_examples
from .objective import draft_share, lam_for_acceptance
from .rollouts import Rollouts, sample_rollouts


def fidelity_cost_quartiles(pair, config: HeadTrainConfig, prompts: int = 6) -> list[float]:
    """Quartiles of (CE − H)/TV at the verified positions of exact-SD rollouts (one per prompt, the config's
    N, temperature and length) of the task's first training prompts. The dense loss's per-token optimum
    sets w_t → 1 where this ratio exceeds λ, so λ at a quartile lets the draft through on that share of
    positions: the scale on which to choose λ for a new pair."""
    generator = torch.Generator().manual_seed(config.seed)
    r = sample_rollouts(
        pair,
        ConstantHead(1.0),
        [encode_prompt(pair.tokenizer, e.prompt) for e in training_examples(config)[:prompts]],
        config.max_new_tokens,
        config.temperature,
        generator,
        config.n_draft,
    )
    keep = (r.mask > 0) & (r.tv > 1e-6)  # where the draft differs from the target at all
    ratios = (r.cross_entropy - r.target_entropy)[keep] / r.tv[keep]
    if not len(ratios):
        raise ValueError("the draft matched the target at every position: any λ lets it through")
    return torch.quantile(ratios, torch.tensor([0.25, 0.5, 0.75])).tolist()


def frontier_gain(w: torch.Tensor, positions: Rollouts) -> dict:
    """Expected fidelity (mean E_ν[log p] per token) of per-token weights w against a static w with the same
    expected acceptance, and against the per-token optimum (the threshold rule) with that acceptance: the
    offline measure of how much of the possible gain over the static frontier a head captures (the rule
    at that acceptance is the optimum: the head's gain over the rule is fidelity − oracle_fidelity). Greedy
    positions are counted by the greedy rule itself (kept iff w_t is below the position's limit)."""
    tv, h, ce = positions.tv[0], positions.target_entropy[0], positions.cross_entropy[0]
    share = lambda weights: draft_share(weights, positions, hard=True)[0]  # noqa: E731
    accepted = lambda weights: float((1 - tv * (1 - share(weights))).mean())  # noqa: E731
    fidelity = lambda weights: float(-(h + share(weights) * (ce - h)).mean())  # noqa: E731
    acceptance = accepted(w[None])
    low, high = 0.0, 1.0  # the static w of that acceptance (acceptance falls as w rises)
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (
            (middle, high) if accepted(torch.full_like(w, middle)[None]) > acceptance else (low, middle)
        )
    static_w = (low + high) / 2
    try:
        oracle = ((ce - h) > lam_for_acceptance(positions, acceptance) * tv).float()
    except ValueError:  # only at exact decoding's own acceptance (w ≡ 1), up to rounding
        oracle = torch.ones_like(tv)
    head, static, rule = (fidelity(x[None]) for x in (w, torch.full_like(w, static_w), oracle))
    return {
        "acceptance": acceptance,
        "fidelity": head,
        "static_fidelity": static,
        "oracle_fidelity": rule,
        # the share of the optimum's gain over static w the head keeps (None where there is no gain to keep)
        "share_of_optimum": (head - static) / (rule - static) if rule - static > 1e-6 else None,
        "w_mean": float(w.mean()),
        "w_std": float(w.std()),
        "positions": len(tv),
    }


def token_kind(text: str) -> str:
    """A coarse class of a decoded token, for reading what a head does with each."""
    if not text.strip():
        return "whitespace"
    core = text.strip()
    if any(c.isdigit() for c in core):
        return "number"
    if not any(c.isalnum() for c in core):
        return "punctuation"
    return "word start" if text[0].isspace() else "word piece"


def what_separates(w: torch.Tensor, positions: Rollouts, tokenizer) -> dict:
    """What tells the positions a head hands to the draft (low w_t) from those it keeps for the target:
    Spearman correlations of w_t with TV(p, q), H(p) and the fidelity cost of the draft CE − H, and the
    mean w_t by kind of emitted token."""

    def ranks(x: torch.Tensor) -> torch.Tensor:  # tied values share their average rank
        values, order = x.sort()
        _, inverse, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
        result = torch.empty(len(x))
        result[order] = ((counts.cumsum(0) - counts) + (counts - 1) / 2)[inverse].float()
        return result

    def spearman(x: torch.Tensor) -> float | None:
        r = torch.stack([ranks(w), ranks(x)])
        return float(torch.corrcoef(r)[0, 1]) if len(x) > 2 and bool((r.std(1) > 0).all()) else None

    tv, h, ce = positions.tv[0], positions.target_entropy[0], positions.cross_entropy[0]
    kinds = {}
    for weight, token in zip(w.tolist(), positions.tokens[0].tolist()):
        kinds.setdefault(token_kind(tokenizer.decode([token])), []).append(weight)
    return {
        "spearman_w_vs": {
            "tv": spearman(tv),
            "target_entropy": spearman(h),
            "fidelity_cost": spearman(ce - h),
        },
        "mean_w_by_token": {
            kind: {"mean_w": sum(v) / len(v), "positions": len(v)}
            for kind, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
        },
    }
