"""Where a head lies against the static frontier: its quality and acceptance margins with bootstrap
errors over examples, the verdict they support, and its paired difference from exact decoding."""

from __future__ import annotations

import statistics

import numpy as np

from ..core.stats import Counts
from .point import Point


def mean_and_se(values: list[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None)


def versus_exact(static_points: list[Point], head_point: Point) -> dict | None:
    """The head's quality minus exact decoding's (the static point w = 1) on the same examples and seeds:
    the paired mean difference and its standard error; None where w = 1 was not decoded."""
    exact = next((p for p in static_points if p.w == 1.0), None)
    if exact is None:
        return None
    mean, se = mean_and_se([h - e for h, e in zip(head_point.quality, exact.quality)])
    return {
        "quality_difference": mean,
        "stderr": se,
        "examples": len(exact.quality),
        "acceptance": {"exact": exact.acceptance, "head": head_point.acceptance},
    }


def versus_point(other: Point, point: Point) -> dict:
    """`point` against `other` (say a cost head against the rule at its λ) on the same examples and seeds:
    paired mean differences of quality and of fidelity, with their standard errors, and both acceptances."""
    quality, quality_se = mean_and_se([a - b for a, b in zip(point.quality, other.quality)])
    figures = {
        "against": other.label,
        "quality_difference": quality,
        "quality_stderr": quality_se,
        "examples": len(other.quality),
        "acceptance": {"against": other.acceptance, "point": point.acceptance},
    }
    if len(point.fidelity) == len(other.fidelity) == len(point.quality):
        fidelity, fidelity_se = mean_and_se([a - b for a, b in zip(point.fidelity, other.fidelity)])
        figures |= {"fidelity_difference": fidelity, "fidelity_stderr": fidelity_se}
    return figures


def _best_where_at_least(curve, x0):
    """The largest y on the piecewise-linear curve [(x, y), …] over the places where x ≥ x0; None where x0
    lies outside the curve's range of x (no claim either way)."""
    xs = [x for x, _ in curve]
    if not curve or x0 < min(xs) or x0 > max(xs):
        return None
    best = max(y for x, y in curve if x >= x0)
    for (xa, ya), (xb, yb) in zip(curve, curve[1:]):
        if min(xa, xb) < x0 < max(xa, xb):  # the segment crosses x0: its point there counts too
            best = max(best, ya + (yb - ya) * (x0 - xa) / (xb - xa))
    return float(best)


def margins(static: list[tuple[float, float]], head: tuple[float, float]) -> dict:
    """Quality margin at the head's acceptance, acceptance margin at the head's quality.

    `static` holds (acceptance, quality) in w order, joined linearly (mixing two neighbouring w reaches
    the segment between them). The frontier is that curve's upper envelope: the head is compared with
    the best static quality at an acceptance at least its own, and the best static acceptance at a quality
    at least its own. Interpolating the curve itself would, where quality is flat or not monotone in w (a
    task at its floor), compare the head with a slow point of equal quality and call it beyond.
    """
    best_quality = _best_where_at_least(static, head[0])
    best_acceptance = _best_where_at_least([(q, a) for a, q in static], head[1])
    return {
        "quality_margin": None if best_quality is None else head[1] - best_quality,
        "acceptance_margin": None if best_acceptance is None else head[0] - best_acceptance,
    }


def _resampled(point: Point, idx) -> tuple[float, float]:
    """(acceptance, quality) of a bootstrap sample of the point's examples."""
    acceptance = sum((point.counts[i] for i in idx), Counts()).acceptance_rate or 0.0
    return acceptance, float(np.asarray(point.quality)[idx].mean())


def frontier_margin(static_points: list[Point], head_point: Point, n_boot: int = 1000, seed: int = 0) -> dict:
    """The head's margins over the static frontier, with bootstrap standard errors and 95% intervals."""
    n = len(head_point.quality)
    static_points = sorted(static_points, key=lambda p: p.w)
    estimate = margins(
        [(p.acceptance, p.mean_quality) for p in static_points],
        (head_point.acceptance, head_point.mean_quality),
    )
    rng = np.random.default_rng(seed)
    samples = {k: [] for k in estimate}
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        m = margins([_resampled(p, idx) for p in static_points], _resampled(head_point, idx))
        for k, v in m.items():
            if v is not None:
                samples[k].append(v)
    result = {}
    for k, value in estimate.items():
        s = np.asarray(samples[k])
        result[k] = {
            "estimate": value,
            "stderr": float(s.std()) if s.size else None,
            "ci95": [float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5))] if s.size else None,
            "p_positive": float((s > 0).mean()) if s.size else None,
            "bootstrap_samples": int(s.size),
        }
    # Beyond the frontier only where a 95% interval excludes zero: a positive estimate alone is noise as often
    # as not on a dozen prompts.
    result["beyond_frontier"] = any(clears_zero(result[k]) for k in ("quality_margin", "acceptance_margin"))
    result["verdict"] = verdict(result, [p.mean_quality for p in static_points], n)
    return result


def clears_zero(margin: dict) -> bool:
    """Whether a margin is measured (the point lies within the static curve's range, so an estimate
    exists) and its 95% interval lies above zero. Resamples may place a point outside the range the
    estimate could not reach: their interval alone is no claim."""
    return margin["estimate"] is not None and margin["ci95"] is not None and margin["ci95"][0] > 0


def verdict(margin: dict, static_qualities: list[float], examples: int) -> dict:
    """What a frontier margin says, as {"kind", "text"}: beyond, below, unresolved, or floor.

    Floor: the static curve's quality varies over w by less than two standard errors of the margin, so the
    set cannot tell any setting from another (a small target near zero on GSM8K or MBPP); no claim is made."""

    def figures(name):
        m = margin[name]
        return (
            f"{name.replace('_', ' ')} {m['estimate']:+.3f} ± {m['stderr']:.3f}, "
            f"95% CI [{m['ci95'][0]:+.3f}, {m['ci95'][1]:+.3f}], n = {examples}"
        )

    quality = margin["quality_margin"]
    if margin["beyond_frontier"]:
        beyond = [k for k in ("quality_margin", "acceptance_margin") if clears_zero(margin[k])]
        return {"kind": "beyond", "text": "beyond the static frontier: " + "; ".join(map(figures, beyond))}
    if quality["ci95"] is None:
        return {
            "kind": "unresolved",
            "text": "the head's acceptance lies outside the static curve's range: no claim",
        }
    spread = max(static_qualities) - min(static_qualities)
    if quality["ci95"][1] < 0:
        return {
            "kind": "below",
            "text": f"below the static frontier at the head's acceptance: {figures('quality_margin')}",
        }
    if spread < 2 * quality["stderr"]:
        return {
            "kind": "floor",
            "text": f"no claim: quality varies by {spread:.3f} over static w, less than two "
            f"standard errors of the margin (the set is at the target's floor); "
            f"{figures('quality_margin')}",
        }
    return {
        "kind": "unresolved",
        "text": f"on the static frontier within its 95% CI: {figures('quality_margin')}",
    }
