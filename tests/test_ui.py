"""The app's logic without a browser: render functions, live statistics, compare, dial, training job, handlers."""
from __future__ import annotations

import math
import threading

import gradio as gr
import pandas as pd
import pytest

from diversed_demo import ui
from diversed_demo.decode import TokenEvent, generate
from diversed_demo.tasks import Example

PROMPT = "the cat sat on"


def event(kind="accepted", text=" cat", w=0.5, p=0.2, q=0.4, accept_prob=0.75, step=1):
    return TokenEvent(5, text, kind, step, w=w, p=p, q=q, accept_prob=accept_prob)


def settings(**overrides):
    return ui.DecodeSettings(**{"mode": "static", "ensemble_weight": 0.5, "n_draft": 3, "max_new_tokens": 24,
                                "temperature": 1.0, "seed": 3, **overrides})


@pytest.fixture
def heads_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_HEADS_DIR", str(tmp_path / "heads"))
    return tmp_path / "heads"


@pytest.fixture
def saved_head(pair, heads_dir):
    """A freshly initialised head for the tiny pair, saved in the user heads folder: its name."""
    from diversed_demo.head import new_head, save_head
    save_head(new_head(pair), heads_dir / "fresh.safetensors")
    return "fresh"


# ---------------------------------------------------------------- rendering

def test_token_html_escapes_text_and_carries_the_numbers_in_its_tooltip():
    html = ui.render_token(event(text='<b>"&'))
    assert "&lt;b&gt;&quot;&amp;" in html and "<b>" not in html
    assert 'class="dd-tok dd-accepted"' in html
    assert "w_t = 0.500" in html and "p(x) = 0.200" in html and "q(x) = 0.400" in html
    assert "acceptance probability = 0.750" in html


def test_newlines_stay_visible_and_break_the_line():
    html = ui.render_token(event(text="a\nb"))
    assert '<span class="dd-nl">↵</span>\nb' in html


def test_tokens_without_a_draft_say_so():
    title = ui.token_title(event(kind="bonus", w=None, q=None, accept_prob=None))
    assert "bonus" in title and "w_t = n/a (no draft here)" in title and "acceptance" not in title


def test_every_fate_has_a_class_a_legend_entry_and_a_colour():
    legend = ui.legend_html()
    for kind in ("accepted", "rejected", "resampled", "bonus", "ar"):
        assert f"dd-{kind}" in legend and kind in ui.KIND_COLORS
        assert f".dd-{kind}" in ui.CSS_PATH.read_text()
    assert "line-through" in ui.CSS_PATH.read_text().split(".dd-rejected")[1].split("}")[0]


def test_empty_output_shows_a_placeholder():
    assert "dd-empty" in ui.render_tokens([])


# ---------------------------------------------------------------- decoding runs

@pytest.mark.parametrize("mode", ["ar", "exact", "static"])
def test_live_statistics_agree_with_the_decoders_summary(pair, mode):
    runs = list(ui.stream_decode(pair, PROMPT, settings(mode=mode)))
    run = runs[-1]
    assert run.done and all(r is run for r in runs)
    summary = run.summary
    assert (run.new_tokens, run.drafted, run.accepted, run.steps) == \
        (summary.new_tokens, summary.drafted, summary.accepted, summary.target_passes)
    assert len(run.elapsed_per_token) == len(run.acceptance_per_token) == summary.new_tokens
    # Same events as the CLI's plain generate().
    expected, events = generate(pair, PROMPT, mode=mode, ensemble_weight=0.5, n_draft=3, max_new_tokens=24, seed=3)
    assert [e.token_id for e in run.events] == [e.token_id for e in events]
    assert summary.token_ids == expected.token_ids


def test_live_statistics_before_the_summary(pair):
    stream = ui.stream_decode(pair, PROMPT, settings(max_new_tokens=40))
    run = next(stream)
    assert not run.done and run.steps == 1 and run.elapsed_s > 0
    html = ui.stats_html(run)
    assert 'data-state="running"' in html and 'data-w="0.5"' in html
    stream.close()


@pytest.mark.parametrize("prompt, message",
                         [("", "empty"), ("   ", "empty"), ("x" * (ui.MAX_PROMPT_CHARS + 1), "at most")])
def test_bad_prompts_are_refused_with_a_readable_message(pair, prompt, message):
    with pytest.raises(ValueError, match=message):
        next(ui.stream_decode(pair, prompt, settings()))


def test_diversed_needs_a_head(pair, heads_dir):
    with pytest.raises(ValueError, match="needs a trained head"):
        ui.resolve_head(pair, settings(mode="dynamic"))
    with pytest.raises(ValueError, match="no head"):
        ui.resolve_head(pair, settings(mode="dynamic", head_name="missing"))


def test_a_head_of_another_pair_is_refused(pair, heads_dir):
    from diversed_demo.head import new_head, save_head
    from diversed_demo.tiny import tiny_pair
    other = tiny_pair(target_seed=7, draft_seed=8)
    save_head(new_head(other), heads_dir / "other.safetensors")
    assert "other" not in ui.list_heads(pair)
    with pytest.raises(ValueError):
        ui.resolve_head(pair, settings(mode="dynamic", head_name="other"))


def test_diversed_run_with_a_saved_head_reports_w(pair, saved_head):
    assert saved_head in ui.list_heads(pair)
    run_settings = settings(mode="dynamic", head_name=saved_head)
    *_, run = ui.stream_decode(pair, PROMPT, run_settings, ui.resolve_head(pair, run_settings))
    assert run.mean_w is not None and 0 <= run.mean_w <= 1


def test_throttled_keeps_the_first_and_last_items():
    assert list(ui.throttled(iter(range(100)), interval_s=60)) == [0, 99]
    assert list(ui.throttled(iter(range(5)), interval_s=0)) == [0, 1, 2, 3, 4]
    assert list(ui.throttled(iter([]), interval_s=1)) == []


def test_w_chart_has_a_point_per_verified_draft(pair):
    *_, run = ui.stream_decode(pair, PROMPT, settings())
    figure = ui.w_chart(run)
    plotted = sum(len(trace.x) for trace in figure.data)
    assert plotted == sum(e.kind in ("accepted", "rejected") for e in run.events)


# ---------------------------------------------------------------- examples

def test_examples_come_from_the_app_file_or_the_builtin_set(monkeypatch):
    examples = ui.load_examples()
    assert examples and all(isinstance(e, Example) for e in examples)

    def missing():
        raise FileNotFoundError("examples.json")
    monkeypatch.setattr(ui, "app_examples", missing)
    assert ui.load_examples() == ui.BUILTIN_EXAMPLES
    assert {e.task for e in ui.BUILTIN_EXAMPLES} == {"summarization", "math", "code", "general"}


def test_find_example_ignores_whitespace_changes():
    example = ui.BUILTIN_EXAMPLES[0]
    assert ui.find_example("  " + example.prompt.replace(" ", "\n", 1), ui.BUILTIN_EXAMPLES) is example
    assert ui.find_example("something typed", ui.BUILTIN_EXAMPLES) is None
    labels = [label for label, _ in ui.example_choices(ui.BUILTIN_EXAMPLES)]
    assert labels[0].startswith("[summarization] ") and len(labels[0]) < 90


# ---------------------------------------------------------------- compare

def test_comparison_runs_each_mode_and_tabulates(pair):
    states = list(ui.stream_comparison(pair, PROMPT, settings()))
    comparison = states[-1]
    assert list(comparison.runs) == ["Target only", "Exact SD", "Static ensemble"]
    assert comparison.skipped == {"DIVERSED": "no head selected"}
    table = ui.comparison_table(comparison)
    assert list(table["mode"]) == ["Target only", "Exact SD", "Static ensemble"]
    assert table.loc[0, "speedup ×"] == 1.0 and pd.isna(table.loc[0, "acceptance"])
    assert (table["metric"] == "fidelity").all()  # a typed prompt: no reference
    acceptance, elapsed = ui.comparison_charts(comparison)
    assert len(acceptance.data) == 2 and len(elapsed.data) == 3
    assert "no head selected" in ui.run_panel_html("DIVERSED", comparison)
    assert "dd-tok" in ui.run_panel_html("Exact SD", comparison)


def test_comparison_includes_diversed_with_a_head(pair, saved_head):
    *_, comparison = ui.stream_comparison(pair, PROMPT, settings(head_name=saved_head))
    assert "DIVERSED" in comparison.runs and comparison.runs["DIVERSED"].done


@pytest.mark.parametrize("task, reference, metric", [("summarization", "the cat sat on the mat", "ROUGE-2"),
                                                     ("math", "2 plus 2 is 4\n#### 4", "correct")])
def test_quality_uses_the_reference_when_there_is_one(pair, task, reference, metric):
    example = Example(PROMPT, task, reference, "t/0")
    *_, run = ui.stream_decode(pair, PROMPT, settings())
    value, shown_metric = ui.quality_of(pair, PROMPT, example, run)
    assert shown_metric == metric and 0 <= value <= 1


def test_quality_falls_back_to_fidelity(pair):
    *_, run = ui.stream_decode(pair, PROMPT, settings())
    value, metric = ui.quality_of(pair, PROMPT, None, run)
    assert metric == "fidelity" and value <= 0


def test_quality_of_an_empty_output_is_na(pair):
    run = ui.DecodeRun(settings())
    run.summary = ui.Summary("", 0, 1, 0, 0, 0.1)
    assert ui.quality_of(pair, PROMPT, None, run) == (None, "n/a")


# ---------------------------------------------------------------- dial

def test_sweep_points_and_figures(pair, saved_head):
    from diversed_demo.head import load_head
    examples = [Example(PROMPT, "general", id="g/0"), Example("a dog ran", "general", id="g/1")]
    calls = []
    points = ui.sweep_points(pair, examples, "general", [0.0, 1.0], settings(max_new_tokens=12),
                             heads={saved_head: load_head(saved_head, pair)},
                             progress=lambda fraction, text: calls.append(fraction))
    assert list(points["label"]) == ["w = 0.00", "w = 1.00", saved_head]
    assert list(points["kind"]) == ["static", "static", "head"]
    assert points.loc[0, "acceptance"] == pytest.approx(1.0) and points.loc[0, "alpha"] == pytest.approx(1.0)
    assert ui.expected_tv(points) == pytest.approx(1 - points.loc[1, "alpha"])
    assert calls == sorted(calls) and calls[-1] == 1.0 and len(calls) == 3 * 2
    assert points["quality"].notna().all() and (points["quality"] <= 0).all()  # fidelity: a mean log-probability
    quality_figure = ui.dial_quality_figure(points)
    assert any("theory" in (trace.name or "") for trace in quality_figure.data)
    speed_figure = ui.dial_speed_figure(points, n_draft=3, cost_ratio=0.2)
    assert "projected" in speed_figure.layout.annotations[1].text


def test_sweep_needs_prompts(pair):
    with pytest.raises(ValueError, match="at least one prompt"):
        ui.sweep_points(pair, [], "general", [0.5], settings())


# ---------------------------------------------------------------- training job

def test_training_job_runs_one_at_a_time_and_cancels():
    job, release = ui.TrainingJob(), threading.Event()

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
    assert ui.training_status(job).startswith("Cancelled at step")
    assert len(ui.training_figure(job.history).data) == 3


def test_training_failure_is_reported_not_raised():
    job = ui.TrainingJob()

    def broken(callback, should_stop):
        raise RuntimeError("out of prompts")

    assert job.start(broken)
    job.wait(5)
    assert job.error == "out of prompts" and ui.training_status(job) == "Training failed: out of prompts"
    assert job.start(broken)  # a failed run does not block the next
    job.wait(5)


# ---------------------------------------------------------------- handlers

def handler(app, name):
    return next(f.fn for f in app.fns.values() if f.name == name)


@pytest.fixture
def app(pair, heads_dir):
    return ui.build_app(pair, examples=ui.BUILTIN_EXAMPLES)


def test_app_exposes_the_api_endpoints(app):
    names = {f.api_name for f in app.fns.values() if f.api_visibility == "public"}
    assert {"generate", "compare", "sweep", "train", "cancel_training"} <= names


def test_generate_handler_streams_html_stats_and_chart(app):
    updates = list(handler(app, "generate")(PROMPT, "Static ensemble", 0.5, None, 3, 24, 1.0, 0))
    tokens, stats, chart = updates[-1]
    assert "dd-tok" in tokens and 'data-state="done"' in stats and chart.data


@pytest.mark.parametrize("inputs, message", [
    (("", "Static ensemble", 0.5, None), "empty"),
    ((PROMPT, "DIVERSED", 0.5, None), "needs a trained head"),
    ((PROMPT, "DIVERSED", 0.5, "nope"), "no head"),
])
def test_generate_handler_turns_bad_input_into_gr_error(app, inputs, message):
    with pytest.raises(gr.Error, match=message):
        list(handler(app, "generate")(*inputs, 3, 24, 1.0, 0))


def test_compare_handler_ends_with_charts_and_table(app):
    *_, last = handler(app, "compare")(PROMPT, 0.5, None, 3, 16, 1.0, 0)
    *panels, acceptance, elapsed, table = last
    assert len(panels) == 4 and isinstance(table, pd.DataFrame) and len(table) == 3
    assert acceptance.data and elapsed.data


def test_train_handler_refuses_a_malformed_upload(app, tmp_path):
    upload = tmp_path / "bad.jsonl"
    upload.write_text('{"prompt": "fine"}\nnot json\n')
    start = handler(app, "start_training")
    with pytest.raises(gr.Error, match="line 2"):
        list(start("general", "Uploaded JSONL", str(upload), 2, 2, 0.5, 1e-3, request=None))
    with pytest.raises(gr.Error, match="upload a .jsonl"):
        list(start("general", "Uploaded JSONL", None, 2, 2, 0.5, 1e-3, request=None))


def test_nan_quality_does_not_break_the_dial_figures():
    points = pd.DataFrame([{"label": "w = 0.50", "kind": "static", "w": 0.5, "alpha": 0.6, "acceptance": 0.4,
                            "tokens_per_second": 10.0, "quality": math.nan}])
    assert ui.dial_quality_figure(points).data and ui.dial_speed_figure(points, 4, 0.1).data


# ---------------------------------------------------------------- Spaces entry point

def load_app_module():
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("spaces_app", Path(__file__).resolve().parent.parent / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spaces_entry_takes_the_pair_from_env_then_flags(monkeypatch):
    app = load_app_module()
    for name in ("DIVERSED_TARGET", "DIVERSED_DRAFT", "DIVERSED_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    args = app.parse_args([])
    assert (args.target, args.draft, args.device) == ("smollm2-135m", None, "auto")
    monkeypatch.setenv("DIVERSED_TARGET", "org/big")
    monkeypatch.setenv("DIVERSED_DRAFT", "org/small")
    monkeypatch.setenv("DIVERSED_DEVICE", "cpu")
    args = app.parse_args(["--unknown-launcher-flag"])
    assert (args.target, args.draft, args.device) == ("org/big", "org/small", "cpu")
    assert app.parse_args(["--target", "t", "--device", "cuda"]).target == "t"
