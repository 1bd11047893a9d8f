"""The time a worker spends on heads: recording the draft's hidden states, gathering both models' at the
drafted positions, and evaluating the heads. `bench` reads it (`collective_rpc("diversed_head_clock")`) to
give the heads' share of a decoding step. On a GPU the clock waits for the device at both ends of each
interval (only while DIVERSED_TIME_HEADS is set: it would cost the step otherwise)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

PARTS = ("record", "gather", "evaluate")  # the draft's rows as it drafts; both models' rows; the heads
SECONDS = dict.fromkeys(PARTS, 0.0)


@contextmanager
def head_work(part: str):
    """Count the time of the block as heads' work, under `part` (one of PARTS)."""
    synchronize = torch.cuda.is_available() and bool(os.environ.get("DIVERSED_TIME_HEADS"))
    if synchronize:
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if synchronize:
            torch.cuda.synchronize()
        SECONDS[part] += time.perf_counter() - start


def read_and_reset(worker=None) -> dict[str, float]:
    """Seconds of heads' work by part since the last read (a worker method: `worker` is vLLM's, unused)."""
    seconds = dict(SECONDS)
    SECONDS.update(dict.fromkeys(PARTS, 0.0))
    return seconds


def install() -> None:
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    WorkerWrapperBase.diversed_head_clock = read_and_reset
