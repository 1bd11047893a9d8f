"""Background builds (the AMX kernel's compiler, the compiled passes' worker) stay out of a visitor's way:
idle priority, and stopped while a decode runs (common/priority.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from diversed_demo.common import priority

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process states read from /proc")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def state(pid: int) -> str:
    """The process's state letter in /proc: T where stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def settled(pid: int, wanted: bool) -> bool:
    for _ in range(100):
        if (state(pid) == "T") == wanted:
            return True
        time.sleep(0.01)
    return False


def test_a_build_stops_while_a_decode_runs_and_goes_on_after():
    build = priority.background(SLEEPER)
    try:
        assert settled(build.pid, wanted=False)
        with priority.decoding():
            assert settled(build.pid, wanted=True)
            with priority.decoding():  # two decodes at once: it goes on only after both
                pass
            assert settled(build.pid, wanted=True)
        assert settled(build.pid, wanted=False)
    finally:
        build.kill()
        priority.finished(build)


def test_a_build_started_during_a_decode_waits_for_its_end():
    with priority.decoding():
        build = priority.background(SLEEPER)
        try:
            assert settled(build.pid, wanted=True)
        finally:
            build.kill()
            assert priority.finished(build) != 0
    with priority.decoding():
        pass  # a finished build is forgotten: nothing to signal


def test_a_decode_of_a_pair_stops_the_builds():
    from tiny import tiny_pair

    from diversed_demo.core.generate import speculative_generate

    pair, build = tiny_pair(), priority.background(SLEEPER)
    try:
        decode = speculative_generate(pair, [1, 5, 9], mode="exact", n_draft=2, max_new_tokens=8)
        next(decode)
        assert settled(build.pid, wanted=True)
        list(decode)
        assert settled(build.pid, wanted=False)
    finally:
        build.kill()
        priority.finished(build)
