"""Which of two ways to compute the same thing is faster on this machine, timed where the answer depends
on the CPU."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch


def runs_faster(candidate: Callable[[], object], stock: Callable[[], object], rounds=16, repeats=10) -> bool:
    """Whether `candidate` beats `stock`: the best of `rounds` turns of `repeats` calls each, the two taking
    turns so that a burst of load on a shared CPU hits both alike; the first turn warms up. Timed on one
    thread: with more, a core busy with another process can stall every parallel call for a scheduler
    slice (~8 ms measured), which hides the kernels' difference (docs/measurements/speed.md)."""
    best = {candidate: float("inf"), stock: float("inf")}
    with one_thread():
        for turn in range(rounds + 1):
            for call in best:
                start = time.perf_counter()
                for _ in range(repeats):
                    call()
                if turn:
                    best[call] = min(best[call], time.perf_counter() - start)
    return best[candidate] < best[stock]


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def device_clock(device: torch.device) -> Callable[[], float]:
    """A clock that first waits for the device's queued work (a GPU runs ahead of the host): what a
    timing of decoding steps reads; the decoder's own clock never waits."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock
