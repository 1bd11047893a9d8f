"""common/timing.py: which of two calls runs faster here."""

from __future__ import annotations


def test_runs_faster_picks_the_faster_call():
    from diversed_demo.common.timing import runs_faster

    quick, slow = (lambda: sum(range(10)), lambda: sum(range(20000)))
    assert runs_faster(quick, slow, rounds=3, repeats=3)
    assert not runs_faster(slow, quick, rounds=3, repeats=3)
