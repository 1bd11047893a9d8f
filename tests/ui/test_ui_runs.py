"""Live run state: a decode as it streams, the comparison of the modes, each run's quality, and the one
background training job."""

from __future__ import annotations

import threading

import pytest
from conftest import UI_PROMPT, decode_settings
from tiny import tiny_pair

from diversed_demo.core.generate import generate
from diversed_demo.core.stats import Summary
from diversed_demo.eval.tasks import Example
from diversed_demo.ui import render, runs
from diversed_demo.ui.sidebar import head_choices, settings_from


@pytest.mark.parametrize("mode", ["ar", "exact", "static"])
def test_live_statistics_agree_with_the_decoders_summary(pair, mode):
    states = list(runs.stream_decode(pair, UI_PROMPT, decode_settings(mode=mode)))
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
        pair, UI_PROMPT, mode=mode, ensemble_weight=0.5, n_draft=3, max_new_tokens=24, seed=3
    )
    assert [e.token_id for e in run.events] == [e.token_id for e in events]
    assert summary.token_ids == expected.token_ids


def test_live_statistics_before_the_summary_use_the_summarys_accounting(pair):
    stream = runs.stream_decode(pair, UI_PROMPT, decode_settings(max_new_tokens=40))
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
        next(runs.stream_decode(pair, prompt, decode_settings()))


def test_diversed_needs_a_head(pair, heads_dir):
    with pytest.raises(ValueError, match="needs a trained head"):
        settings_from("dynamic", 0.5, None, 3, 24, 1.0, 0)  # the sidebar with no head chosen
    with pytest.raises(ValueError, match="no head"):
        runs.resolve_head(pair, decode_settings(mode="dynamic", head="missing"))


def test_a_head_of_another_pair_is_refused(pair, heads_dir):
    from tiny import tiny_pair

    from diversed_demo.models.heads import new_head, save_head

    other = tiny_pair(target_seed=7, draft_seed=8)
    save_head(new_head(other), heads_dir / "other.safetensors")
    assert "other" not in head_choices(pair)
    with pytest.raises(ValueError):
        runs.resolve_head(pair, decode_settings(mode="dynamic", head="other"))


def test_diversed_run_with_a_saved_head_reports_w(pair, saved_head):
    assert saved_head in head_choices(pair)
    run_settings = decode_settings(mode="dynamic", head=saved_head)
    *_, run = runs.stream_decode(pair, UI_PROMPT, run_settings, runs.resolve_head(pair, run_settings))
    assert run.mean_w is not None and 0 <= run.mean_w <= 1


def test_a_served_head_is_loaded_once_and_again_when_its_file_is_rewritten(pair, heads_dir):
    from diversed_demo.models.heads import new_head, save_head

    settings = decode_settings(mode="dynamic", head="mine")
    save_head(new_head(pair, hidden_size=8), heads_dir / "mine.safetensors")
    first = runs.resolve_head(pair, settings)
    assert runs.resolve_head(pair, settings) is first  # the same file: the head already loaded
    save_head(new_head(pair, hidden_size=4), heads_dir / "mine.safetensors")  # retrained, same name
    again = runs.resolve_head(pair, settings)
    assert again is not first and again.config["hidden_size"] == 4
    save_head(new_head(pair, hidden_size=4), heads_dir / "yours.safetensors")  # at once: a new listing
    assert "yours" in head_choices(pair)


def test_throttled_keeps_the_first_and_last_items():
    assert list(runs.throttled(iter(range(100)), interval_s=60)) == [0, 99]
    assert list(runs.throttled(iter(range(5)), interval_s=0)) == [0, 1, 2, 3, 4]
    assert list(runs.throttled(iter([]), interval_s=1)) == []


# ---------------------------------------------------------------- comparison


def test_greedy_exact_sd_never_departs_from_target_only_and_a_relaxed_run_is_marked(pair):
    settings = decode_settings(temperature=0.0, ensemble_weight=0.0)
    *_, comparison = runs.stream_comparison(pair, UI_PROMPT, settings)
    departures = comparison.departures()
    assert departures["exact"] is None  # greedy exact SD is the target's own greedy text
    assert "same tokens as target only" in render.run_panel_html("exact", comparison)
    target = [e.token_id for e in comparison.runs["ar"].output_events]
    relaxed = [e.token_id for e in comparison.runs["static"].output_events]
    at = departures["static"]
    assert at is not None and relaxed[:at] == target[:at] and relaxed[at] != target[at]
    assert f"at token {at + 1}" in render.run_panel_html("static", comparison)


def test_first_departure():
    assert runs.first_departure([1, 2, 3], [1, 2, 3]) is None
    assert runs.first_departure([1, 5, 3], [1, 2, 3]) == 1
    assert runs.first_departure([1, 2, 3, 4], [1, 2, 3]) == 3  # goes on where the finished reference stopped
    assert runs.first_departure([1, 2, 3, 4], [1, 2, 3], reference_done=False) is None


def test_comparison_includes_diversed_with_a_head(pair, saved_head):
    *_, comparison = runs.stream_comparison(pair, UI_PROMPT, decode_settings(head=saved_head))
    assert "dynamic" in comparison.runs and comparison.runs["dynamic"].done


@pytest.mark.parametrize(
    "task, reference, metric",
    [("summarization", "the cat sat on the mat", "ROUGE-2"), ("math", "2 plus 2 is 4\n#### 4", "correct")],
)
def test_quality_uses_the_reference_when_there_is_one(pair, task, reference, metric):
    example = Example(UI_PROMPT, task, reference, "t/0")
    *_, run = runs.stream_decode(pair, UI_PROMPT, decode_settings())
    value, shown_metric = runs.quality_of(pair, UI_PROMPT, example, run)
    assert shown_metric == metric and 0 <= value <= 1


def test_quality_falls_back_to_fidelity(pair):
    *_, run = runs.stream_decode(pair, UI_PROMPT, decode_settings())
    value, metric = runs.quality_of(pair, UI_PROMPT, None, run)
    assert metric == "fidelity" and value <= 0


def test_quality_of_an_empty_output_is_na(pair):
    run = runs.DecodeRun(decode_settings())
    run.summary = Summary("", 0, 1, 0, 0, 0.1)
    assert runs.quality_of(pair, UI_PROMPT, None, run) == (None, "n/a")


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


def test_an_upgrade_offered_during_a_comparison_lands_after_its_last_run():
    """Every run of a Compare runs on the same passes: an upgrade offered once target-only has finished
    (a first start's compiled passes attaching) waits for the whole comparison, so greedy exact SD still
    gives target-only's tokens; the next comparison runs upgraded."""
    pair = tiny_pair()
    settings = decode_settings(temperature=0.0, ensemble_weight=0.0)
    head = pair.target.get_output_embeddings()
    negated = -head.weight.detach().clone()
    landed, waited = None, []
    for comparison in runs.stream_comparison(pair, UI_PROMPT, settings):
        if landed is None and comparison.runs.get("ar") is not None and comparison.runs["ar"].done:
            landed = pair.offer_upgrade(lambda: setattr(head.weight, "data", negated))
        elif landed is not None:
            waited.append(landed.is_set())
    assert waited and not any(waited) and landed.is_set()
    assert comparison.departures()["exact"] is None
    tokens = [e.token_id for e in comparison.runs["ar"].output_events]
    *_, after = runs.stream_comparison(pair, UI_PROMPT, settings)
    assert [e.token_id for e in after.runs["ar"].output_events] != tokens
