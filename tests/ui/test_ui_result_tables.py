"""The measured results as the page states them: the frontier table and headline from the heads' cards,
and the bench reports (or the command that writes each)."""

from __future__ import annotations

import json
import types

import torch
from conftest import shipped_heads

from diversed_demo.common.formatting import fmt
from diversed_demo.eval.schemas import HeadCard
from diversed_demo.eval.tasks import TASKS, Example
from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import cards, result_tables


def test_the_results_table_comes_from_the_cards():
    table = result_tables.frontier_table(shipped_heads())
    assert set(table["task"]) == set(TASKS)
    heads = table[table["setting"].str.startswith("DIVERSED")]
    assert heads["margin over the static frontier"].str.contains("±").all()
    for task in TASKS:  # one row per temperature the task's cards measured its primary set at
        card = json.loads(HEADS_DIR.joinpath(f"{task}.json").read_text())
        measured = {
            e["settings"]["temperature"]
            for name in sorted(shipped_heads())
            if name.removesuffix("-greedy").removesuffix("-cost") == task
            for e in json.loads(HEADS_DIR.joinpath(f"{name}.json").read_text())["evaluations"].values()
            if e["settings"]["held_out"] == card["frontier"]["settings"]["held_out"]
        }
        rows = heads[heads["task"] == task]
        assert set(rows["T"]) == {"greedy" if t == 0 else t for t in measured}
        primary_t = card["frontier"]["settings"]["temperature"]
        row = rows[
            (rows["T"] == ("greedy" if primary_t == 0 else primary_t))
            & (rows["setting"] == f"DIVERSED head {task}")
        ].iloc[0]
        assert row["acceptance"] == fmt(card["frontier"]["head_point"]["acceptance"])
        assert row["margin over the static frontier"].endswith(": " + card["frontier"]["verdict"]["kind"])


def test_the_headline_states_each_task_from_exact_sd_to_diversed_with_its_source(tmp_path):
    from diversed_demo.ui import results_summary

    heads = shipped_heads()
    data = results_summary.headline_data(heads)
    assert {(row["task"], row["greedy"]) for row in data} == {(t, g) for t in TASKS for g in (True, False)}
    for row in data:
        card = HeadCard.model_validate_json(HEADS_DIR.joinpath(f"{row['head']}.json").read_text())
        frontier = cards.frontier_at(card, 0.0 if row["greedy"] else 1.0)
        assert cards.trained_greedy(card) == row["greedy"]  # each kind of decoding by the head made for it
        assert row["acceptance_head"] == frontier.versus_exact.acceptance["head"]
        assert row["quality_difference"] == frontier.versus_exact.quality_difference
    table = results_summary.headline_table(data)
    assert len(table) == len(data) and "goal" not in table.to_string() and "met" not in table.columns
    assert results_summary.headline_data({"x": tmp_path / "x.safetensors"}) == []


def test_the_key_result_quotes_the_bench_report_or_names_its_command(tmp_path):
    from diversed_demo.ui import results_summary

    report = {
        "settings": {"examples": 26, "target": "t", "dtype": "bfloat16", "threads": 2},
        "overall": {m: {"speedup": x} for m, x in [("exact", 1.4), ("static:0.5", 1.6), ("dynamic:h", 1.5)]},
    }
    (tmp_path / "bench.json").write_text(json.dumps(report))
    line = results_summary.key_result("t", tmp_path / "bench.json")
    assert "exact speculative decoding 1.40×, a static w = 0.5 1.60× and a DIVERSED head (h) 1.50×" in line
    assert "26 Spec-Bench prompts with this pair" in line and "bench.json" in line
    assert "the embedded pair" in results_summary.key_result("other", tmp_path / "bench.json")
    assert "tokens/s" not in line  # no target-only run in this report: no baseline speed to quote
    report["overall"]["ar"], report["vs_transformers"] = (
        {"speedup": 1.0, "tokens_per_second": 83.8},
        {"ar": 3.6},
    )
    (tmp_path / "bench.json").write_text(json.dumps(report))
    line = results_summary.key_result("t", tmp_path / "bench.json")
    assert "the target alone, itself 84 tokens/s, 3.6× transformers' <code>generate</code> (" in line
    assert "(greedy, bfloat16, 2 threads on a CPU)" in line  # the report names no CPU
    # A visitor's machine may differ from the bench's: the header names the CPU the report ran on.
    report["settings"]["dtype_choice"] = {"cpu": "AVX2, no bf16 instructions"}
    (tmp_path / "bench.json").write_text(json.dumps(report))
    line = results_summary.key_result("t", tmp_path / "bench.json")
    assert "2 threads on a CPU with AVX2, no bf16 instructions)" in line
    report["settings"]["device_name"] = "AMD EPYC"
    (tmp_path / "bench.json").write_text(json.dumps(report))
    assert "2 threads on AMD EPYC)" in results_summary.key_result("t", tmp_path / "bench.json")
    missing = results_summary.key_result("t", tmp_path / "none.json")
    assert "diversed-demo bench" in missing and "<b>Measured</b>" not in missing


def test_the_header_quotes_the_bench_run_on_the_machine_that_serves_the_page(tmp_path, monkeypatch):
    """A visitor's Compare runs on the server's machine: the header quotes README's bench as run on that
    kind (the GPU's, or the CPU kernel's instruction set's), and the main report where none was run there."""
    from diversed_demo.ui import results_summary

    shipped = result_tables.BENCH_BY_MACHINE
    assert all(path.exists() for path in shipped.values())  # every kind named has its shipped report
    assert results_summary.machine_bench("cpu", "AVX2") == shipped["AVX2"] != results_summary.BENCH_PATH
    assert results_summary.machine_bench("cuda", None) == shipped["cuda"]
    assert results_summary.machine_bench("cpu", "AMX") == results_summary.BENCH_PATH
    assert results_summary.machine_bench("cpu", None) == results_summary.BENCH_PATH  # no kernel serves
    # the page's header, on a server whose CPU the kernel takes with AVX2 instructions
    from diversed_demo.ui import app

    monkeypatch.setattr(results_summary, "instruction_set", lambda: ("AVX2", None, []))
    served = types.SimpleNamespace(target_name="t", draft_name="d", device=torch.device("cpu"))
    assert "bench_avx2.json" in app.header_html(served)
    monkeypatch.setitem(shipped, "AVX2", tmp_path / "not_run.json")
    assert results_summary.machine_bench("cpu", "AVX2") == results_summary.BENCH_PATH
    assert "bench.json" in app.header_html(served)


def test_a_bench_report_is_drawn_or_its_command_named(pair, tmp_path, monkeypatch):
    from diversed_demo.eval.bench import BENCH_DECODING, parse_modes, run_bench
    from diversed_demo.eval.bench_report import markdown_table

    name = next(iter(result_tables.BENCH_REPORTS))
    path, command = tmp_path / "bench.json", result_tables.BENCH_REPORTS[name][1]
    monkeypatch.setitem(result_tables.BENCH_REPORTS, name, (path, command))
    assert "Not measured yet" in result_tables.bench_markdown(name)
    assert command in result_tables.bench_markdown(name)
    path.write_text('{"overall": 3}')
    assert "not a bench report" in result_tables.bench_markdown(name)
    report = run_bench(
        pair,
        [Example("the cat sat", "general", category="writing")],
        parse_modes("ar,exact", pair, BENCH_DECODING.replace(max_new_tokens=4)),
        n_draft=2,
    )
    path.write_text(json.dumps(report))
    assert markdown_table(report) in result_tables.bench_markdown(name)


def test_the_verifier_table_judges_every_point_of_the_rules_reports_and_the_cost_head_against_the_rule(
    tmp_path,
):
    import json

    from diversed_demo.ui.result_tables import verifier_table

    margin = {"estimate": 0.4, "stderr": 0.1, "ci95": [0.2, 0.6]}
    judged = {"quality_margin": margin, "verdict": {"kind": "beyond"}}
    report = {
        "task": "general",
        "points": [
            {
                "point": "static:1",
                "w": 1.0,
                "acceptance": 0.2,
                "quality": -2.0,
                "fidelity": -2.0,
                "examples": 9,
            },
            {
                "point": "cost:2",
                "w": None,
                "acceptance": 0.3,
                "quality": -2.1,
                "fidelity": -2.1,
                "examples": 9,
            },
            {
                "point": "dynamic:g@2",
                "w": None,
                "acceptance": 0.3,
                "quality": -2.0,
                "fidelity": -2.0,
                "examples": 9,
            },
        ],
        "rules": {"cost:2": {**judged, "fidelity": judged}},
        "heads": {
            "g@2": {
                **judged,
                "fidelity": judged,
                "versus_rule": {
                    "fidelity_difference": 0.1,
                    "fidelity_stderr": 0.05,
                    "quality_difference": -0.02,
                    "quality_stderr": 0.01,
                },
            }
        },
    }
    path = tmp_path / "general-spec_bench-T1.json"
    path.write_text(json.dumps(report))
    table = verifier_table({"T = 1": {"general": path}, "greedy": {"general": tmp_path / "absent.json"}})
    assert list(table["setting"]) == ["static w = 1", "per-token rule λ = 2", "head g λ = 2"]
    rule, head = table.iloc[1], table.iloc[2]
    assert (
        rule["vs static w: fidelity"] == "beyond: +0.400 [+0.200, +0.600]"
        and rule["vs the rule at its λ: fidelity"] == ""
    )
    assert head["vs the rule at its λ: fidelity"] == "+0.100 ± 0.050"
    assert head["vs the rule at its λ: quality"] == "-0.020 ± 0.010"
    assert table.iloc[0]["vs static w: quality"] == ""  # a static point is the frontier itself
