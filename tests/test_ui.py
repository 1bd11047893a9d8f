"""The app's logic without a browser: rendering, live run state, compare, the dial and the shipped figures,
traces, the training job, and the handlers themselves (module-level functions of diversed_demo.ui.app)."""

from __future__ import annotations

import json
import math
import threading

import gradio as gr
import pandas as pd
import pytest

from diversed_demo.core.events import TokenEvent
from diversed_demo.core.generate import generate
from diversed_demo.core.stats import Summary
from diversed_demo.eval.tasks import TASKS, Example
from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import app, render, results, runs, trace

PROMPT = "the cat sat on"
SHIPPED_HEADS = {path.stem: path for path in sorted(HEADS_DIR.glob("*.safetensors"))}
EXAMPLES = [
    Example(
        "Summarize: the council voted for a park.", "summarization", "The council approved a park.", "t/s0"
    ),
    Example("Tom has 3 boxes of 12. He gives 10 away. How many are left?", "math", "#### 26", "t/m0"),
    Example("Give me three tips for sleeping better.", "general", id="t/g0"),
]


def event(kind="accepted", text=" cat", w=0.5, p=0.2, q=0.4, accept_prob=0.75, step=1, token_id=5):
    return TokenEvent(token_id, text, kind, step, w=w, p=p, q=q, accept_prob=accept_prob)


def settings(**overrides):
    return runs.DecodeSettings(
        **{
            "mode": "static",
            "ensemble_weight": 0.5,
            "n_draft": 3,
            "max_new_tokens": 24,
            "temperature": 1.0,
            "seed": 3,
            **overrides,
        }
    )


def no_progress(*_args, **_kwargs):
    pass


@pytest.fixture
def heads_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_HEADS_DIR", str(tmp_path / "heads"))
    return tmp_path / "heads"


@pytest.fixture
def saved_head(pair, heads_dir):
    """A freshly initialised head for the tiny pair, saved in the user heads folder: its name."""
    from diversed_demo.models.heads import new_head, save_head

    save_head(new_head(pair), heads_dir / "fresh.safetensors")
    return "fresh"


# ---------------------------------------------------------------- rendering


def test_token_html_escapes_text_and_carries_the_numbers_in_its_tooltip():
    html = render.render_token(event(text='<b>"&'))
    assert "&lt;b&gt;&quot;&amp;" in html and "<b>" not in html
    assert 'class="dd-tok dd-accepted"' in html
    assert "w_t = 0.500" in html and "p(x) = 0.200" in html and "q(x) = 0.400" in html
    assert "acceptance probability = 0.750" in html


def test_newlines_stay_visible_and_break_the_line():
    html = render.render_token(event(text="a\nb"))
    assert '<span class="dd-nl">↵</span>\nb' in html


def test_tokens_without_a_draft_say_so():
    title = render.token_title(event(kind="bonus", w=None, q=None, accept_prob=None))
    assert "bonus" in title and "w_t = n/a (no draft here)" in title and "acceptance" not in title


def test_every_fate_has_a_class_a_legend_entry_and_a_colour():
    legend = render.legend_html()
    css = app.CSS_PATH.read_text()
    for kind in ("accepted", "rejected", "resampled", "bonus", "ar"):
        assert f"dd-{kind}" in legend and kind in render.KIND_COLORS
        assert f".dd-{kind}" in css
    assert "line-through" in css.split(".dd-rejected")[1].split("}")[0]
    assert ".dd-departs" in css


def test_empty_output_shows_a_placeholder():
    assert "dd-empty" in render.render_tokens([])


def test_the_departure_mark_lands_on_the_output_token_not_on_a_rejected_draft():
    events = [
        event("accepted", "a", token_id=1),
        event("rejected", "b", token_id=2),
        event("resampled", "c", token_id=3),
        event("bonus", "d", token_id=4),
    ]
    html = render.render_tokens(events, departs_at=1)  # output tokens: a, c, d
    marked = [part for part in html.split("<span ") if "dd-departs" in part]
    assert len(marked) == 1 and marked[0].endswith(">c</span>") and "departs from target-only" in marked[0]


def test_one_number_formatter():
    assert render.fmt(None) == render.fmt(math.nan) == "n/a"
    assert render.fmt(0.12345) == "0.123" and render.fmt(0.5, ".0%") == "50%"


# ---------------------------------------------------------------- decoding runs


@pytest.mark.parametrize("mode", ["ar", "exact", "static"])
def test_live_statistics_agree_with_the_decoders_summary(pair, mode):
    states = list(runs.stream_decode(pair, PROMPT, settings(mode=mode)))
    run = states[-1]
    assert run.done and all(state is run for state in states)
    summary = run.summary
    counts = run.counts
    assert (counts.new_tokens, counts.drafted, counts.accepted, counts.target_passes) == (
        summary.new_tokens,
        summary.drafted,
        summary.accepted,
        summary.target_passes,
    )
    assert len(run.elapsed_per_token) == len(run.acceptance_per_token) == summary.new_tokens
    # Same events as the CLI's plain generate().
    expected, events = generate(
        pair, PROMPT, mode=mode, ensemble_weight=0.5, n_draft=3, max_new_tokens=24, seed=3
    )
    assert [e.token_id for e in run.events] == [e.token_id for e in events]
    assert summary.token_ids == expected.token_ids


def test_live_statistics_before_the_summary_use_the_summarys_accounting(pair):
    stream = runs.stream_decode(pair, PROMPT, settings(max_new_tokens=40))
    run = next(stream)
    assert not run.done and run.counts.target_passes == 1 and run.elapsed_s > 0
    assert run.tau == run.counts.new_tokens and run.acceptance_rate == run.counts.acceptance_rate
    html = render.stats_html(run)
    assert 'data-state="running"' in html and 'data-w="0.5"' in html
    stream.close()


@pytest.mark.parametrize(
    "prompt, message", [("", "empty"), ("   ", "empty"), ("x" * (runs.MAX_PROMPT_CHARS + 1), "at most")]
)
def test_bad_prompts_are_refused_with_a_readable_message(pair, prompt, message):
    with pytest.raises(ValueError, match=message):
        next(runs.stream_decode(pair, prompt, settings()))


def test_diversed_needs_a_head(pair, heads_dir):
    with pytest.raises(ValueError, match="needs a trained head"):
        runs.resolve_head(pair, settings(mode="dynamic"))
    with pytest.raises(ValueError, match="no head"):
        runs.resolve_head(pair, settings(mode="dynamic", head_name="missing"))


def test_a_head_of_another_pair_is_refused(pair, heads_dir):
    from tiny import tiny_pair

    from diversed_demo.models.heads import new_head, save_head

    other = tiny_pair(target_seed=7, draft_seed=8)
    save_head(new_head(other), heads_dir / "other.safetensors")
    assert "other" not in app.head_choices(pair)
    with pytest.raises(ValueError):
        runs.resolve_head(pair, settings(mode="dynamic", head_name="other"))


def test_diversed_run_with_a_saved_head_reports_w(pair, saved_head):
    assert saved_head in app.head_choices(pair)
    run_settings = settings(mode="dynamic", head_name=saved_head)
    *_, run = runs.stream_decode(pair, PROMPT, run_settings, runs.resolve_head(pair, run_settings))
    assert run.mean_w is not None and 0 <= run.mean_w <= 1


def test_throttled_keeps_the_first_and_last_items():
    assert list(runs.throttled(iter(range(100)), interval_s=60)) == [0, 99]
    assert list(runs.throttled(iter(range(5)), interval_s=0)) == [0, 1, 2, 3, 4]
    assert list(runs.throttled(iter([]), interval_s=1)) == []


def test_w_chart_has_a_point_per_verified_draft(pair):
    *_, run = runs.stream_decode(pair, PROMPT, settings())
    figure = render.w_chart(run)
    plotted = sum(len(trace.x) for trace in figure.data)
    assert plotted == sum(e.kind in ("accepted", "rejected") for e in run.events)


def test_one_mode_list():
    from diversed_demo.core.settings import MODES

    assert list(runs.MODE_LABELS.values()) == list(MODES) and runs.COMPARE_MODES == tuple(runs.MODE_LABELS)


# ---------------------------------------------------------------- examples


def test_examples_come_from_the_app_file(monkeypatch):
    examples = app.load_examples()
    assert examples and {e.task for e in examples} >= {"summarization", "math", "code", "general"}
    assert examples[0].task == "summarization" and examples[0].reference  # the file's order: arrival shows it

    def missing():
        raise FileNotFoundError("examples.json")

    monkeypatch.setattr(app, "app_examples", missing)
    assert app.load_examples() == []


def test_find_example_ignores_whitespace_changes():
    example = EXAMPLES[0]
    assert app.find_example("  " + example.prompt.replace(" ", "\n", 1), EXAMPLES) is example
    assert app.find_example("something typed", EXAMPLES) is None
    labels = [label for label, _ in app.example_choices(EXAMPLES)]
    assert labels[0].startswith("[summarization] ") and len(labels[0]) < 90


# ---------------------------------------------------------------- compare


def test_comparison_runs_each_mode_and_tabulates(pair):
    states = list(runs.stream_comparison(pair, PROMPT, settings()))
    comparison = states[-1]
    assert list(comparison.runs) == ["Target only", "Exact SD", "Static ensemble"]
    assert comparison.skipped == {"DIVERSED": "no head selected"}
    assert {run.settings.seed for run in comparison.runs.values()} == {3}  # one seed for every mode
    table = app.comparison_table(comparison)
    assert list(table["mode"]) == ["Target only", "Exact SD", "Static ensemble"]
    assert table.loc[0, "speedup ×"] == 1.0 and pd.isna(table.loc[0, "acceptance"])
    assert (table["metric"] == "fidelity").all()  # a typed prompt: no reference
    acceptance, elapsed = render.comparison_charts(comparison)
    assert len(acceptance.data) == 2 and len(elapsed.data) == 3
    assert "no head selected" in render.run_panel_html("DIVERSED", comparison)
    assert "dd-tok" in render.run_panel_html("Exact SD", comparison)


def test_greedy_exact_sd_never_departs_from_target_only_and_a_relaxed_run_is_marked(pair):
    *_, comparison = runs.stream_comparison(pair, PROMPT, settings(temperature=0.0, ensemble_weight=0.0))
    departures = comparison.departures()
    assert departures["Exact SD"] is None  # greedy exact SD is the target's own greedy text
    assert "same tokens as target only" in render.run_panel_html("Exact SD", comparison)
    target = [e.token_id for e in comparison.runs["Target only"].output_events]
    relaxed = [e.token_id for e in comparison.runs["Static ensemble"].output_events]
    at = departures["Static ensemble"]
    assert at is not None and relaxed[:at] == target[:at] and relaxed[at] != target[at]
    assert f"at token {at + 1}" in render.run_panel_html("Static ensemble", comparison)


def test_first_departure():
    assert runs.first_departure([1, 2, 3], [1, 2, 3]) is None
    assert runs.first_departure([1, 5, 3], [1, 2, 3]) == 1
    assert runs.first_departure([1, 2, 3, 4], [1, 2, 3]) == 3  # goes on where the finished reference stopped
    assert runs.first_departure([1, 2, 3, 4], [1, 2, 3], reference_done=False) is None


def finished_run(mode, tokens, seconds, drafted=0, accepted=0, passes=None):
    run = runs.DecodeRun(settings(mode=mode))
    for i, token in enumerate(tokens):
        run.add(event("ar" if mode == "ar" else "accepted", token_id=token, step=i + 1))
    run.summary = Summary(
        "x", len(tokens), passes or len(tokens), drafted, accepted, seconds, token_ids=list(tokens)
    )
    return run


def test_the_verdict_is_derived_from_the_run_and_says_one_prompt_cannot_judge_quality():
    comparison = runs.Comparison()
    comparison.runs = {
        "Target only": finished_run("ar", [1, 2, 3, 4], 2.0),
        "Exact SD": finished_run("exact", [1, 2, 3, 4], 1.6, drafted=8, accepted=2, passes=3),
        "DIVERSED": finished_run("dynamic", [1, 2, 9, 4], 1.0, drafted=8, accepted=6, passes=2),
    }
    comparison.quality = {
        "Target only": (0.10, "ROUGE-2"),
        "Exact SD": (0.10, "ROUGE-2"),
        "DIVERSED": (0.099, "ROUGE-2"),
    }
    verdict = app.compare_verdict(comparison)
    assert "<b>DIVERSED</b>: 2.00× the speed of target only" in verdict
    assert "ROUGE-2 within 1% of exact SD" in verdict and "departs from target only at token 3" in verdict
    assert "One prompt is too few to judge quality" in verdict and 'data-state="done"' in verdict
    comparison.quality["DIVERSED"] = (0.05, "ROUGE-2")
    assert "ROUGE-2 off by 50% below exact SD" in app.compare_verdict(comparison)
    del comparison.runs["DIVERSED"]  # without a head the static ensemble is judged
    assert "<b>Static ensemble</b>" not in app.compare_verdict(comparison)  # … once it has run
    assert 'data-state="running"' in app.compare_verdict(comparison, running=True)


def test_comparison_includes_diversed_with_a_head(pair, saved_head):
    *_, comparison = runs.stream_comparison(pair, PROMPT, settings(head_name=saved_head))
    assert "DIVERSED" in comparison.runs and comparison.runs["DIVERSED"].done


@pytest.mark.parametrize(
    "task, reference, metric",
    [("summarization", "the cat sat on the mat", "ROUGE-2"), ("math", "2 plus 2 is 4\n#### 4", "correct")],
)
def test_quality_uses_the_reference_when_there_is_one(pair, task, reference, metric):
    example = Example(PROMPT, task, reference, "t/0")
    *_, run = runs.stream_decode(pair, PROMPT, settings())
    value, shown_metric = runs.quality_of(pair, PROMPT, example, run)
    assert shown_metric == metric and 0 <= value <= 1


def test_quality_falls_back_to_fidelity(pair):
    *_, run = runs.stream_decode(pair, PROMPT, settings())
    value, metric = runs.quality_of(pair, PROMPT, None, run)
    assert metric == "fidelity" and value <= 0


def test_quality_of_an_empty_output_is_na(pair):
    run = runs.DecodeRun(settings())
    run.summary = Summary("", 0, 1, 0, 0, 0.1)
    assert runs.quality_of(pair, PROMPT, None, run) == (None, "n/a")


# ---------------------------------------------------------------- the shipped figures and the dial


def test_the_dial_draws_each_shipped_frontier_card():
    frontiers = results.shipped_frontiers(SHIPPED_HEADS)
    assert set(frontiers) == set(TASKS)  # a carded head per task
    for task, frontier in frontiers.items():
        card = json.loads(HEADS_DIR.joinpath(f"{task}.json").read_text())["frontier"]
        points = frontier.points
        static, heads = points[points["kind"] == "static"], points[points["kind"] == "head"]
        assert list(static["acceptance"]) == [p["acceptance"] for p in card["static_points"]]
        assert list(heads["quality"]) == [card["head_point"]["quality"]]
        assert list(heads["w"]) == [card["head_point"]["mean_w"]]  # a star at the head's mean w_t
        assert frontier.n_draft == card["settings"]["n_draft"] and "heads/" in frontier.note
        tv = results.expected_tv(points)
        assert 0 < tv < 1
        acceptance, quality, speed, projection = app.dial_figures(points, 4, 0.1, "")
        assert any("theory" in (t.name or "") for t in acceptance.data)
        for chart in (acceptance, quality):  # the head is a star on both
            assert any(t.marker.symbol == "star" for t in chart.data if t.marker is not None)
        assert len(speed.data[0].x) == len(points)
        assert "projected speedup (N = 4, c = 0.1)" in projection.layout.title.text


def test_the_dial_draws_the_greedy_evaluation_when_decoding_is_greedy(tmp_path):
    card = json.loads(HEADS_DIR.joinpath("summarization.json").read_text())
    primary = card["frontier"]
    greedy = {
        **primary,
        "settings": {**primary["settings"], "temperature": 0.0},
        "head_point": {**primary["head_point"], "acceptance": 0.5},
    }
    other_set = {
        **greedy,
        "settings": {**greedy["settings"], "held_out": "another set"},
        "head_point": {**primary["head_point"], "acceptance": 0.9},
    }
    card["evaluations"] = {"other, greedy": other_set, "spec_bench, greedy": greedy}
    (tmp_path / "s.json").write_text(json.dumps(card))
    heads = {"s": tmp_path / "s.safetensors"}

    def head_acceptance(temperature):
        points = results.shipped_frontiers(heads, temperature)["summarization"].points
        return float(points[points["kind"] == "head"]["acceptance"].iloc[0])

    assert head_acceptance(0.0) == 0.5  # greedy on the primary's set, not another set's
    assert head_acceptance(1.0) == head_acceptance(0.7) == primary["head_point"]["acceptance"]
    frontiers = {greedy: results.shipped_frontiers(heads, 0.0 if greedy else 1.0) for greedy in (False, True)}
    *_, note, _ = app.shipped_dial(frontiers, "summarization", 4, 0.1, 0.0)
    assert "T = 0.0" in note
    del card["evaluations"]["spec_bench, greedy"]  # no greedy evaluation: the primary one is drawn
    (tmp_path / "s.json").write_text(json.dumps(card))
    assert head_acceptance(0.0) == primary["head_point"]["acceptance"]


def test_a_greedy_head_serves_greedy_decoding_and_its_twin_the_rest(tmp_path):
    card = json.loads(HEADS_DIR.joinpath("summarization.json").read_text())
    primary = card["frontier"]
    greedy = {
        **primary,
        "settings": {**primary["settings"], "temperature": 0.0},
        "head_point": {**primary["head_point"], "acceptance": 0.5},
    }
    sampled_card = {**card, "evaluations": {"spec_bench, T=1": primary}}
    greedy_card = {
        **card,
        "training": {**card["training"], "temperature": 0.0},
        "frontier": greedy,
        "evaluations": {"spec_bench, greedy": greedy},
    }
    (tmp_path / "s-greedy.json").write_text(json.dumps(greedy_card))  # listed first
    (tmp_path / "s.json").write_text(json.dumps(sampled_card))
    heads = {name: tmp_path / f"{name}.safetensors" for name in ("s-greedy", "s")}

    def stars(temperature):
        points = results.shipped_frontiers(heads, temperature)["summarization"].points
        return sorted(points[points["kind"] == "head"]["label"])

    assert stars(1.0) == ["s"] and stars(0.0) == [
        "s-greedy"
    ]  # s has no greedy evaluation: only the greedy head
    cards = results.head_cards(heads)
    assert results.head_for_temperature(cards, "s", 0.0) == "s-greedy"
    assert results.head_for_temperature(cards, "s-greedy", 0.7) == "s"
    assert results.head_for_temperature(cards, "s", 1.0) is None  # already the right kind: keep it
    assert results.head_for_temperature(cards, "not carded", 0.0) is None
    assert results.arrival_defaults(EXAMPLES, heads).settings.head_name == "s-greedy"  # the app opens greedy
    table = results.frontier_table(heads)
    assert set(table["T"]) == {"greedy", 1.0} and len(table) == 2 * (len(primary["static_points"]) + 1)


def test_each_temperature_kind_draws_the_heads_trained_for_it():
    cards = results.head_cards(SHIPPED_HEADS)
    twins = {card["task"]: name for name, card in cards.items() if results.trained_greedy(card)}
    assert twins  # greedy twins ship
    for temperature, expected in ((0.0, lambda task: [twins[task]]), (1.0, lambda task: [task])):
        frontiers = results.shipped_frontiers(SHIPPED_HEADS, temperature)
        for task in twins:
            points = frontiers[task].points
            assert list(points[points["kind"] == "head"]["label"]) == expected(task)


def test_a_task_without_a_card_says_how_to_make_one():
    without_code = {name: path for name, path in SHIPPED_HEADS.items() if name not in ("code", "code-greedy")}
    frontiers = {
        False: results.shipped_frontiers(without_code),
        True: results.shipped_frontiers(without_code, 0.0),
    }
    *_, note, points = app.shipped_dial(frontiers, "code", 4, 0.1, 1.0)
    assert points is None and "No shipped frontier card for **code**" in note and "--write-card" in note


def test_broken_cards_are_skipped_not_fatal(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text('{"frontier": {}}')
    card = json.loads(HEADS_DIR.joinpath("general.json").read_text())
    card["frontier"]["settings"]["n_draft"] = "four"
    (tmp_path / "typed.json").write_text(json.dumps(card))
    card["frontier"]["settings"]["n_draft"] = 4
    card["frontier"]["static_points"][0]["acceptance"] = None
    (tmp_path / "hole.json").write_text(json.dumps(card))
    heads = {name: tmp_path / f"{name}.safetensors" for name in ("bad", "empty", "typed", "hole", "none")}
    assert results.shipped_frontiers(heads) == {} and results.frontier_table(heads).empty
    assert (
        results.arrival_defaults(EXAMPLES, heads).settings.mode == "static" and results.headline(heads) == ""
    )


def test_arrival_defaults_come_from_the_head_card_of_the_first_examples_task(tmp_path):
    card = json.loads(HEADS_DIR.joinpath("summarization-greedy.json").read_text())
    defaults = results.arrival_defaults(EXAMPLES, SHIPPED_HEADS)
    measured = card["frontier"]["settings"]
    assert defaults.example_index == 0 and defaults.settings.mode == "dynamic"
    assert (
        defaults.settings.head_name == "summarization-greedy" and measured["temperature"] == 0
    )  # opens greedy
    assert (defaults.settings.n_draft, defaults.settings.temperature, defaults.settings.max_new_tokens) == (
        measured["n_draft"],
        measured["temperature"],
        measured["max_new_tokens"],
    )
    assert defaults.settings.ensemble_weight == round(card["frontier"]["head_point"]["mean_w"] * 20) / 20
    assert ("not beyond" in defaults.note) != bool(card["frontier"]["beyond_frontier"])  # the card's verdict
    # Another pair, without cards: the static ensemble, and the note says these are not measured.
    plain = results.arrival_defaults(EXAMPLES, {"x": tmp_path / "x.safetensors"})
    assert (
        plain.settings.mode == "static"
        and plain.settings.head_name == "x"
        and "no frontier card" in plain.note
    )


CPU_COSTS = {
    "c": 0.09,
    "v": {1: 1.1, 2: 1.2, 3: 1.7, 4: 1.8, 5: 1.9, 6: 2.0},
}  # past 3 tokens a pass costs more
FREE_COSTS = {"c": 0.0, "v": {n: 1.0 for n in range(1, 7)}}  # drafting and extra tokens free


@pytest.mark.parametrize("costs, fastest", [(CPU_COSTS, lambda n: n <= 2), (FREE_COSTS, lambda n: n == 6)])
def test_the_app_opens_at_the_draft_length_that_pays_on_this_machine(pair, monkeypatch, costs, fastest):
    """The opening N maximises the analytic speedup at the example's measured acceptance with the measured
    costs: short where a pass over more tokens costs much more (a 2-core CPU), long where it is free."""
    monkeypatch.setattr(app, "measure_costs", lambda *args, **kwargs: costs)
    start = results.arrival_defaults(EXAMPLES, {})
    opened = app.opening_draft_length(pair, EXAMPLES, start)
    assert fastest(opened.settings.n_draft)
    assert (
        opened.note.startswith(start.note)
        and f"N = {opened.settings.n_draft}, not {start.settings.n_draft}" in opened.note
    )
    assert opened.settings == runs.DecodeSettings(
        **{**vars(start.settings), "n_draft": opened.settings.n_draft}
    )


def test_the_opening_draft_length_is_measured_on_the_pair(pair):
    opened = app.opening_draft_length(pair, EXAMPLES, results.arrival_defaults(EXAMPLES, {}))
    assert 1 <= opened.settings.n_draft <= 6


def test_the_cost_ratio_comes_from_the_draft_card_or_is_left_out(tmp_path):
    card = json.loads(results.DRAFT_CARD.read_text())
    measured = results.measured_cost_preset()
    assert measured.cost_ratio == round(card["spec_bench"]["cost_ratio"], 2) and "measured" in measured.label
    assert results.cost_presets()[0] == measured
    (tmp_path / "card.json").write_text('{"spec_bench": {}}')
    assert results.measured_cost_preset(tmp_path / "card.json") is None
    presets = results.cost_presets(tmp_path / "missing.json")
    assert presets and all("estimate" in p.label and 0 < p.cost_ratio < 1 for p in presets)


def test_the_results_table_comes_from_the_cards():
    table = results.frontier_table(SHIPPED_HEADS)
    assert set(table["task"]) == set(TASKS)
    heads = table[table["setting"].str.startswith("DIVERSED")]
    assert heads["margin over the static frontier"].str.contains("±").all()
    for task in TASKS:  # one row per temperature the card's primary set was measured at
        card = json.loads(HEADS_DIR.joinpath(f"{task}.json").read_text())
        measured = {
            e["settings"]["temperature"]
            for e in card["evaluations"].values()
            if e["settings"]["held_out"] == card["frontier"]["settings"]["held_out"]
        }
        rows = heads[heads["task"] == task]
        assert set(rows["T"]) == {"greedy" if t == 0 else t for t in measured}
        primary_t = card["frontier"]["settings"]["temperature"]
        row = rows[
            (rows["T"] == ("greedy" if primary_t == 0 else primary_t))
            & (rows["setting"] == f"DIVERSED head {task}")
        ].iloc[0]
        assert row["acceptance"] == render.fmt(card["frontier"]["head_point"]["acceptance"])
        assert row["margin over the static frontier"].endswith(": " + card["frontier"]["verdict"]["kind"])


def test_the_headline_states_each_carded_heads_measured_margin_by_decoding_kind(tmp_path):
    line = results.headline(SHIPPED_HEADS)
    sampled, greedy = line.split("Sampled (T = 1): ")[1].split("Greedy: ")
    for name in SHIPPED_HEADS:
        card = json.loads(HEADS_DIR.joinpath(f"{name}.json").read_text())
        claim = (
            f"<b>{name}</b> {results.quality_metric(card['task'])} "
            f"{render.fmt(card['frontier']['quality_margin']['estimate'], '+.2g')}"
        )
        assert claim in (greedy if results.trained_greedy(card) else sampled)
        assert f"({card['frontier']['verdict']['kind']})" in line
    assert "nats/token" in line  # fidelity's unit, for the general head
    assert results.headline({"x": tmp_path / "x.safetensors"}) == ""


def test_a_bench_report_is_drawn_or_its_command_named(pair, tmp_path, monkeypatch):
    from diversed_demo.eval.bench import parse_modes, run_bench
    from diversed_demo.eval.bench_report import markdown_table

    name = next(iter(results.BENCH_REPORTS))
    path, command = tmp_path / "bench.json", results.BENCH_REPORTS[name][1]
    monkeypatch.setitem(results.BENCH_REPORTS, name, (path, command))
    assert "Not shipped yet" in results.bench_markdown(name) and command in results.bench_markdown(name)
    path.write_text('{"overall": 3}')
    assert "not a bench report" in results.bench_markdown(name)
    report = run_bench(
        pair,
        [Example("the cat sat", "general", category="writing")],
        parse_modes("ar,exact", pair),
        n_draft=2,
        max_new_tokens=4,
    )
    path.write_text(json.dumps(report))
    assert markdown_table(report) in results.bench_markdown(name)


def test_the_transformers_snippet_names_what_w_weighs_and_compiles(pair):
    hub = results.transformers_snippet("org/big", "org/small", 0.35, 1.0, 64)
    assert "assistant_model=draft" in hub and "assistant_ensemble_weight=0.35" in hub
    assert (
        "applies to the TARGET" in hub and 'from_pretrained("org/small")' in hub and "do_sample=True" in hub
    )
    assert "assistant_ensemble_weight" not in results.transformers_snippet(
        "org/big", "org/small", 1.0, 0.0, 64
    )
    assert "assistant_ensemble_weight=0.01" in results.transformers_snippet(
        "org/big", "org/small", 0.0, 1.0, 64
    )
    local = app.snippet(pair, 0.5, 0.0, 32)  # the tiny pair is not on the hub: loaded with this package
    assert "load_pair(" in local and "do_sample=False" in local
    feature = results.transformers_snippet("org/big", "assets/draft", 0.5, 1.0, 64, feature_draft=True)
    assert "EAGLE-3" in feature
    for text in (hub, local, feature):
        compile(text, "snippet", "exec")


def test_sweep_handler_measures_points_and_figures(pair, saved_head):
    examples = [Example(PROMPT, "general", id="g/0"), Example("a dog ran", "general", id="g/1")]
    calls = []
    points, acceptance, quality, speed, projection, note, table = app.on_sweep(
        pair,
        examples,
        "general",
        2,
        [0.0],
        12,
        3,
        1.0,
        0.2,
        progress=lambda fraction, desc: calls.append(fraction),
    )
    assert list(points["label"]) == ["w = 0.00", "w = 1.00", saved_head]
    assert list(points["kind"]) == ["static", "static", "head"]
    assert points.loc[0, "acceptance"] == pytest.approx(1.0) and points.loc[0, "alpha"] == pytest.approx(1.0)
    assert results.expected_tv(points) == pytest.approx(1 - points.loc[1, "alpha"])
    assert calls == sorted(calls) and calls[-1] == 1.0 and len(calls) == 3 * 2
    assert (
        points["quality"].notna().all() and (points["quality"] <= 0).all()
    )  # fidelity: a mean log-probability
    assert "Your sweep" in note and len(table) == 3
    assert all(chart.data for chart in (acceptance, quality, speed, projection))


@pytest.mark.parametrize(
    "task, weights, message", [("code", [0.5], "no example prompts"), ("general", [], "tick")]
)
def test_sweep_handler_refuses_what_it_cannot_measure(pair, task, weights, message):
    examples = [Example(PROMPT, "general", id="g/0")]
    with pytest.raises(gr.Error, match=message):
        app.on_sweep(pair, examples, task, 1, weights, 8, 2, 1.0, 0.2, progress=no_progress)


def test_nan_quality_does_not_break_the_dial_figures():
    points = results.points_frame(
        [
            {
                "point": "static:0.5",
                "w": 0.5,
                "acceptance": 0.4,
                "tokens_per_second": 10.0,
                "quality": math.nan,
            }
        ],
        4,
    )
    assert all(chart.data for chart in app.dial_figures(points, 4, 0.1, ""))


# ---------------------------------------------------------------- traces


def test_a_trace_round_trips_through_json_and_lists_every_event_in_csv(pair, tmp_path):
    *_, run = runs.stream_decode(pair, PROMPT, settings())
    data = trace.trace_of({"Static ensemble": run}, app.pair_info(pair), "decode")
    json_path, csv_path = trace.write_trace(data, tmp_path, "t")
    replayed = trace.load_trace(open(json_path).read())
    assert [e.to_dict() for e in replayed.events] == [e.to_dict() for e in run.events]
    assert replayed.settings == run.settings and replayed.prompt == PROMPT
    assert (replayed.acceptance_rate, replayed.tau, replayed.new_tokens) == (
        run.acceptance_rate,
        run.tau,
        run.new_tokens,
    )
    assert render.render_tokens(replayed.events) == render.render_tokens(run.events)
    import csv

    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == len(run.events)
    for column in (
        "kind",
        "w",
        "p",
        "q",
        "accept_prob",
        "elapsed_s",
        "draft_ms",
        "verify_ms",
        "mode",
        "seed",
        "target",
        "draft",
    ):
        assert column in rows[0]
    assert {row["kind"] for row in rows} <= {"accepted", "rejected", "resampled", "bonus", "ar"}


def test_old_trace_folders_are_pruned(pair, tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(app, "TRACES_DIR", tmp_path / "traces")
    (tmp_path / "traces" / "old").mkdir(parents=True)
    (tmp_path / "traces" / "recent").mkdir()
    os.utime(tmp_path / "traces" / "old", (0, 0))
    *_, run = runs.stream_decode(pair, PROMPT, settings(max_new_tokens=4))
    json_path, csv_path = app.trace_files({"Static ensemble": run}, pair, "decode")
    assert not (tmp_path / "traces" / "old").exists() and (tmp_path / "traces" / "recent").exists()
    assert json_path.startswith(str(tmp_path / "traces")) and csv_path.endswith(".csv")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not a JSON file"),
        ('{"format": "something else"}', "not a DIVERSED trace"),
        ('{"format": "diversed-trace/1", "runs": []}', "no runs"),
        ('{"format": "diversed-trace/1", "runs": [{"events": [{"kind": "eaten"}]}]}', "event 1: kind"),
        (
            '{"format": "diversed-trace/1", "runs": [{"events": [{"kind": "bonus", "w": "x"}]}]}',
            "w must be a number",
        ),
    ],
)
def test_a_bad_trace_is_refused_with_a_readable_message(text, message):
    with pytest.raises(ValueError, match=message):
        trace.load_trace(text)


def test_replay_handler_plays_a_trace_without_models_and_refuses_bad_files(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(app, "REPLAY_S", 0.05)
    updates = list(app.on_generate(pair, PROMPT, "Static ensemble", 0.5, None, 3, 24, 1.0, 0))
    tokens, stats, _chart, files = updates[-1]
    json_path = next(f for f in files if f.endswith(".json"))
    *_, (replayed_tokens, replayed_stats, chart) = app.on_replay(json_path)
    assert replayed_tokens == tokens and "data-replay" in replayed_stats and chart.data
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for path, message in (
        (str(bad), "not a DIVERSED trace"),
        (None, "choose a JSON trace"),
        (str(tmp_path / "t.csv"), "reads the JSON"),
    ):
        with pytest.raises(gr.Error, match=message):
            list(app.on_replay(path))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(gr.Error, match="not"):
        list(app.on_replay(str(binary)))


# ---------------------------------------------------------------- training job


def test_training_job_runs_one_at_a_time_and_cancels():
    job, release = runs.TrainingJob(), threading.Event()

    def train(callback, should_stop):
        step = 0
        while not should_stop():
            step += 1
            callback({"step": step, "reward": 0.1, "acceptance": 0.5, "mean_w": 0.7})
            release.wait(0.01)
        return type("Result", (), {"path": None})()

    assert job.start(train, owner="a")
    assert not job.start(train, owner="b")  # one run at a time
    assert not job.cancel(owner="b")  # only the session that started it
    assert job.cancel(owner="a")
    job.wait(5)
    assert not job.running and job.history and job.result.path is None
    assert runs.training_status(job).startswith("Cancelled at step")
    assert len(render.training_figure(job.history).data) == 3


def test_training_failure_is_reported_not_raised():
    job = runs.TrainingJob()

    def broken(callback, should_stop):
        raise RuntimeError("out of prompts")

    assert job.start(broken)
    job.wait(5)
    assert job.error == "out of prompts" and runs.training_status(job) == "Training failed: out of prompts"
    assert job.start(broken)  # a failed run does not block the next
    job.wait(5)


# ---------------------------------------------------------------- handlers and the app


@pytest.fixture
def built(pair, heads_dir):
    return app.build_app(pair, examples=EXAMPLES)


def test_app_exposes_the_api_endpoints(built):
    names = {f.api_name for f in built.fns.values() if f.api_visibility == "public"}
    assert {"generate", "compare", "sweep", "train", "cancel_training", "replay"} <= names


def components(built) -> dict:
    return {c.get("props", {}).get("elem_id"): c["props"] for c in built.get_config_file()["components"]}


def test_without_a_card_the_app_arrives_with_the_example_and_says_how_to_draw_a_frontier(pair, heads_dir):
    by_id = components(app.build_app(pair, examples=EXAMPLES))
    assert by_id["prompt"]["value"] == EXAMPLES[0].prompt == by_id["compare-prompt"]["value"]
    assert "No shipped frontier card" in by_id["dial-note"]["value"]
    assert "assistant_ensemble_weight" in by_id["dial-snippet"]["value"]


@pytest.mark.parametrize("costs", [None, CPU_COSTS])
def test_with_a_carded_head_the_app_arrives_with_its_settings_and_its_frontier_drawn(
    pair, saved_head, heads_dir, monkeypatch, costs
):
    """Its card's settings; N the fastest by the costs measured at start (none: the card's)."""
    from diversed_demo.models.heads import pair_identity

    card = json.loads(HEADS_DIR.joinpath("summarization.json").read_text())
    card.update(head=saved_head, pair=pair_identity(pair))
    (heads_dir / f"{saved_head}.json").write_text(json.dumps(card))
    if costs:
        monkeypatch.setattr(app, "measure_costs", lambda *args, **kwargs: costs)
    else:
        monkeypatch.setattr(app, "opening_draft_length", lambda pair, examples, start: start)
    by_id = components(app.build_app(pair, examples=EXAMPLES))
    assert by_id["mode"]["value"] == "DIVERSED" and by_id["head"]["value"] == saved_head
    n_draft = by_id["n-draft"]["value"]
    assert n_draft <= 2 if costs else n_draft == card["frontier"]["settings"]["n_draft"]
    assert "Shipped frontier" in by_id["dial-note"]["value"]
    drawn = json.loads(by_id["dial-quality"]["value"]["plot"])["data"]
    assert any(trace.get("marker", {}).get("symbol") == "star" for trace in drawn)


def test_generate_handler_streams_html_stats_chart_and_the_trace(pair, heads_dir):
    updates = list(app.on_generate(pair, PROMPT, "Static ensemble", 0.5, None, 3, 24, 1.0, 0))
    tokens, stats, chart, files = updates[-1]
    assert "dd-tok" in tokens and 'data-state="done"' in stats and chart.data
    assert sorted(f.rsplit(".", 1)[1] for f in files) == ["csv", "json"]
    assert all(
        isinstance(update[3], type(gr.skip())) for update in updates[:-1]
    )  # the trace once, at the end


@pytest.mark.parametrize(
    "inputs, message",
    [
        (("", "Static ensemble", 0.5, None), "empty"),
        ((PROMPT, "DIVERSED", 0.5, None), "needs a trained head"),
        ((PROMPT, "DIVERSED", 0.5, "nope"), "no head"),
    ],
)
def test_generate_handler_turns_bad_input_into_gr_error(pair, heads_dir, inputs, message):
    with pytest.raises(gr.Error, match=message):
        list(app.on_generate(pair, *inputs, 3, 24, 1.0, 0))


@pytest.mark.parametrize("seed", [2**40, -1, None, 1.5])
def test_a_bad_seed_is_a_message(pair, seed):
    with pytest.raises(gr.Error, match="seed"):
        list(app.on_generate(pair, PROMPT, "Static ensemble", 0.5, None, 3, 8, 1.0, seed))


def test_compare_handler_ends_with_charts_table_verdict_and_trace(pair, heads_dir, monkeypatch):
    monkeypatch.setattr(app, "REPLAY_S", 0.05)
    *_, last = app.on_compare(pair, EXAMPLES, PROMPT, 0.5, None, 3, 16, 1.0, 0)
    *panels, acceptance, elapsed, table, verdict, files = last
    assert len(panels) == 4 and isinstance(table, pd.DataFrame) and len(table) == 3
    assert acceptance.data and elapsed.data
    assert "<b>Static ensemble</b>" in verdict and "the speed of target only" in verdict
    compared = json.loads(open(next(f for f in files if f.endswith(".json"))).read())
    assert [r["label"] for r in compared["runs"]] == ["Target only", "Exact SD", "Static ensemble"]
    assert trace.load_trace(json.dumps(compared), "Exact SD").settings.mode == "exact"
    # Replay offers each run of the comparison, the last one first.
    picker = app.on_trace_chosen(next(f for f in files if f.endswith(".json")))
    assert (
        picker["choices"] == ["Target only", "Exact SD", "Static ensemble"]
        and picker["value"] == "Static ensemble"
    )
    *_, (_tokens, stats, _chart) = app.on_replay(next(f for f in files if f.endswith(".json")), "Exact SD")
    assert 'data-mode="exact"' in stats
    assert app.on_trace_chosen(None)["choices"] == []


def test_train_handler_refuses_a_malformed_upload(pair, tmp_path):
    upload = tmp_path / "bad.jsonl"
    upload.write_text('{"prompt": "fine"}\nnot json\n')
    job = runs.TrainingJob()
    with pytest.raises(gr.Error, match="line 2"):
        list(
            app.on_start_training(pair, job, "general", "Uploaded JSONL", str(upload), 2, 2, 0.5, 1e-3, None)
        )
    with pytest.raises(gr.Error, match="upload a .jsonl"):
        list(app.on_start_training(pair, job, "general", "Uploaded JSONL", None, 2, 2, 0.5, 1e-3, None))


def test_a_public_space_turns_training_off(pair, heads_dir, monkeypatch):
    monkeypatch.setenv(app.PUBLIC_ENV, "1")
    job = runs.TrainingJob()
    with pytest.raises(gr.Error, match="training is off"):
        list(app.on_start_training(pair, job, "general", "Built-in examples", None, 2, 2, 0.5, 1e-3, None))
    assert not job.running
    by_id = components(app.build_app(pair, examples=EXAMPLES))
    assert by_id["train-start"]["interactive"] is False and "train-off" in by_id
    monkeypatch.setenv(app.PUBLIC_ENV, "0")
    assert not app.public_space()


def test_the_app_works_with_a_feature_draft(feature_pair, heads_dir):
    assert (
        "EAGLE-3" in components(app.build_app(feature_pair, examples=EXAMPLES))["dial-snippet"]["value"]
    )  # transformers cannot take it as an assistant
    *_, (tokens, stats, _chart, files) = app.on_generate(
        feature_pair, PROMPT, "Exact SD", 0.5, None, 3, 16, 1.0, 0
    )
    assert "dd-tok" in tokens and 'data-state="done"' in stats and len(files) == 2


def test_handlers_are_gradio_functions_with_their_own_inputs(built):
    generate_fn = next(f for f in built.fns.values() if f.api_name == "generate")
    assert generate_fn.name == "on_generate" and len(generate_fn.inputs) == 8
    train_fn = next(f for f in built.fns.values() if f.api_name == "train")
    assert len(train_fn.inputs) == 7  # the gr.Request is found through the bound signature


# ---------------------------------------------------------------- Spaces entry point


def load_app_module():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "spaces_app", Path(__file__).resolve().parent.parent / "app.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spaces_entry_takes_the_pair_from_env_then_flags(monkeypatch):
    spaces_app = load_app_module()
    for name in ("DIVERSED_TARGET", "DIVERSED_DRAFT", "DIVERSED_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    args = spaces_app.parse_args([])
    assert (args.target, args.draft, args.device) == ("smollm2-135m", None, "auto")
    monkeypatch.setenv("DIVERSED_TARGET", "org/big")
    monkeypatch.setenv("DIVERSED_DRAFT", "org/small")
    monkeypatch.setenv("DIVERSED_DEVICE", "cpu")
    args = spaces_app.parse_args(["--unknown-launcher-flag"])
    assert (args.target, args.draft, args.device) == ("org/big", "org/small", "cpu")
    assert spaces_app.parse_args(["--target", "t", "--device", "cuda"]).target == "t"


def test_no_lower_module_imports_the_ui_or_the_cli():
    import ast
    from pathlib import Path

    package = Path(app.__file__).resolve().parent.parent
    for path in package.rglob("*.py"):
        if path.parent.name == "ui" or path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [alias.name for alias in node.names]
                assert not any(
                    n.split(".")[-1] in ("ui", "cli") or n.startswith(("ui.", "cli")) for n in names
                ), path


def test_trace_cleanup_survives_a_folder_removed_by_a_concurrent_request(monkeypatch, tmp_path):
    """Two decodes finishing together both sweep expired trace folders: one must not fail on the other's removal."""
    import os
    import time as time_module
    from pathlib import Path

    from diversed_demo.ui import app as ui_app

    monkeypatch.setattr(ui_app, "TRACES_DIR", tmp_path)
    gone = tmp_path / "expired"
    gone.mkdir()
    os.utime(gone, (time_module.time() - 2 * ui_app.TRACE_KEEP_S,) * 2)
    real_stat = Path.stat

    def stat_after_removal(self, *args, **kwargs):
        if self == gone:
            if os.path.isdir(gone):  # the other request removes it between listing and stat
                os.rmdir(gone)
            raise FileNotFoundError(str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat_after_removal)
    monkeypatch.setattr(ui_app, "write_trace", lambda data, folder, stem: [str(folder / f"{stem}.json")])
    monkeypatch.setattr(ui_app, "trace_of", lambda runs, info, view: {})
    monkeypatch.setattr(ui_app, "pair_info", lambda pair: {})
    files = ui_app.trace_files({}, None, "decode")
    assert len(files) == 1 and not os.path.isdir(gone)


def test_an_opening_head_that_does_not_load_leaves_the_cards_draft_length(pair, monkeypatch):
    from diversed_demo.models.heads import HeadError

    def broken(*args, **kwargs):
        raise HeadError("heads/x.safetensors: weights do not match its config")

    monkeypatch.setattr(app, "load_head", broken)
    start = results.Defaults(runs.DecodeSettings(mode="dynamic", head_name="x"), 0, "settings of x's card")
    assert app.opening_draft_length(pair, EXAMPLES, start) == start
