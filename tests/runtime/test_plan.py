"""runtime/plan.py: `load_pair` hands each caller a pair of its own."""

from __future__ import annotations

from tiny import save_tiny_pair

from diversed_demo.runtime.plan import load_pair


def test_each_load_is_a_new_pair_that_nothing_else_holds(tmp_path):
    """No hidden cache: a second load with the same arguments is a pair of its own, so what one caller's
    background work changes in its pair (its passes, its runtime) never reaches another's."""
    target, draft = save_tiny_pair(tmp_path)
    first = load_pair(target, draft, "cpu", "float32", compiled="off")
    second = load_pair(target, draft, "cpu", "float32", compiled="off")
    assert first is not second and first.target is not second.target and first.runtime is not second.runtime
    assert str(first.runtime) == str(second.runtime)
