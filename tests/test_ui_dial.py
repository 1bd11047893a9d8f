"""The Speed–quality dial tab: the shipped frontier cards drawn, a task without one, and the live sweep."""

from __future__ import annotations

import json
import math

import gradio as gr
import pytest
from conftest import UI_PROMPT, shipped_heads

from diversed_demo.eval.tasks import TASKS, Example
from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import frontiers
from diversed_demo.ui.tabs import dial


def no_progress(*_args, **_kwargs):
    pass


def test_the_dial_draws_each_shipped_frontier_card():
    drawn = frontiers.shipped_frontiers(shipped_heads())
    assert set(drawn) == set(TASKS)  # a carded head per task
    for task, frontier in drawn.items():
        card = json.loads(HEADS_DIR.joinpath(f"{task}.json").read_text())["frontier"]
        points = frontier.points
        static, heads = points[points["kind"] == "static"], points[points["kind"] == "head"]
        assert list(static["acceptance"]) == [p["acceptance"] for p in card["static_points"]]
        assert list(heads["quality"]) == [card["head_point"]["quality"]]
        assert list(heads["w"]) == [card["head_point"]["mean_w"]]  # a star at the head's mean w_t
        assert frontier.n_draft == card["settings"]["n_draft"] and "heads/" in frontier.note
        tv = frontiers.expected_tv(points)
        assert 0 < tv < 1
        quality, acceptance, projection = dial.dial_figures(points, 4, 0.1, "")
        assert any("theory" in (t.name or "") for t in acceptance.data)
        for chart in (acceptance, quality):  # the head is a star on both
            assert any(t.marker.symbol == "star" for t in chart.data if t.marker is not None)
        # w is named on hover, and in text only at the frontier's two ends: labels cannot pile up.
        assert not any("text" in (t.mode or "") for t in quality.data)
        assert [a.text for a in quality.layout.annotations] == ["w = 1 (exact SD)", "w = 0"]
        assert "not a measurement" in projection.layout.title.text
        assert not any("text" in (t.mode or "") for t in projection.data)
        *_, verdict, _ = dial.shipped_dial({False: drawn, True: drawn}, task, 4, 0.1, 1.0)
        assert f"**{task}** " in verdict and card["verdict"]["text"] in verdict


def test_the_verdict_says_beyond_on_or_below_in_words():
    text = "on the static frontier within its 95% CI: quality margin +0.009 ± 0.006, n = 50"
    verdicts = {
        "a": {"kind": "beyond", "text": "beyond: ..."},
        "b": {"kind": "unresolved", "text": text},
        "c": {"kind": "below", "text": "below: ..."},
        "d": {
            "kind": "unresolved",
            "text": "the head's acceptance lies outside the static curve's range: no claim",
        },
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


def test_sweep_handler_measures_points_and_figures(pair, saved_head):
    examples = [Example(UI_PROMPT, "general", id="g/0"), Example("a dog ran", "general", id="g/1")]
    calls = []
    *running, last = dial.on_sweep(
        pair, examples, "general", 2, [0.0], 12, 3, 1.0, 0.2, progress=lambda f, desc: calls.append(f)
    )
    points, quality, acceptance, projection, note, verdict, table = last
    assert len(running) == len(calls)  # the handler hands control back after each decode
    assert list(points["label"]) == ["w = 0.00", "w = 1.00", saved_head]
    assert list(points["kind"]) == ["static", "static", "head"]
    assert points.loc[0, "acceptance"] == pytest.approx(1.0) and points.loc[0, "alpha"] == pytest.approx(1.0)
    assert frontiers.expected_tv(points) == pytest.approx(1 - points.loc[1, "alpha"])
    assert calls == sorted(calls) and calls[-1] == 1.0 and len(calls) == 3 * 2
    # fidelity: a mean log-probability
    assert points["quality"].notna().all() and (points["quality"] <= 0).all()
    assert "Your sweep" in note and len(table) == 3
    assert all(chart.data for chart in (acceptance, quality, projection)) and "too small" in verdict


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
