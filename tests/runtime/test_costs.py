"""runtime/costs.py: trees are timed against chains both ways, alternating; whole steps price drafting as
decodes measured it."""

from __future__ import annotations

import time

import pytest

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
    steps; c and r are drafting's own, and what a step pays besides goes to its positions' v."""
    steps = {0: {"ms": 10.0}, 1: {"ms": 13.0, "drafted": 1.0}, 4: {"ms": 20.0, "drafted": 3.5}}
    verify_ms = {1: 9.0, 2: 10.0, 3: 11.0, 4: 12.0}  # a one-token pass: 8 ms of the step's 10
    priced = costs.step_costs(steps, verify_ms, target_ms=8.0, draft=(0.5, 0.1))
    assert (priced["c"], priced["r"]) == (0.05, 0.01)
    for n in (1, 4):
        drafted = steps[n]["drafted"]
        modelled = priced["r"] + drafted * priced["c"] + costs.pass_ratio(priced["v"], drafted)
        assert modelled == pytest.approx(steps[n]["ms"] / 10.0)
    # each position: the pass's 0.1 a token, and what the fit prices a drafted token above its drafting
    places = [priced["v"][n + 1] - priced["v"][n] for n in (1, 2, 3)]
    assert places == pytest.approx([0.1 + 0.18 - 0.05] * 3)
    dear = costs.step_costs(steps, verify_ms, target_ms=8.0, draft=(5.0, 3.0))
    assert (dear["c"], dear["r"]) == (0.5, 0.3)  # drafting dearer than the fit: the pass's v alone
    assert dear["v"] == pytest.approx({1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4})


UNPRICEABLE = {  # (steps at N = 0, 1 and 4, verify_ms, why)
    "drafted alike": ({"ms": 10.0}, {"ms": 13.0, "drafted": 1.0}, {"ms": 13.0, "drafted": 1.2}, 9.0),
    "no time": ({"ms": 0.0}, {"ms": 13.0, "drafted": 1.0}, {"ms": 20.0, "drafted": 3.5}, 9.0),
    "no machine": ({"ms": 10.0}, {"ms": 13.0, "drafted": 1.0}, {"ms": 20.0, "drafted": 3.5}, float("nan")),
}


@pytest.mark.parametrize("why", UNPRICEABLE)
def test_whole_steps_that_cannot_be_priced_raise_instead_of_being_kept(why):
    """Two draft lengths that drafted alike give no line; target-only steps timed at no time give no unit; a
    pass whose timing is not a number prices nothing: each raises, and the pair is timed again at its next
    start instead of keeping them."""
    *measured, verify = UNPRICEABLE[why]
    steps = dict(zip((0, 1, 4), measured))
    with pytest.raises(costs.CostError, match=why):
        costs.step_costs(steps, {1: verify, 4: verify}, target_ms=8.0, draft=(0.5, 0.1))


@pytest.mark.timed  # compares wall times of a tiny pair: a second worker beside it moves them
def test_a_timing_decodes_steps_on_chains_and_times_them_without_its_setup(monkeypatch):
    """A step's "ms" is the steps' own, from one step's end to the next: a decode's setup (here 0.3 s more)
    is not spread over them; the timing drafts chains whatever trees the runtime chose."""
    from tiny import tiny_pair

    from diversed_demo.core import decode

    pair = tiny_pair()
    prompt = pair.tokenizer.encode("a b c d e f")
    plain = costs.decode_steps(pair, prompt, 2, max_new_tokens=24)
    length, trees = decode.draft_length, []

    def slow_setup(config, pair_costs):
        trees.append(config.tree)
        time.sleep(0.3)
        return length(config, pair_costs)

    monkeypatch.setattr(decode, "draft_length", slow_setup)
    slowed = costs.decode_steps(pair, prompt, 2, max_new_tokens=24)
    assert trees == ["off"] and slowed["ms"] < plain["ms"] + 5.0  # 300 ms over at most 24 steps: 12.5 each


def test_a_decode_too_short_to_time_raises():
    from tiny import tiny_pair

    pair = tiny_pair()
    prompt = pair.tokenizer.encode("a b c d e f")
    assert 0.5 < costs.decode_steps(pair, prompt, 1, max_new_tokens=12)["drafted"] <= 1  # the last: no room
    with pytest.raises(costs.CostError, match="steps to time"):
        costs.decode_steps(pair, prompt, 0, max_new_tokens=3)


@pytest.mark.timed  # compares wall times of a tiny pair: a second worker beside it moves them
def test_a_decision_that_costs_more_a_position_is_priced_into_whole_steps(monkeypatch):
    """A pair whose verification takes 3 ms more a drafted position: what whole steps price a position grows
    by about that (a tenth of a target-only step here at least), while drafting's own c does not."""
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
    place = lambda measured: (measured["steps"]["v"][5] - measured["steps"]["v"][1]) / 4  # noqa: E731
    assert place(slowed) > place(plain) + 0.5 * 3.0 / slowed["steps"]["unit_ms"]  # in target-only steps
    assert slowed["c"] < plain["c"] + 0.5 * 3.0 / plain["target_ms"]  # in one-token passes


def test_the_median_of_kept_timings_takes_each_figure_apart_and_the_lengths_all_measured():
    """Each figure its median over the timings (whole steps' too); v[N] only where every timing measured N,
    rising with N as each timing's does."""
    from diversed_demo.runtime.costs import median_costs

    def timing(c, v1, v2, v3=None):
        v = {1: v1, 2: v2} | ({3: v3} if v3 else {})
        return {"c": c, "r": c / 2, "v": v, "steps": {"c": c, "r": c, "v": {1: v1 + 0.1, 2: v2 + 0.1}}}

    middle = median_costs([timing(0.1, 1.1, 1.3, 1.5), timing(0.5, 1.4, 1.6), timing(0.2, 1.2, 1.35, 1.7)])
    assert middle["c"] == 0.2 and middle["r"] == 0.1 and middle["v"] == {1: 1.2, 2: 1.35}
    assert middle["steps"] == {"c": 0.2, "r": 0.2, "v": {1: pytest.approx(1.3), 2: pytest.approx(1.45)}}
