"""One point of the frontier: a static w or a head, with its per-example counts and quality."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.stats import Counts


@dataclass
class Point:
    label: str  # "static:<w>", "cost:<λ>" or "dynamic:<head>"
    w: float | None  # the static weight; None for the rule and a head
    counts: list[Counts] = field(default_factory=list)  # per example
    quality: list[float] = field(default_factory=list)
    fidelity: list[float] = field(default_factory=list)  # the target's mean log-probability of each text
    mean_w: list[float] = field(default_factory=list)
    token_w: list[float] = field(default_factory=list)  # w_t at every position a draft token competed

    @property
    def total(self) -> Counts:
        return sum(self.counts, Counts())

    @property
    def acceptance(self) -> float:
        return self.total.acceptance_rate or 0.0

    @property
    def mean_quality(self) -> float:
        return float(np.mean(self.quality)) if self.quality else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.total.tokens_per_second

    def row(self) -> dict:
        return {
            "point": self.label,
            "w": self.w,
            "acceptance": self.acceptance,
            "quality": self.mean_quality,
            "fidelity": float(np.mean(self.fidelity)) if self.fidelity else None,
            "tokens_per_second": self.tokens_per_second,
            "mean_w": float(np.mean(self.mean_w)) if self.mean_w else None,
            # a head that only learned a bias has std ≈ 0: the spread is what per-token w buys
            "w_std": float(np.std(self.token_w)) if self.token_w else None,
            "examples": len(self.quality),
        }
