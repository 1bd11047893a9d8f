"""runtime/plan.py: `load_pair` hands each caller a pair of its own; choosing drafts never fails a decode."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from tiny import save_tiny_pair

from diversed_demo.core.draft import StandaloneDraft
from diversed_demo.runtime import plan
from diversed_demo.runtime.plan import load_pair
from diversed_demo.runtime.static_pass import StaticPass


def test_each_load_is_a_new_pair_that_nothing_else_holds(tmp_path):
    """No hidden cache: a second load with the same arguments is a pair of its own, so what one caller's
    background work changes in its pair (its passes, its runtime) never reaches another's."""
    target, draft = save_tiny_pair(tmp_path)
    first = load_pair(target, draft, "cpu", "float32", compiled="off")
    second = load_pair(target, draft, "cpu", "float32", compiled="off")
    assert first is not second and first.target is not second.target and first.runtime is not second.runtime
    assert str(first.runtime) == str(second.runtime)


def test_a_pass_that_cannot_be_timed_keeps_chains_says_why_and_fails_no_decode(tmp_path, monkeypatch):
    """The tree-or-chain timing runs where a decode ends: if it fails, that decode still ends normally, the
    pair keeps chains and the log names the failure (and nothing is kept: the next start times again)."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))  # as if compiled

    def broken(*args, **kwargs):
        raise RuntimeError("no pass here")

    monkeypatch.setattr(plan, "compiled_costs", lambda pair: plan.kept_costs(COSTS))
    monkeypatch.setattr(plan, "tree_speed", broken)
    lines = []
    with pair.in_use():  # a decode running: the timing waits for its end
        plan.choose_drafts(pair, lines.append)
        assert lines == []
    assert pair.runtime.drafts == "chains" and pair.runtime.tree_speed is None
    assert lines == ["drafts: chains (timing trees against chains failed: no pass here)"]
    assert not plan.tree_timing_path(pair).exists()


TIMED = [(1.0, "chains"), (plan.TREE_GAIN - 0.01, "chains"), (1.2, "trees")]
STEPS = {"c": 0.3, "r": 0.1, "v": {"1": 1.05, "2": 1.2}}
COSTS = {"c": 0.25, "r": 0.05, "v": {"1": 1.1, "2": 1.3}, "steps": STEPS}  # as a JSON file keeps them
KEPT = plan.kept_costs(COSTS)  # as the pair keeps them


@pytest.mark.parametrize("speed, drafts", TIMED)
def test_trees_are_drafted_only_where_their_decodes_ran_faster(tmp_path, monkeypatch, speed, drafts):
    """A wider pass that costs little is not enough: trees are chosen by their decodes' measured speed. The
    timing, and the costs the draft length weighs timed on the same passes, are kept beside the compiled
    passes: a later start on them reads them instead of timing again."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    timings = []
    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: timings.append(timed) or speed)
    monkeypatch.setattr(plan, "compiled_costs", lambda pair: timings.append("costs") or KEPT)
    for _start in range(2):
        pair = load_pair(target, draft, "cpu", "float32", compiled="off")
        pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
        plan.choose_drafts(pair, lambda line: None)
        assert pair.runtime.drafts == drafts and pair.runtime.tree_speed == speed
        assert f"drafts: {drafts} (trees decode at {speed:.2f}× the chains' speed here)" in str(pair.runtime)
        steps = {"c": 0.3, "r": 0.1, "v": {1: 1.05, 2: 1.2}}
        assert pair.costs == {"c": 0.25, "r": 0.05, "v": {1: 1.1, 2: 1.3}, "steps": steps}
    assert len(timings) == 2  # the costs and the trees, once


PASSES = {key: COSTS[key] for key in ("c", "r", "v")}
DAMAGED = {  # kept timings' "costs"
    "an earlier version's": PASSES,
    "steps cut short": {**PASSES, "steps": {"c": 0.3}},
    "steps null": {**PASSES, "steps": None},
    "a null cost": {**COSTS, "steps": {**STEPS, "r": None}},
    "a string": {**COSTS, "steps": {**STEPS, "c": "fast"}},
    "a length not a number": {**COSTS, "steps": {**STEPS, "v": {"one": 1.05}}},
    "a step timed over nothing": {**COSTS, "steps": {**STEPS, "v": {"1": float("inf")}}},
    "a pass's cost damaged": {**COSTS, "v": {"1": None}},
    "not a mapping": [0.3, 0.1],
}


@pytest.mark.parametrize("old", DAMAGED.values(), ids=DAMAGED.keys())
def test_kept_costs_without_whole_steps_are_timed_again(tmp_path, monkeypatch, old):
    """Timings kept without whole steps' costs, which the draft length weighs (an earlier version's), or
    with any of them damaged, are timed again once, and kept; the trees' kept speed is not timed again."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    timings = []
    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: timings.append("trees") or 1.0)
    monkeypatch.setattr(plan, "compiled_costs", lambda pair: timings.append("costs") or KEPT)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    plan.tree_timing_path(pair).parent.mkdir(parents=True, exist_ok=True)
    plan.tree_timing_path(pair).write_text(json.dumps({"tree_speed": 1.0, "costs": old}))
    for _start in range(2):
        plan.choose_drafts(pair, lambda line: None)
        assert pair.costs["steps"]["c"] == 0.3 and pair.costs["steps"]["v"] == {1: 1.05, 2: 1.2}
    assert timings == ["costs"]


def test_the_costs_are_timed_on_the_passes_the_pair_decodes_on(tmp_path, monkeypatch):
    """c and v[N] are timed on the passes the pair decodes on now (here eager, as a pair without compiled
    passes runs): a pair whose draft steps cost more gets a larger c."""
    target, draft = save_tiny_pair(tmp_path)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    costs = plan.compiled_costs(pair)
    assert costs["c"] > 0 and costs["r"] >= 0 and sorted(costs["v"]) == [1, 2, 3, 4, 5, 6]
    propose = StandaloneDraft.propose

    def slower(self, sequence, n, *args, **kwargs):  # each drafted token 10 ms more
        time.sleep(0.01 * n)
        return propose(self, sequence, n, *args, **kwargs)

    monkeypatch.setattr(StandaloneDraft, "propose", slower)
    assert plan.compiled_costs(pair)["c"] > costs["c"] + 0.5


def test_timings_taken_beside_a_busy_core_serve_this_start_and_are_not_kept(tmp_path, monkeypatch):
    """Where decodes ran on fewer threads while the costs were timed (another process on a core), the pair
    decodes on them now but they are not kept: the next start times them again."""
    from diversed_demo.common.threads import THREADS

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)

    def busy(pair):
        monkeypatch.setattr(THREADS, "fewer_s", THREADS.fewer_s + 1.5)
        return KEPT

    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: 1.0)
    monkeypatch.setattr(plan, "compiled_costs", busy)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    lines = []
    plan.choose_drafts(pair, lines.append)
    assert pair.costs == KEPT and pair.runtime.drafts == "chains"
    assert "another process kept a core busy" in lines[0] and not plan.tree_timing_path(pair).exists()
