"""The analytic speedup of speculative decoding (Leviathan et al., 2023), used by the bench and the app's
dial."""

from __future__ import annotations


def analytic_speedup(alpha: float, n_draft: int, c: float, v: float = 1.0, r: float = 0.0) -> float:
    """Expected speedup over target-only decoding (Leviathan et al., 2023): expected tokens per step,
    (1 − α^{N+1}) / (1 − α) with limit N + 1 at α = 1, over the step's cost r + N·c + v in target-token units
    (r: what a step that drafts pays once, the draft's pass over the tokens verified since its last)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"α must be in [0, 1], not {alpha}")
    tokens = n_draft + 1 if alpha == 1 else (1 - alpha ** (n_draft + 1)) / (1 - alpha)
    return tokens / ((r if n_draft else 0.0) + n_draft * c + v)


def wall_bound(step_bound: float, prompt_share: float, length: float = 1.0) -> float:
    """The speed-up over target-only that a decode of step bound `step_bound` can show in wall time, where
    the prompt's pass, `prompt_share` of target-only's time, costs every mode the same once (Amdahl), and
    the decode emits `length` times target-only's tokens: a shorter text spreads that pass over fewer."""
    return 1.0 / (prompt_share / length + (1.0 - prompt_share) / step_bound)


def alpha_from_acceptance(rate: float, n_draft: int) -> float:
    """Per-token acceptance α from the measured accepted/drafted rate of blocks of N drafts.

    With i.i.d. acceptance a block keeps α + α² + … + α^N drafts on average, so accepted/drafted is
    α(1 − α^N) / (N(1 − α)), which rises monotonically in α: invert it by bisection.
    """
    if not 0 <= rate <= 1:
        raise ValueError(f"an acceptance rate must be in [0, 1], not {rate}")
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        if sum(mid**k for k in range(1, n_draft + 1)) / n_draft < rate:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def fastest_n_draft(alpha: float, c: float, v: dict[int, float], r: float = 0.0) -> int:
    """The draft length with the largest analytic speedup among those whose pass cost v[N] was measured."""
    return max(v, key=lambda n: analytic_speedup(alpha, n, c, v[n], r))
