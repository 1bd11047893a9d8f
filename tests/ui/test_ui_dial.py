"""The Speed–quality dial tab: the shipped frontier cards drawn, a task without one, and the live sweep."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import gradio as gr
import pytest
from conftest import UI_PROMPT, shipped_heads

from diversed_demo.eval.schemas import Verdict
from diversed_demo.eval.tasks import TASKS, Example
from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import frontiers
from diversed_demo.ui.tabs import dial


def no_progress(*_args, **_kwargs):
    pass


@pytest.fixture(scope="module")
def drawn():
    """The shipped frontier cards as the dial draws them, by task."""
    return frontiers.shipped_frontiers(shipped_heads())


@pytest.fixture(scope="module")
def figures(drawn):
    """The dial figures (quality, acceptance, projection) of each shipped frontier at N = 4, c = 0.1."""
    return {task: dial.dial_figures(frontier.points, 4, 0.1, "") for task, frontier in drawn.items()}


def card_frontier(task: str) -> dict:
    return json.loads(HEADS_DIR.joinpath(f"{task}.json").read_text())["frontier"]


def test_the_dial_draws_a_carded_head_for_every_task(drawn):
    assert set(drawn) == set(TASKS)


def test_the_static_points_are_the_cards(drawn):
    for task, frontier in drawn.items():
        static = frontier.points[frontier.points["kind"] == "static"]
        assert list(static["acceptance"]) == [p["acceptance"] for p in card_frontier(task)["static_points"]]


def test_the_head_is_drawn_at_its_cards_quality_and_mean_w(drawn):
    for task, frontier in drawn.items():
        heads, card = frontier.points[frontier.points["kind"] == "head"], card_frontier(task)
        assert list(heads["quality"]) == [card["head_point"]["quality"]]
        assert list(heads["w"]) == [card["head_point"]["mean_w"]]  # a star at the head's mean w_t


def test_a_shipped_frontier_is_drawn_at_its_cards_draft_length_and_names_the_heads_folder(drawn):
    for task, frontier in drawn.items():
        assert frontier.n_draft == card_frontier(task)["settings"]["n_draft"] and "heads/" in frontier.note


def test_a_shipped_frontiers_expected_tv_is_strictly_between_0_and_1(drawn):
    for frontier in drawn.values():
        assert 0 < frontiers.expected_tv(frontier.points) < 1


def test_the_acceptance_chart_draws_the_theory_line(figures):
    for _quality, acceptance, _projection in figures.values():
        assert any("theory" in (t.name or "") for t in acceptance.data)


def test_the_head_is_a_star_on_the_quality_and_acceptance_charts(figures):
    for quality, acceptance, _projection in figures.values():
        for chart in (acceptance, quality):
            assert any(t.marker.symbol == "star" for t in chart.data if t.marker is not None)


def test_w_is_written_only_at_the_frontiers_two_ends(figures):
    """w is named on hover, and in text only at the frontier's two ends: labels cannot pile up."""
    for quality, _acceptance, projection in figures.values():
        assert not any("text" in (t.mode or "") for t in quality.data)
        assert [a.text for a in quality.layout.annotations] == ["w = 1 (exact SD)", "w = 0"]
        assert not any("text" in (t.mode or "") for t in projection.data)


def test_the_projection_says_it_is_not_a_measurement(figures):
    for _quality, _acceptance, projection in figures.values():
        assert "not a measurement" in projection.layout.title.text


def test_the_dials_verdict_quotes_the_tasks_card(drawn):
    for task in drawn:
        *_, verdict, _ = dial.shipped_dial({False: drawn, True: drawn}, task, 4, 0.1, 1.0)
        assert f"**{task}** " in verdict and card_frontier(task)["verdict"]["text"] in verdict


def test_the_verdict_says_beyond_on_or_below_in_words():
    text = "on the static frontier within its 95% CI: quality margin +0.009 ± 0.006, n = 50"
    verdicts = {
        "a": Verdict(kind="beyond", text="beyond: ..."),
        "b": Verdict(kind="unresolved", text=text),
        "c": Verdict(kind="below", text="below: ..."),
        "d": Verdict(
            kind="unresolved", text="the head's acceptance lies outside the static curve's range: no claim"
        ),
    }
    lines = frontiers.verdict_markdown(verdicts).split("\n\n")
    assert ["**beyond**" in lines[0], "**on**" in lines[1], "**below**" in lines[2]] == [True] * 3
    assert text in lines[1] and "no claim" in lines[3]


def test_a_task_without_a_card_says_how_to_make_one():
    without_code = {
        name: path for name, path in shipped_heads().items() if name not in ("code", "code-greedy")
    }
    drawn = {
        False: frontiers.shipped_frontiers(without_code),
        True: frontiers.shipped_frontiers(without_code, 0.0),
    }
    *_, note, verdict, points = dial.shipped_dial(drawn, "code", 4, 0.1, 1.0)
    assert points is None and "No shipped frontier card for **code**" in note and "--write-card" in note
    assert verdict == ""


@pytest.fixture(scope="module")
def sweep(pair, tmp_path_factory):
    """A live sweep of w = 0 and 1 and a fresh head over two general prompts, as the dial's handler runs it:
    its progress fractions, what it yields before the end, and the last (points, figures, note, verdict,
    table)."""
    from diversed_demo.models.heads import new_head, save_head

    heads = tmp_path_factory.mktemp("heads")
    save_head(new_head(pair), heads / "fresh.safetensors")
    examples = [Example(UI_PROMPT, "general", id="g/0"), Example("a dog ran", "general", id="g/1")]
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIVERSED_HEADS_DIR", str(heads))
        *running, last = dial.on_sweep(
            pair, examples, "general", 2, [0.0], 12, 3, 1.0, 0.2, progress=lambda f, desc: calls.append(f)
        )
    points, quality, acceptance, projection, note, verdict, table = last
    return SimpleNamespace(
        head="fresh",
        calls=calls,
        running=running,
        points=points,
        charts=(quality, acceptance, projection),
        note=note,
        verdict=verdict,
        table=table,
    )


def test_the_sweep_hands_control_back_after_each_decode(sweep):
    assert len(sweep.running) == len(sweep.calls)


def test_the_sweep_measures_each_static_w_the_rule_at_each_lam_and_the_head(sweep):
    assert list(sweep.points["label"]) == ["w = 0.00", "w = 1.00", "λ = 0.5", "λ = 2", "λ = 8", sweep.head]
    assert list(sweep.points["kind"]) == ["static", "static", "rule", "rule", "rule", "head"]


def test_at_w_0_the_sweep_accepts_every_drafted_token(sweep):
    assert sweep.points.loc[0, "acceptance"] == pytest.approx(1.0)
    assert sweep.points.loc[0, "alpha"] == pytest.approx(1.0)


def test_the_sweeps_expected_tv_is_one_minus_exact_sds_alpha(sweep):
    assert frontiers.expected_tv(sweep.points) == pytest.approx(1 - sweep.points.loc[1, "alpha"])


def test_the_sweeps_progress_rises_to_1_once_per_decode(sweep):
    calls = sweep.calls
    assert calls == sorted(calls) and calls[-1] == 1.0 and len(calls) == 6 * 2  # 6 points, 2 prompts


def test_the_sweeps_quality_is_a_mean_log_probability(sweep):
    """Fidelity: without references, quality is the target's mean log-probability of the output."""
    assert sweep.points["quality"].notna().all() and (sweep.points["quality"] <= 0).all()


def test_the_sweeps_note_says_these_are_your_measurements(sweep):
    assert "Your sweep" in sweep.note


def test_the_sweeps_table_lists_every_point(sweep):
    assert len(sweep.table) == 6


def test_the_sweep_draws_every_chart(sweep):
    assert all(chart.data for chart in sweep.charts)


def test_a_two_prompt_sweeps_verdict_says_the_sample_is_too_small(sweep):
    assert "too small" in sweep.verdict


@pytest.mark.parametrize(
    "task, weights, message", [("code", [0.5], "no example prompts"), ("general", [], "tick")]
)
def test_sweep_handler_refuses_what_it_cannot_measure(pair, task, weights, message):
    examples = [Example(UI_PROMPT, "general", id="g/0")]
    with pytest.raises(gr.Error, match=message):
        list(dial.on_sweep(pair, examples, task, 1, weights, 8, 2, 1.0, 0.2, progress=no_progress))


def test_a_stopped_sweep_decodes_no_further_batch(pair, monkeypatch):
    from diversed_demo.eval import frontier

    batches = []
    real = frontier.decode_examples
    monkeypatch.setattr(frontier, "MAX_BATCH_ROWS", 2)
    monkeypatch.setattr(frontier, "decode_examples", lambda *a, **k: batches.append(1) or real(*a, **k))
    examples = [Example(UI_PROMPT, "general", id=f"g/{i}") for i in range(3)]
    sweeping = dial.on_sweep(pair, examples, "general", 3, [0.0, 0.5], 6, 2, 1.0, 0.2, progress=no_progress)
    next(sweeping)
    sweeping.close()  # what Gradio does on Stop or when the visitor leaves
    assert len(batches) == 1


def test_nan_quality_does_not_break_the_dial_figures():
    row = {"point": "static:0.5", "w": 0.5, "acceptance": 0.4, "tokens_per_second": 10.0, "quality": math.nan}
    points = frontiers.points_frame([row], 4)
    assert all(chart.data for chart in dial.dial_figures(points, 4, 0.1, ""))


def test_the_rules_shipped_evaluation_is_drawn_as_a_curve_beside_the_frontier_and_the_heads(tmp_path):
    from diversed_demo.ui.frontiers import rule_frontiers
    from diversed_demo.ui.render import quality_figure

    rows = [
        {"point": "static:0", "w": 0.0, "acceptance": 0.9, "quality": -3.0},
        {"point": "static:1", "w": 1.0, "acceptance": 0.2, "quality": -2.0},
        {"point": "cost:2", "w": None, "acceptance": 0.4, "quality": -2.1, "mean_w": 0.6},
        {"point": "cost:8", "w": None, "acceptance": 0.8, "quality": -2.6, "mean_w": 0.2},
        {"point": "dynamic:general", "w": None, "acceptance": 0.3, "quality": -2.2, "mean_w": 0.7},
        {"point": "dynamic:general-cost@8", "w": None, "acceptance": 0.85, "quality": -2.5, "mean_w": 0.1},
        {"point": "dynamic:general-cost@2", "w": None, "acceptance": 0.45, "quality": -2.05, "mean_w": 0.5},
    ]
    verdict = {"kind": "beyond", "text": "beyond the static frontier"}
    report = {
        "examples": 100,
        "settings": {"n_draft": 4, "max_new_tokens": 64, "temperature": 1.0, "held_out": "Spec-Bench"},
        "points": rows,
        "rules": {"cost:2": {"verdict": verdict}, "cost:8": {"verdict": verdict}},
        "heads": {"general": {"verdict": {"kind": "unresolved", "text": "on it"}}},
    }
    path = tmp_path / "general-spec_bench-T1.json"
    path.write_text(json.dumps(report))
    frontier = rule_frontiers({"general": path})["general"]
    assert list(frontier.points["kind"]) == ["static", "static", "rule", "rule", "head", "curve", "curve"]
    assert list(frontier.verdicts) == ["per-token rule λ = 2", "per-token rule λ = 8", "general"]
    drawn = {trace.name: trace for trace in quality_figure(frontier.points).data}
    assert list(drawn["per-token rule (one point a λ)"].x) == [0.4, 0.8]
    # a cost head is the third curve, one point a λ, in order of acceptance
    assert list(drawn["learned head general-cost (one point a λ)"].x) == [0.45, 0.85]
    assert list(drawn["learned head general-cost (one point a λ)"].text) == [
        "general-cost λ = 2",
        "general-cost λ = 8",
    ]
    assert rule_frontiers({"general": tmp_path / "absent.json"}) == {}
