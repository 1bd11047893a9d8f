"""Background work out of a visitor's way: at the lowest priority, and its processes stopped while a decode
runs (docs/measurements/speed.md, "The first minute")."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading

_lock = threading.RLock()  # a decode left to the garbage collector may end inside any of these calls
_groups: set[int] = set()  # process groups of the background builds now running
_decodes = 0  # decodes now running, in this process


def lowest_priority() -> None:
    """The calling thread's (or a child process's, as its preexec_fn) CPU time only where the app leaves a
    core idle: Linux's idle scheduling class, else nice 19. Threads and processes it starts inherit it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def background(command: list[str], **kwargs) -> subprocess.Popen:
    """Start a background build: at the lowest priority, in a process group of its own, which is stopped
    while a decode runs (`decoding`) and goes on between decodes."""
    process = subprocess.Popen(command, preexec_fn=lowest_priority, start_new_session=True, **kwargs)
    with _lock:
        _groups.add(process.pid)
        if _decodes:
            _signal(process.pid, signal.SIGSTOP)
    return process


def finished(process: subprocess.Popen) -> int:
    """Wait for a background build to end; its exit status."""
    try:
        return process.wait()
    finally:
        with _lock:
            _groups.discard(process.pid)


@contextlib.contextmanager
def decoding():
    """Around a decode: the background builds stop until no decode runs (a stopped compiler costs a
    visitor nothing; one at the idle priority still shares the caches and the memory bus)."""
    global _decodes
    with _lock:
        _decodes += 1
        if _decodes == 1:
            for group in _groups:
                _signal(group, signal.SIGSTOP)
    try:
        yield
    finally:
        with _lock:
            _decodes -= 1
            if not _decodes:
                for group in _groups:
                    _signal(group, signal.SIGCONT)


def _signal(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


@atexit.register
def _go_on() -> None:  # never leave a build stopped behind a process that ends mid-decode
    for group in list(_groups):
        _signal(group, signal.SIGCONT)
