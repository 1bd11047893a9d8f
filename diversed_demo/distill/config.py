"""A draft training run's settings (DraftTrainConfig), which refuse bad values when made."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftTrainConfig:
    ttt_steps: int = 4
    step_decay: float = 0.8
    lr: float = 1e-3
    warmup_steps: int = 50
    epochs: float = 2.0
    batch_tokens: int = 6144  # padded tokens per batch
    max_length: int = 1024
    eval_every: int = 100
    heldout_fraction: float = 0.02
    draft_vocab_size: int = 8192
    seed: int = 0
    # bf16 autocast pays on GPUs and AMX CPUs only (figures: docs/measurements/distill.md)
    bf16: bool = False
    sources: list[str] | None = None  # train on these sources only (None: all) ...
    replay: float = 0.0  # ... and on this seeded fraction of the other sources' records

    def __post_init__(self):
        """Refuse bad settings at once, before any model loads."""
        if not 0 <= self.replay <= 1:
            raise ValueError(f"replay must be between 0 and 1, not {self.replay}")
        if self.replay and not self.sources:
            raise ValueError("replay keeps a share of the sources outside `sources`: give sources too")
        for name in ("epochs", "lr", "batch_tokens", "ttt_steps", "eval_every"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value}")
