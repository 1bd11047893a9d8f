"""The optimiser, its learning-rate schedule and resumable checkpoints: one of each for head training
(training/loop.py) and draft training (distill/train.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from .files import atomic_torch_save


def adamw_with_schedule(params, lr: float, warmup_steps: int, total_steps: int, **adamw):
    """AdamW, and transformers' schedule for it: linear warm-up over `warmup_steps`, then cosine decay to 0
    at `total_steps`. Returns (optimizer, scheduler)."""
    from transformers import get_cosine_schedule_with_warmup

    optimizer = torch.optim.AdamW(params, lr=lr, **adamw)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, warmup_steps, total_steps)


def save_checkpoint(path, optimizer, scheduler, **entries) -> None:
    """`entries` (weights, step, history, …) with the optimiser's and the schedule's state, in one file
    written atomically: an interrupt leaves the previous checkpoint or this one."""
    atomic_torch_save(
        {**entries, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, path
    )


def load_checkpoint(path, optimizer, scheduler, map_location="cpu", weights_only: bool = True) -> dict | None:
    """Restore the optimiser and the schedule from a checkpoint and return all its entries; None if there
    is none."""
    path = Path(path)
    if not path.exists():
        return None
    saved = torch.load(path, map_location=map_location, weights_only=weights_only)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    return saved
