"""The Compare tab: every mode on one prompt, tabulated, judged in one line, and traced."""

from __future__ import annotations

import json

import pandas as pd
from conftest import UI_PROMPT, decode_settings, token_event, ui_examples

from diversed_demo.core.stats import Summary
from diversed_demo.ui import render, runs, trace
from diversed_demo.ui.tabs import compare, decode

LABELS = ["Target only", "Exact SD", "Static ensemble"]


def test_comparison_runs_each_mode_and_tabulates(pair):
    states = list(runs.stream_comparison(pair, UI_PROMPT, decode_settings()))
    comparison = states[-1]
    assert list(comparison.runs) == ["ar", "exact", "static"]
    assert comparison.skipped == {"dynamic": "no head selected"}
    assert {run.settings.seed for run in comparison.runs.values()} == {3}  # one seed for every mode
    table = compare.comparison_table(comparison)
    assert list(table["mode"]) == LABELS
    assert table.loc[0, "speedup ×"] == 1.0 and pd.isna(table.loc[0, "acceptance"])
    assert (table["metric"] == "fidelity").all()  # a typed prompt: no reference
    acceptance, elapsed = render.comparison_charts(comparison)
    assert len(acceptance.data) == 2 and len(elapsed.data) == 3
    assert [chart.name for chart in elapsed.data] == LABELS
    assert "no head selected" in render.run_panel_html("dynamic", comparison)
    assert "dd-tok" in render.run_panel_html("exact", comparison)
    assert "DIVERSED" in render.run_panel_html("dynamic", comparison)  # panels are headed by the label


def finished_run(mode, tokens, seconds, drafted=0, accepted=0, passes=None):
    run = runs.DecodeRun(decode_settings(mode=mode, head="h" if mode == "dynamic" else None))
    for i, token in enumerate(tokens):
        run.add(token_event("ar" if mode == "ar" else "accepted", token_id=token, step=i + 1))
    run.summary = Summary(
        "x", len(tokens), passes or len(tokens), drafted, accepted, seconds, token_ids=list(tokens)
    )
    return run


def test_the_verdict_is_derived_from_the_run_and_says_one_prompt_cannot_judge_quality():
    comparison = runs.Comparison()
    comparison.runs = {
        "ar": finished_run("ar", [1, 2, 3, 4], 2.0),
        "exact": finished_run("exact", [1, 2, 3, 4], 1.6, drafted=8, accepted=2, passes=3),
        "dynamic": finished_run("dynamic", [1, 2, 9, 4], 1.0, drafted=8, accepted=6, passes=2),
    }
    comparison.quality = {"ar": (0.10, "ROUGE-2"), "exact": (0.10, "ROUGE-2"), "dynamic": (0.099, "ROUGE-2")}
    verdict = compare.compare_verdict(comparison)
    assert (
        "On this prompt, against the target alone: exact speculative decoding 1.25× and DIVERSED 2.00×"
        in verdict
    )
    assert "DIVERSED: kept 75% of the drafted tokens" in verdict
    assert "ROUGE-2 within 1% of exact SD" in verdict and "departs from target only at token 3" in verdict
    assert "One prompt is too few to judge quality" in verdict and 'data-state="done"' in verdict
    comparison.quality["dynamic"] = (0.05, "ROUGE-2")
    assert "ROUGE-2 50% below exact SD" in compare.compare_verdict(comparison)
    del comparison.runs["dynamic"]  # without a head the static ensemble is judged
    assert "Static ensemble" not in compare.compare_verdict(comparison)  # … once it has run
    assert 'data-state="running"' in compare.compare_verdict(comparison, running=True)


def test_compare_handler_ends_with_charts_table_verdict_and_trace(pair, heads_dir, monkeypatch):
    monkeypatch.setattr(decode, "REPLAY_S", 0.05)
    *_, last = compare.on_compare(pair, ui_examples(), UI_PROMPT, 0.5, None, 3, 16, 1.0, 0)
    *panels, acceptance, elapsed, table, verdict, files = last
    assert len(panels) == 4 and isinstance(table, pd.DataFrame) and len(table) == 3
    assert acceptance.data and elapsed.data
    assert "Static ensemble: kept" in verdict and "a fixed w = 0.5" in verdict
    json_path = next(f for f in files if f.endswith(".json"))
    compared = json.loads(open(json_path).read())
    assert [r["label"] for r in compared["runs"]] == LABELS  # the trace names runs as the page does
    assert trace.load_trace(json.dumps(compared), "Exact SD").settings.mode == "exact"
    # Replay offers each run of the comparison, the last one first.
    picker = decode.on_trace_chosen(json_path)
    assert picker["choices"] == LABELS and picker["value"] == "Static ensemble"
    *_, (_tokens, stats, _chart) = decode.on_replay(json_path, "Exact SD")
    assert 'data-mode="exact"' in stats
    assert decode.on_trace_chosen(None)["choices"] == []


def test_the_greedy_exactness_claim_follows_the_dtype_device_and_the_measured_report(tmp_path):
    import json
    from types import SimpleNamespace

    import torch

    from diversed_demo.ui.tabs.compare import greedy_exactness

    def pair_in(dtype, device="cpu"):
        return SimpleNamespace(target=SimpleNamespace(dtype=dtype), device=torch.device(device))

    report, gpu_report = tmp_path / "bench.json", tmp_path / "bench_cuda.json"
    assert greedy_exactness(pair_in(torch.float32), (report,)) == "at temperature 0 exact SD never departs"
    assert "may depart" in greedy_exactness(pair_in(torch.bfloat16), (report,))  # no report: no figure
    settings = {"dtype": "bfloat16", "device": "cpu", "examples": 26}
    report.write_text(
        json.dumps({"settings": settings, "greedy_identical_to_target_only": {"exact": 10 / 26}})
    )
    claim = greedy_exactness(pair_in(torch.bfloat16), (report,))
    assert "10 of 26 Spec-Bench prompts" in claim and "never departs" in claim.split(";")[-1]
    assert "may depart" in greedy_exactness(pair_in(torch.bfloat16, "cuda"), (report,))  # the CPU's figure
    gpu_settings = {**settings, "device": "cuda:0"}
    gpu_report.write_text(
        json.dumps({"settings": gpu_settings, "greedy_identical_to_target_only": {"exact": 11 / 26}})
    )
    on_gpu = greedy_exactness(pair_in(torch.bfloat16, "cuda"), (report, gpu_report))  # each device its own
    assert "11 of 26" in on_gpu and "bench_cuda.json" in on_gpu
    assert "10 of 26" in greedy_exactness(pair_in(torch.bfloat16), (report, gpu_report))
    report.write_text(
        json.dumps(
            {"settings": {**settings, "dtype": "float32"}, "greedy_identical_to_target_only": {"exact": 1.0}}
        )
    )
    assert "may depart" in greedy_exactness(pair_in(torch.bfloat16), (report,))  # another dtype's figure
