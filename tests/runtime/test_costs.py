"""runtime/costs.py: timing trees against chains decodes the same prompts both ways, alternating."""

from __future__ import annotations

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
