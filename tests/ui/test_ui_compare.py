"""The Compare tab: every mode on one prompt, tabulated, judged in one line, and traced."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import UI_PROMPT, decode_settings, token_event, ui_examples

from diversed_demo.core.stats import Summary
from diversed_demo.ui import render, runs, trace
from diversed_demo.ui.tabs import compare, decode

LABELS = ["Target only", "Exact SD", "Static ensemble", "Per-token rule"]


@pytest.fixture(scope="module")
def comparison(pair):
    """Target only, exact SD, the static ensemble and the per-token rule on one typed prompt, without a
    head."""
    return list(runs.stream_comparison(pair, UI_PROMPT, decode_settings()))[-1]


def test_a_comparison_runs_target_only_exact_sd_the_static_ensemble_and_the_rule(comparison):
    assert list(comparison.runs) == ["ar", "exact", "static", "cost"]


def test_without_a_head_a_comparison_skips_diversed_and_says_why(comparison):
    assert comparison.skipped == {"dynamic": "no head selected"}


def test_every_mode_of_a_comparison_decodes_with_one_seed(comparison):
    assert {run.settings.seed for run in comparison.runs.values()} == {3}


def test_the_comparison_table_has_a_row_per_mode_by_its_label(comparison):
    assert list(compare.comparison_table(comparison)["mode"]) == LABELS


def test_target_only_is_the_comparison_tables_baseline(comparison):
    table = compare.comparison_table(comparison)
    assert table.loc[0, "speedup ×"] == 1.0 and pd.isna(table.loc[0, "acceptance"])


def test_a_typed_prompt_is_scored_by_fidelity(comparison):
    """A typed prompt has no reference."""
    assert (compare.comparison_table(comparison)["metric"] == "fidelity").all()


def test_the_acceptance_chart_draws_the_three_drafting_modes(comparison):
    acceptance, _elapsed = render.comparison_charts(comparison)
    assert len(acceptance.data) == 3


def test_the_elapsed_chart_draws_every_mode_by_its_label(comparison):
    _acceptance, elapsed = render.comparison_charts(comparison)
    assert len(elapsed.data) == 4
    assert [chart.name for chart in elapsed.data] == LABELS


def test_a_skipped_modes_panel_says_why(comparison):
    assert "no head selected" in render.run_panel_html("dynamic", comparison)


def test_a_run_panel_shows_its_tokens(comparison):
    assert "dd-tok" in render.run_panel_html("exact", comparison)


def test_a_run_panel_is_headed_by_its_modes_label(comparison):
    assert "DIVERSED" in render.run_panel_html("dynamic", comparison)


def finished_run(mode, tokens, seconds, drafted=0, accepted=0, passes=None):
    run = runs.DecodeRun(decode_settings(mode=mode, head="h" if mode == "dynamic" else None))
    for i, token in enumerate(tokens):
        run.add(token_event("ar" if mode == "ar" else "accepted", token_id=token, step=i + 1))
    run.summary = Summary(
        "x", len(tokens), passes or len(tokens), drafted, accepted, seconds, token_ids=list(tokens)
    )
    return run


def judged_comparison(with_diversed: bool = True) -> runs.Comparison:
    """Finished runs of target only, exact SD and (`with_diversed`) DIVERSED, scored by ROUGE-2."""
    comparison = runs.Comparison()
    comparison.runs = {
        "ar": finished_run("ar", [1, 2, 3, 4], 2.0),
        "exact": finished_run("exact", [1, 2, 3, 4], 1.6, drafted=8, accepted=2, passes=3),
        "dynamic": finished_run("dynamic", [1, 2, 9, 4], 1.0, drafted=8, accepted=6, passes=2),
    }
    comparison.quality = {"ar": (0.10, "ROUGE-2"), "exact": (0.10, "ROUGE-2"), "dynamic": (0.099, "ROUGE-2")}
    if not with_diversed:
        del comparison.runs["dynamic"]
    return comparison


def test_the_verdict_gives_each_speedup_against_the_target_alone():
    assert (
        "On this prompt, against the target alone: exact speculative decoding 1.25× and DIVERSED 2.00×"
        in compare.compare_verdict(judged_comparison())
    )


def test_the_verdict_says_what_share_of_the_drafted_tokens_diversed_kept():
    assert "DIVERSED: kept 75% of the drafted tokens" in compare.compare_verdict(judged_comparison())


def test_the_verdict_says_in_words_when_diversed_drafted_nothing():
    """A run whose draft length drafted nothing (on a first start's eager passes, say) has no acceptance:
    the verdict says why in words instead of "kept n/a"."""
    comparison = judged_comparison()
    comparison.runs["dynamic"] = finished_run("dynamic", [1, 2, 3, 4], 2.0)
    verdict = compare.compare_verdict(comparison)
    assert "DIVERSED: drafted nothing, as no draft was expected to pay" in verdict and "n/a" not in verdict


def test_the_verdict_says_diversed_quality_is_within_1_percent_of_exact_sd():
    assert "ROUGE-2 within 1% of exact SD" in compare.compare_verdict(judged_comparison())


def test_the_verdict_says_where_diversed_departs_from_target_only():
    assert "departs from target only at token 3" in compare.compare_verdict(judged_comparison())


def test_the_verdict_says_one_prompt_cannot_judge_quality():
    assert "One prompt is too few to judge quality" in compare.compare_verdict(judged_comparison())


def test_a_finished_comparisons_verdict_is_marked_done():
    assert 'data-state="done"' in compare.compare_verdict(judged_comparison())


def test_the_verdict_says_how_far_diversed_quality_falls_below_exact_sd():
    comparison = judged_comparison()
    comparison.quality["dynamic"] = (0.05, "ROUGE-2")
    assert "ROUGE-2 50% below exact SD" in compare.compare_verdict(comparison)


def test_without_diversed_the_verdict_judges_the_static_ensemble_only_once_it_has_run():
    """Without a head the static ensemble is judged … once it has run."""
    assert "Static ensemble" not in compare.compare_verdict(judged_comparison(with_diversed=False))


def test_a_running_comparisons_verdict_is_marked_running():
    verdict = compare.compare_verdict(judged_comparison(with_diversed=False), running=True)
    assert 'data-state="running"' in verdict


@pytest.fixture(scope="module")
def compared(pair, tmp_path_factory):
    """The Compare button's last update (panels, charts, table, verdict, trace files) at a fixed w = 0.5 and
    no head, with Replay's pauses shortened for the tests below that replay its trace."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIVERSED_HEADS_DIR", str(tmp_path_factory.mktemp("heads")))
        patch.setattr(decode, "REPLAY_S", 0.05)
        *_, last = compare.on_compare(pair, ui_examples(), UI_PROMPT, 0.5, None, 3, 16, 1.0, 0)
        *panels, acceptance, elapsed, table, verdict, files = last
        yield SimpleNamespace(
            panels=panels,
            charts=(acceptance, elapsed),
            table=table,
            verdict=verdict,
            trace=next(f for f in files if f.endswith(".json")),
        )


def test_the_compare_handler_ends_with_a_panel_per_mode_and_a_row_per_run(compared):
    """Five mode panels and the trees' (hidden unless asked for, which it was not: it says it waits)."""
    assert len(compared.panels) == 6 and isinstance(compared.table, pd.DataFrame) and len(compared.table) == 4
    assert "Exact SD on trees" in compared.panels[-1] and "waiting" in compared.panels[-1]


def test_the_compare_handler_draws_both_charts(compared):
    acceptance, elapsed = compared.charts
    assert acceptance.data and elapsed.data


def test_the_compare_verdict_judges_the_per_token_rule_and_quotes_the_fixed_ws_speed(compared):
    assert "Per-token rule: kept" in compared.verdict and "a fixed w = 0.5" in compared.verdict


def test_the_compare_trace_names_runs_as_the_page_does(compared):
    runs_traced = json.loads(open(compared.trace).read())["runs"]
    assert [r["label"] for r in runs_traced] == LABELS


def test_a_compared_run_loads_from_the_trace_by_its_label(compared):
    traced = open(compared.trace).read()
    assert trace.load_trace(traced, "Exact SD").settings.mode == "exact"


def test_replay_offers_each_compared_run_the_last_one_first(compared):
    picker = decode.on_trace_chosen(compared.trace)
    assert picker["choices"] == LABELS and picker["value"] == "Per-token rule"


def test_replaying_a_compared_run_shows_that_runs_mode(compared):
    *_, (_tokens, stats, _chart) = decode.on_replay(compared.trace, "Exact SD")
    assert 'data-mode="exact"' in stats


def test_without_a_trace_replay_offers_no_run():
    assert decode.on_trace_chosen(None)["choices"] == []


def bench_json(settings: dict, share: float) -> str:
    """A bench report with the share of greedy exact SD texts identical to target-only's."""
    return json.dumps(
        {"settings": settings, "overall": {}, "greedy_identical_to_target_only": {"exact": share}}
    )


def test_the_greedy_exactness_claim_follows_the_dtype_device_and_the_measured_report(tmp_path):
    from types import SimpleNamespace

    import torch

    from diversed_demo.ui.tabs.compare import greedy_exactness

    def pair_in(dtype, device="cpu"):
        return SimpleNamespace(target=SimpleNamespace(dtype=dtype), device=torch.device(device))

    report, gpu_report = tmp_path / "bench.json", tmp_path / "bench_cuda.json"
    assert greedy_exactness(pair_in(torch.float32), (report,)) == "at temperature 0 exact SD never departs"
    assert "may depart" in greedy_exactness(pair_in(torch.bfloat16), (report,))  # no report: no figure
    settings = {"dtype": "bfloat16", "device": "cpu", "examples": 26}
    report.write_text(bench_json(settings, 10 / 26))
    claim = greedy_exactness(pair_in(torch.bfloat16), (report,))
    assert "10 of 26 Spec-Bench prompts" in claim and "never departs" in claim.split(";")[-1]
    assert "may depart" in greedy_exactness(pair_in(torch.bfloat16, "cuda"), (report,))  # the CPU's figure
    report.write_text(bench_json(settings, 1.0))
    assert "on all 26 Spec-Bench prompts" in greedy_exactness(pair_in(torch.bfloat16), (report,))
    report.write_text(bench_json(settings, 10 / 26))
    gpu_settings = {**settings, "device": "cuda:0"}
    gpu_report.write_text(bench_json(gpu_settings, 11 / 26))
    on_gpu = greedy_exactness(pair_in(torch.bfloat16, "cuda"), (report, gpu_report))  # each device its own
    assert "11 of 26" in on_gpu and "bench_cuda.json" in on_gpu
    assert "10 of 26" in greedy_exactness(pair_in(torch.bfloat16), (report, gpu_report))
    report.write_text(bench_json({**settings, "dtype": "float32"}, 1.0))
    assert "may depart" in greedy_exactness(pair_in(torch.bfloat16), (report,))  # another dtype's figure


def test_trees_beside_run_every_mode_on_chains_and_exact_sd_once_more_on_draft_trees(pair):
    """Issue 53: a Compare can run a tree beside the chain; greedy, exact SD on trees keeps the target's own
    tokens, and the tree run shows in the table, the charts, the sentence and the trace by its label."""
    settings = decode_settings(temperature=0.0, tree="on")  # the sidebar's choice gives way to chains
    *_, comparison = runs.stream_comparison(pair, UI_PROMPT, settings, trees_beside=True)
    assert list(comparison.runs) == ["ar", "exact", "static", "cost", runs.TREES]
    trees = comparison.runs[runs.TREES]
    assert {key: run.settings.tree for key, run in comparison.runs.items()} == {
        **{mode: "off" for mode in ("ar", "exact", "static", "cost")},
        runs.TREES: "on",
    }
    assert trees.settings.mode == "exact" and any(event.tree for event in trees.events)
    assert not any(event.tree for event in comparison.runs["exact"].events)
    assert comparison.departures()[runs.TREES] is None
    assert list(compare.comparison_table(comparison)["mode"])[-1] == "Exact SD on trees"
    assert "exact SD on draft trees" in runs.speed_sentence(comparison)
    _acceptance, elapsed = render.comparison_charts(comparison)
    assert elapsed.data[-1].name == "Exact SD on trees"
    assert "departs" not in render.run_panel_html(runs.TREES, comparison)


def test_a_finished_runs_panel_and_an_unchanged_table_are_not_sent_again(pair, monkeypatch):
    """Each update carries what changed: a finished run's panel is sent once done, then skipped while the
    next runs stream (its tokens are not rendered and laid out again), and the table when a run finishes;
    the last update carries everything."""
    monkeypatch.setattr(compare, "UI_INTERVAL_S", 0)  # an update at every event
    updates = list(compare.on_compare(pair, ui_examples(), UI_PROMPT, 0.5, None, 3, 16, 1.0, 0))
    streamed, last = updates[:-1], updates[-1]
    target_only = [update[0] for update in streamed if isinstance(update[0], str)]
    assert sum('data-state="done"' in panel for panel in target_only) == 1
    assert len(target_only) < len(streamed) / 2
    tables = [update[-3] for update in streamed if isinstance(update[-3], pd.DataFrame)]
    # the empty table at the start, then at most one a finished run (target-only and the table's four rows):
    # how many of those the stream shows apart depends on how fast the runs go
    assert 1 <= len(tables) <= 2 + len(last[-3]) and all(isinstance(panel, str) for panel in last[:6])
    assert isinstance(last[-3], pd.DataFrame) and len(last[-3]) == 4
