"""The draft/target cost ratios c the dial's projection offers: the embedded pair's, measured (its draft
card), and GPU pairs' estimated from their sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..eval.schemas import DraftCard, read_model
from ..models.embedded import EMBEDDED_DRAFT_DIR

DRAFT_CARD = EMBEDDED_DRAFT_DIR / "card.json"

# Decoding one token on a GPU is memory-bound: a forward pass costs about the time to read the weights, so
# c ≈ draft parameters ÷ target parameters. Model sizes in billions, not results: marked as estimates.
GPU_PAIRS = (
    ("Llama-3.1-8B ← Llama-3.2-1B", 8.03, 1.24),
    ("Qwen2.5-7B ← Qwen2.5-0.5B", 7.62, 0.49),
    ("Qwen2.5-32B ← Qwen2.5-1.5B", 32.8, 1.54),
    ("Llama-3.1-70B ← Llama-3.2-1B", 70.6, 1.24),
)


@dataclass
class CostPreset:
    label: str
    cost_ratio: float
    source: str


def measured_cost_preset(card_path: Path = DRAFT_CARD) -> CostPreset | None:
    """The embedded draft's measured draft/target cost per token, from its card (None where it lacks
    it)."""
    card, _ = read_model(DraftCard, card_path)
    figures = card.spec_bench if card is not None else None
    c = figures.cost_ratio if figures is not None else None
    if c is None or not 0 < c <= 1:
        return None
    threads = figures.threads
    where = f"CPU, {threads} thread{'s' if threads != 1 else ''}" if threads else "CPU"
    return CostPreset(f"embedded pair, measured ({where}): c = {c:.2f}", round(float(c), 2), str(card_path))


def cost_presets(card_path: Path = DRAFT_CARD) -> list[CostPreset]:
    """The measured preset first (where the card has one), then the GPU estimates."""
    presets = [
        CostPreset(
            f"GPU {name} (size ratio, estimate): c = {draft / target:.3f}",
            round(draft / target, 3),
            "parameter counts",
        )
        for name, target, draft in GPU_PAIRS
    ]
    measured = measured_cost_preset(card_path)
    return ([measured] if measured else []) + presets
