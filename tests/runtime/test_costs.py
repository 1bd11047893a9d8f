"""runtime/costs.py: trees are timed against chains both ways, alternating; whole steps price drafting as
decodes measured it."""

from __future__ import annotations

import time

from diversed_demo.runtime import costs


def test_trees_are_timed_against_chains_alternating_after_a_warm_decode_of_each(monkeypatch):
    """Each prompt decoded `rounds` times each way, chains and trees taking turns (a burst of load slows
    both alike), greedy exact SD, after one untimed decode of each; the ratio of the best times."""
    decoded, now = [], [0.0]
    seconds = {"off": 2.0, "on": 1.0}  # the trees' decodes take half as long here

    def fake_generate(pair, prompt, config):
        decoded.append((prompt, config.tree, config.mode, config.temperature))
        now[0] += seconds[config.tree]

    monkeypatch.setattr(costs, "generate", fake_generate)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: now[0])
    speed = costs.tree_speed(object(), ["a", "b"], rounds=2)
    assert speed == 2.0
    assert [(prompt, tree) for prompt, tree, *_ in decoded] == [
        ("a", "off"), ("a", "on"),  # untimed
        ("a", "off"), ("a", "on"), ("a", "off"), ("a", "on"),
        ("b", "off"), ("b", "on"), ("b", "off"), ("b", "on"),
    ]  # fmt: skip
    assert {(mode, temperature) for _, _, mode, temperature in decoded} == {("exact", 0)}


def test_whole_steps_price_a_drafting_step_as_decodes_measured_it():
    """c, r and v as whole steps price them give back the steps measured at both draft lengths, in target-only
    steps; drafting's own costs bound c and r from below."""
    steps = {0: {"ms": 10.0}, 1: {"ms": 13.0, "drafted": 1.0}, 4: {"ms": 20.0, "drafted": 3.5}}
    verify_ms = {1: 9.0, 2: 10.0, 3: 11.0, 4: 12.0}  # a one-token pass: 8 ms of the step's 10
    priced = costs.step_costs(steps, verify_ms, target_ms=8.0, draft=(0.5, 0.1))
    assert priced["v"] == {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}
    for n in (1, 4):
        drafted = steps[n]["drafted"]
        modelled = priced["r"] + drafted * priced["c"] + costs.pass_ratio(priced["v"], drafted)
        assert abs(modelled - steps[n]["ms"] / 10.0) < 1e-9
    assert costs.pass_ratio(priced["v"], 3.5) == 1.35 and costs.pass_ratio(priced["v"], 9.0) == 1.4
    dear = costs.step_costs(steps, verify_ms, target_ms=8.0, draft=(5.0, 3.0))
    assert (dear["c"], dear["r"]) == (0.5, 0.3)


def test_a_decision_that_costs_more_a_position_is_priced_into_whole_steps(monkeypatch):
    """A pair whose verification takes 3 ms more a drafted position: its whole steps' c grows by about that
    (a tenth of a target-only step here at least), while drafting's own c does not."""
    from tiny import tiny_pair

    from diversed_demo.core import decode

    pair = tiny_pair()
    prompt = pair.tokenizer.encode("a b c d e f")
    plain = costs.measure_costs(pair, prompt, [1, 2, 3, 4, 5], rounds=3, calls=4, draft_tokens=24, steps=True)
    verify = decode.verify_step

    def slower(scored, fed, draft_tokens, *args):
        time.sleep(0.003 * len(draft_tokens))
        return verify(scored, fed, draft_tokens, *args)

    monkeypatch.setattr(decode, "verify_step", slower)
    slowed = costs.measure_costs(
        pair, prompt, [1, 2, 3, 4, 5], rounds=3, calls=4, draft_tokens=24, steps=True
    )
    unit_ms = plain["target_ms"]
    assert slowed["steps"]["c"] > plain["steps"]["c"] + 0.5 * 3.0 / max(unit_ms, 3.0)
    assert slowed["c"] < plain["c"] + 0.5 * 3.0 / max(unit_ms, 3.0)
