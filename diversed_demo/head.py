"""Ensemble heads: objects that give w_t for each drafted position from both models' hidden states."""
from __future__ import annotations

import torch


class ConstantHead:
    """A head that always answers the same w; it exercises the dynamic plumbing and is the static rule."""

    def __init__(self, ensemble_weight: float):
        self.value = float(ensemble_weight)

    def ensemble_weight(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor) -> torch.Tensor:
        return torch.full((target_hidden.shape[0],), self.value, device=target_hidden.device)
