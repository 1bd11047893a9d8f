"""Background work at the lowest priority, so that a visitor's decode keeps the cores."""

from __future__ import annotations

import os


def lowest_priority() -> None:
    """The calling thread's (or a child process's, as its preexec_fn) CPU time only where the app leaves a
    core idle: Linux's idle scheduling class, else nice 19 (docs/measurements/speed.md, "The first
    minute"). Threads and processes it starts inherit it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
