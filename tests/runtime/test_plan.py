"""runtime/plan.py: `load_pair` hands each caller a pair of its own; choosing drafts never fails a decode."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from tiny import save_tiny_pair

from diversed_demo.core.draft import StandaloneDraft
from diversed_demo.runtime import costs, plan
from diversed_demo.runtime.plan import load_pair
from diversed_demo.runtime.static_pass import StaticPass

HOST = {"target_ms": 10.0, "wide": 1.1}  # what the passes cost, as `pass_check` reads them


@pytest.fixture(autouse=True)
def steady_host(monkeypatch):
    """Every start here looks at the same host (the fake passes cannot run), unless a test moves it."""
    monkeypatch.setattr(plan, "pass_check", lambda pair, prompt_ids: dict(HOST))


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
    plan.tree_timing_path(pair).write_text(json.dumps({"tree_speed": 1.0, "costs": old, "check": HOST}))
    for _start in range(2):
        plan.choose_drafts(pair, lambda line: None)
        assert pair.costs["steps"]["c"] == 0.3 and pair.costs["steps"]["v"] == {1: 1.05, 2: 1.2}
    assert timings == ["costs"]


MOVED = {  # the host a later start looks at: (its check, whether the kept timings are timed again)
    "a slower one-token pass": ({"target_ms": 10.0 * (1 + costs.HOST_DRIFT + 0.05)}, True),
    "a faster one-token pass": ({"target_ms": 10.0 * (1 - costs.HOST_DRIFT - 0.05)}, True),
    "a wide pass dearer": ({"wide": 1.1 + costs.WIDE_DRIFT + 0.03}, True),
    "within the check's noise": (
        {"target_ms": 10.0 * (1 + costs.HOST_DRIFT - 0.05), "wide": 1.1 - costs.WIDE_DRIFT + 0.03},
        False,
    ),
}


@pytest.mark.parametrize("moved, again", MOVED.values(), ids=MOVED.keys())
def test_kept_timings_serve_only_a_host_whose_passes_cost_what_they_did(tmp_path, monkeypatch, moved, again):
    """The same CPU on another host (a VM moved, busier neighbours) prices the passes otherwise: there the
    kept costs and trees' speed are timed again, said so, and kept with that host's check; within the
    check's noise they serve as kept."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    timings = []
    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: timings.append("trees") or 1.0)
    monkeypatch.setattr(plan, "compiled_costs", lambda pair: timings.append("costs") or KEPT)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    plan.choose_drafts(pair, lambda line: None)  # a first start times both
    host, lines = {**HOST, **moved}, []
    monkeypatch.setattr(plan, "pass_check", lambda pair, prompt_ids: dict(host))
    plan.choose_drafts(pair, lines.append)
    assert timings == ["costs", "trees"] * (2 if again else 1)
    assert any("kept timings are timed again (a " in line for line in lines) == again
    assert json.loads(plan.tree_timing_path(pair).read_text())["check"] == (host if again else HOST)
    plan.choose_drafts(pair, lambda line: None)  # the next start on that host reads what was kept
    assert len(timings) == (4 if again else 2)


def scaled(costs: dict, factor: float) -> dict:
    """Costs as a pair keeps them with every figure above a pass's (and every step's) times `factor`."""

    def part(c: dict) -> dict:
        v = {n: 1 + (v_n - 1) * factor for n, v_n in c["v"].items()}
        return {"c": c["c"] * factor, "r": c["r"] * factor, "v": v}

    return part(costs) | {"steps": part(costs["steps"])}


def test_one_timing_in_a_slow_spell_does_not_price_every_step_alone(tmp_path, monkeypatch):
    """Timed again at each start where the host's check moved, the pair weighs each figure's median over the
    last TIMINGS_KEPT timings: one timing far above its neighbours (a spell of the host's other work, which
    on Zen 3 stopped a head from drafting at all) is outvoted, a host that stays dearer is followed at the
    next start, and the oldest timing is dropped. With the newest timing alone (the mutation), the pair
    weighs the spell's."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    factors = iter([1.0, 1.2, 3.0, 3.0, 3.0])
    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: 1.0)
    monkeypatch.setattr(plan, "compiled_costs", lambda pair: scaled(KEPT, next(factors)))
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    weighed = []
    for start in range(5):
        host = {**HOST, "target_ms": HOST["target_ms"] * (1 + start % 2)}  # every start's check moved
        monkeypatch.setattr(plan, "pass_check", lambda pair, prompt_ids, host=host: dict(host))
        plan.choose_drafts(pair, lambda line: None)
        weighed.append(pair.costs)
    assert weighed[1] == plan.median_costs([KEPT, scaled(KEPT, 1.2)])
    assert weighed[2] == scaled(KEPT, 1.2)  # the spell's 3× outvoted by the two before it
    assert weighed[3] == scaled(KEPT, 3.0)  # a host that stays dearer is followed
    kept = json.loads(plan.tree_timing_path(pair).read_text())
    assert len(kept["history"]) == plan.TIMINGS_KEPT and plan.kept_costs(kept["costs"]) == weighed[4]


def test_kept_timings_without_a_check_of_their_host_are_timed_again_once(tmp_path, monkeypatch):
    """An earlier version's timings (kept without the check) are timed again, and then kept with it."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    timings, lines = [], []
    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: timings.append("trees") or 1.0)
    monkeypatch.setattr(plan, "compiled_costs", lambda pair: timings.append("costs") or KEPT)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    plan.tree_timing_path(pair).parent.mkdir(parents=True, exist_ok=True)
    plan.tree_timing_path(pair).write_text(json.dumps({"tree_speed": 1.0, "costs": COSTS}))
    for _start in range(2):
        plan.choose_drafts(pair, lines.append)
    assert timings == ["costs", "trees"] and "no check of the host was kept with them" in lines[0]


def test_the_costs_are_timed_on_the_passes_the_pair_decodes_on(tmp_path, monkeypatch):
    """c and v[N] are timed on the passes the pair decodes on now (here eager, as a pair without compiled
    passes runs): a pair whose draft steps cost more gets a larger c."""
    target, draft = save_tiny_pair(tmp_path)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    timed = plan.compiled_costs(pair)
    assert timed["c"] > 0 and timed["r"] >= 0 and sorted(timed["v"]) == [1, 2, 3, 4, 5, 6]
    propose = StandaloneDraft.propose

    def slower(self, sequence, n, *args, **kwargs):  # each drafted token 10 ms more
        time.sleep(0.01 * n)
        return propose(self, sequence, n, *args, **kwargs)

    monkeypatch.setattr(StandaloneDraft, "propose", slower)
    assert plan.compiled_costs(pair)["c"] > timed["c"] + 0.5


def test_the_hosts_check_reads_the_passes_the_pair_decodes_on(tmp_path, monkeypatch):
    """`pass_check` times the pair's own passes: where a one-token pass costs 20 ms more (a slower host), it
    reads it, and the kept timings are found not to describe that host."""
    from diversed_demo.core.cache import CachedLM

    target, draft = save_tiny_pair(tmp_path)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    prompt = list(range(5, 40))
    before = costs.pass_check(pair, prompt)
    assert before["target_ms"] > 0 and before["wide"] > 0 and costs.host_change(before, before) is None
    forward = CachedLM.forward

    def slower(self, tokens, keep, rows=None):
        time.sleep(0.02 if tokens.numel() == 1 else 0)
        return forward(self, tokens, keep, rows)

    monkeypatch.setattr(CachedLM, "forward", slower)
    after = costs.pass_check(pair, prompt)
    assert after["target_ms"] > before["target_ms"] + 15
    assert "a one-token pass takes" in costs.host_change(before, after)


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


def test_a_servers_start_serves_its_page_on_the_kept_timings_and_checks_them_after(tmp_path, monkeypatch):
    """A server's start on built passes (load_pair's serve_first) checks the kept timings only once its page
    is up (`after_serving`): until then its decodes weigh the kept costs and draft as kept, and nothing is
    timed (timing them again took 8 of a 23 s start on a Zen 4 host whose speed drifts); then the check runs,
    on the model thread, and times them again where the host moved."""
    from diversed_demo.runtime.model_thread import MODEL_THREAD

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    target, draft = save_tiny_pair(tmp_path)
    timings, checks = [], []
    monkeypatch.setattr(plan, "tree_speed", lambda timed, prompts: timings.append("trees") or 1.2)
    monkeypatch.setattr(plan, "compiled_costs", lambda pair: timings.append("costs") or KEPT)
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    plan.choose_drafts(pair, lambda line: None)  # an earlier start timed and kept them
    moved = {**HOST, "target_ms": 2 * HOST["target_ms"]}
    monkeypatch.setattr(plan, "pass_check", lambda pair, prompt_ids: checks.append(1) or dict(moved))
    timings.clear()
    pair = load_pair(target, draft, "cpu", "float32", compiled="off")
    pair.target_pass = SimpleNamespace(module=object.__new__(StaticPass))
    pair.runtime.serving_first = True
    MODEL_THREAD.call(plan.choose_drafts, pair, lambda line: None)
    assert (timings, checks) == ([], []) and pair.runtime.drafts == "trees" and pair.costs is not None
    MODEL_THREAD.call(plan.after_serving, pair)
    assert timings == ["costs", "trees"] and checks == [1] and pair.runtime.later == []
