"""Where the app opens: the first example at its task's head card settings, and the draft length that pays
on this machine."""

from __future__ import annotations

import json

import pytest
from conftest import CPU_COSTS, shipped_heads, ui_examples

from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.runtime import theory
from diversed_demo.ui import opening, runs

FREE_COSTS = {"c": 0.0, "v": {n: 1.0 for n in range(1, 7)}}  # drafting and extra tokens free


@pytest.fixture(scope="module")
def card():
    """The card of the head the first example's task opens with (summarization, greedy)."""
    return json.loads(HEADS_DIR.joinpath("summarization-greedy.json").read_text())


@pytest.fixture(scope="module")
def carded():
    """Where the app opens with the shipped heads and their cards."""
    return opening.arrival_defaults(ui_examples(), shipped_heads())


@pytest.fixture
def uncarded(tmp_path):
    """Where the app opens on another pair, whose one head has no card."""
    return opening.arrival_defaults(ui_examples(), {"x": tmp_path / "x.safetensors"})


def test_the_app_opens_on_the_first_example_in_diversed(carded):
    assert carded.example_index == 0 and carded.settings.mode == "dynamic"


def test_the_app_opens_greedy_with_the_first_tasks_greedy_head(carded, card):
    assert carded.settings.head_name == "summarization-greedy"
    assert card["frontier"]["settings"]["temperature"] == 0  # that head was measured greedily


def test_the_app_opens_at_the_settings_its_head_was_measured_at(carded, card):
    measured = card["frontier"]["settings"]
    assert (carded.settings.n_draft, carded.settings.temperature, carded.settings.max_new_tokens) == (
        measured["n_draft"],
        measured["temperature"],
        measured["max_new_tokens"],
    )


def test_the_app_opens_at_the_heads_mean_w_to_the_sliders_step(carded, card):
    assert carded.settings.ensemble_weight == round(card["frontier"]["head_point"]["mean_w"] * 20) / 20


def test_why_the_app_opens_so_gives_the_cards_verdict(carded, card):
    assert ("not beyond" in carded.why) != bool(card["frontier"]["beyond_frontier"])


def test_the_opening_note_says_the_head_was_measured_at_that_n(carded, card):
    n_draft = card["frontier"]["settings"]["n_draft"]
    measured = f"N = {n_draft} unticked, as the summarization-greedy head was measured"
    assert carded.note == f"Opened with N chosen step by step ({measured})."


def test_without_cards_the_app_opens_the_static_ensemble_with_the_pairs_head(uncarded):
    assert uncarded.settings.mode == "static" and uncarded.settings.head_name == "x"


def test_without_cards_the_app_says_its_settings_are_not_measured(uncarded):
    assert uncarded.note == "Opened at the decoder's defaults." and "has a frontier card" in uncarded.why


@pytest.mark.parametrize("costs, fastest", [(CPU_COSTS, lambda n: n <= 2), (FREE_COSTS, lambda n: n == 6)])
def test_the_app_opens_at_the_draft_length_that_pays_on_this_machine(pair, monkeypatch, costs, fastest):
    """The opening N maximises the analytic speedup at the example's measured acceptance with the measured
    costs: short where a pass over more tokens costs much more (a 2-core CPU), long where it is free."""
    monkeypatch.setattr(opening, "measure_costs", lambda *args, **kwargs: costs)
    examples = ui_examples()
    start = opening.arrival_defaults(examples, {})
    opened = opening.opening_draft_length(pair, examples, start)
    assert fastest(opened.settings.n_draft)
    fixed = f"N = {opened.settings.n_draft} unticked, the fastest fixed N here"
    assert opened.note == f"Opened with N chosen step by step ({fixed})."
    assert opened.why.startswith(start.why)
    assert f"N = {opened.settings.n_draft}, not {start.settings.n_draft}," in opened.why
    assert opened.settings == start.settings.replace(n_draft=opened.settings.n_draft)


def test_the_measured_draft_length_is_the_fastest_for_the_slowest_mode_at_the_costs_timed_on_the_pair(
    pair, monkeypatch
):
    """Timed for real on the pair: the opening N is the one where the analytic bound of the slower of the
    opening mode and exact SD (at the acceptance of each's short decode of the example) is largest, since
    Compare runs both at that N."""
    seen = {}

    def spy(name, fn):
        def recorded(*args, **kwargs):
            seen[name] = fn(*args, **kwargs)
            return seen[name]

        monkeypatch.setattr(opening, name, recorded)

    spy("measure_costs", opening.measure_costs)
    spy("choose_n_draft", opening.choose_n_draft)
    examples = ui_examples()
    opened = opening.opening_draft_length(pair, examples, opening.arrival_defaults(examples, {}))
    costs, chosen = seen["measure_costs"], seen["choose_n_draft"]
    assert set(chosen) == {"Static ensemble", "Exact SD"}  # the opening mode (no carded head here), exact SD

    def slowest(n):
        return min(
            theory.analytic_speedup(m["calibration_alpha"], n, costs["c"], costs["v"][n], costs["r"])
            for m in chosen.values()
        )

    assert slowest(opened.settings.n_draft) == max(slowest(n) for n in costs["v"])
    for name, mode in chosen.items():
        assert f"{name} {mode['calibration_alpha']:.2f}" in opened.why


def test_an_opening_head_that_does_not_load_leaves_the_cards_draft_length(pair, monkeypatch):
    from diversed_demo.models.heads import HeadError

    def broken(*args, **kwargs):
        raise HeadError("heads/x.safetensors: weights do not match its config")

    monkeypatch.setattr(opening, "load_head", broken)
    start = opening.Defaults(runs.APP_CONFIG.replace(mode="dynamic", head="x"), 0, "settings of x's card")
    assert opening.opening_draft_length(pair, ui_examples(), start) == start


def test_the_costs_timed_when_the_dtype_was_chosen_are_not_timed_again(pair, monkeypatch):
    import dataclasses

    figures = {"c": 0.0, "v": {str(n): 1.0 for n in range(1, 7)}, "tokens_per_second": 50.0}  # as cached
    choice = {"dtype": "float32", "alpha": 0.6, "cpu": "AVX2", "figures": {"float32": figures}}
    from diversed_demo.runtime.plan import chosen_costs

    chosen = dataclasses.replace(pair, dtype_choice=choice, costs=chosen_costs(choice))
    monkeypatch.setattr(opening, "measure_costs", lambda *a, **k: pytest.fail("timed again"))
    examples = ui_examples()
    opened = opening.measured_opening(chosen, examples)
    assert opened.settings.n_draft == 6  # free extra tokens: the longest draft
    assert (
        opened.note
        == "Opened with N chosen step by step (N = 6 unticked, the fastest fixed N here), in float32."
    )
    assert "The models run in float32: the fastest here" in opened.why


def test_a_servers_first_start_opens_at_the_cards_draft_length_without_timing(pair, monkeypatch):
    """Nothing is timed before a first start's page (runtime/dtype_choice.py): the card's N, said so."""
    import dataclasses

    choice = {"dtype": "bfloat16", "alpha": None, "cpu": "AVX512", "figures": {}}
    first = dataclasses.replace(pair, dtype_choice={**choice, "untimed": ["bfloat16", "float32"]}, costs=None)
    monkeypatch.setattr(opening, "measure_costs", lambda *a, **k: pytest.fail("timed"))
    monkeypatch.setattr(opening, "choose_n_draft", lambda *a, **k: pytest.fail("decoded"))
    start = opening.Defaults(runs.APP_CONFIG.replace(mode="exact", n_draft=3), 0, "the card's settings")
    opened = opening.opening_draft_length(first, ui_examples(), start)
    assert (
        opened.settings == start.settings and "as the card's: timed on this machine at the next" in opened.why
    )
    timed = dataclasses.replace(first, dtype_choice=choice)  # a later start times them
    with pytest.raises(pytest.fail.Exception, match="timed"):
        opening.opening_draft_length(timed, ui_examples(), start)


def test_compare_opens_where_its_slowest_mode_is_fastest():
    diversed = {"bounds": {1: 1.20, 2: 1.50, 3: 1.60}}  # accepts much: the longest draft
    exact = {"bounds": {1: 1.10, 2: 1.05, 3: 0.90}}  # accepts little: the shortest
    assert opening.slowest_mode_fastest({"DIVERSED": diversed}) == 3
    assert opening.slowest_mode_fastest({"DIVERSED": diversed, "Exact SD": exact}) == 1


def rule_report(tmp_path, kinds: dict[str, str], quality: float = 0.1, greedy_exact: float = 0.1):
    """A shipped evaluation of the rule (results/rule/'s form) with each λ's verdict kind and its task score,
    and the greedy one's exact SD score: ({task: path}, {task: greedy path})."""
    report = {
        "examples": 100,
        "points": [
            {"point": label, "acceptance": 0.3 + 0.1 * i, "quality": quality} for i, label in enumerate(kinds)
        ],
        "rules": {
            label: {"verdict": {"kind": kind, "text": f"{kind} the frontier"}}
            for label, kind in kinds.items()
        },
    }
    path, greedy = tmp_path / "summarization-spec_bench-T1.json", tmp_path / "summarization-greedy.json"
    path.write_text(json.dumps(report))
    exact = {"point": "static:1", "w": 1.0, "acceptance": 0.3, "quality": greedy_exact}
    greedy.write_text(json.dumps({"points": [exact]}))
    return {"summarization": path}, {"summarization": greedy}


def test_the_app_opens_on_the_rule_at_t1_where_its_evaluation_put_it_beyond_the_frontier(tmp_path):
    start = opening.Defaults(runs.APP_CONFIG.replace(mode="dynamic", head="x", temperature=0.0), 0, "", "")
    reports = rule_report(tmp_path, {"cost:0.5": "beyond", "cost:2": "beyond", "cost:8": "below"})
    opened = opening.rule_opening(start, "summarization", *reports)
    assert (opened.settings.mode, opened.settings.lam, opened.settings.temperature) == ("cost", 2.0, 1.0)
    assert opened.settings.head == "x"  # Compare still runs the head
    assert "λ = 2" in opened.note and "beyond the frontier" in opened.why and "100 held-out" in opened.why


def test_where_the_rule_was_not_beyond_the_app_opens_as_before_and_says_so(tmp_path):
    start = opening.Defaults(runs.APP_CONFIG.replace(mode="dynamic", head="x", temperature=0.0), 0, "", "")
    reports = rule_report(tmp_path, {"cost:2": "unresolved"})
    opened = opening.rule_opening(start, "summarization", *reports)
    assert opened.settings == start.settings and "not beyond the static frontier" in opened.why
    assert opening.rule_opening(start, "code", *reports) == start  # no evaluation of the task: unchanged


def test_where_the_text_at_t1_scores_below_greedy_the_app_stays_greedy_and_says_why(tmp_path):
    # The small target's T = 1 summaries score far below its greedy ones: beyond the frontier at T = 1
    # is no first screen.
    start = opening.Defaults(runs.APP_CONFIG.replace(mode="dynamic", head="x", temperature=0.0), 0, "", "")
    reports = rule_report(tmp_path, {"cost:5": "beyond"}, quality=0.035, greedy_exact=0.12)
    opened = opening.rule_opening(start, "summarization", *reports)
    assert opened.settings == start.settings and opened.note == start.note
    assert "beyond the frontier" in opened.why and "0.035" in opened.why and "0.120" in opened.why
    assert "opens greedy" in opened.why


def test_the_settings_fold_says_how_the_pair_runs_at_this_moment(pair):
    """What the runtime builds while the app serves lands between decodes: the fold, drawn again at each page
    load, says what runs now, not what ran at the start."""
    from dataclasses import replace

    start = opening.Defaults(runs.APP_CONFIG, 0, "Opened here.", "The card's settings.")
    opened = pair.runtime
    try:
        pair.runtime = replace(opened, passes="eager while the compiled ones are built")
        assert "passes: eager while the compiled ones are built · drafts: chains." in opening.settings_why(
            pair, start
        )
        pair.runtime = replace(opened, passes="compiled: target and draft", drafts="trees", tree_speed=1.1)
        why = opening.settings_why(pair, start)
        assert why.startswith("The card's settings.") and "passes: compiled: target and draft" in why
        assert why.endswith("drafts: trees (trees decode at 1.10× the chains' speed here).")
    finally:
        pair.runtime = opened
