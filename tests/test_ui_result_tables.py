"""The measured results as the page states them: the frontier table and headline from the heads' cards,
and the bench reports (or the command that writes each)."""

from __future__ import annotations

import json

from conftest import shipped_heads

from diversed_demo.common.formatting import fmt
from diversed_demo.eval.tasks import TASKS, Example
from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import cards, result_tables


def test_the_results_table_comes_from_the_cards():
    table = result_tables.frontier_table(shipped_heads())
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
        assert row["acceptance"] == fmt(card["frontier"]["head_point"]["acceptance"])
        assert row["margin over the static frontier"].endswith(": " + card["frontier"]["verdict"]["kind"])


def test_the_headline_states_each_carded_heads_measured_margin_by_decoding_kind(tmp_path):
    heads = shipped_heads()
    line = result_tables.headline(heads)
    sampled, greedy = line.split("Sampled (T = 1): ")[1].split("Greedy: ")
    for name in heads:
        card = json.loads(HEADS_DIR.joinpath(f"{name}.json").read_text())
        claim = (
            f"<b>{name}</b> {result_tables.quality_metric(card['task'])} "
            f"{fmt(card['frontier']['quality_margin']['estimate'], '+.2g')}"
        )
        assert claim in (greedy if cards.trained_greedy(card) else sampled)
        assert f"({card['frontier']['verdict']['kind']})" in line
    assert "nats/token" in line  # fidelity's unit, for the general head
    assert result_tables.headline({"x": tmp_path / "x.safetensors"}) == ""


def test_a_bench_report_is_drawn_or_its_command_named(pair, tmp_path, monkeypatch):
    from diversed_demo.eval.bench import parse_modes, run_bench
    from diversed_demo.eval.bench_report import markdown_table

    name = next(iter(result_tables.BENCH_REPORTS))
    path, command = tmp_path / "bench.json", result_tables.BENCH_REPORTS[name][1]
    monkeypatch.setitem(result_tables.BENCH_REPORTS, name, (path, command))
    assert "Not shipped yet" in result_tables.bench_markdown(name)
    assert command in result_tables.bench_markdown(name)
    path.write_text('{"overall": 3}')
    assert "not a bench report" in result_tables.bench_markdown(name)
    report = run_bench(
        pair,
        [Example("the cat sat", "general", category="writing")],
        parse_modes("ar,exact", pair),
        n_draft=2,
        max_new_tokens=4,
    )
    path.write_text(json.dumps(report))
    assert markdown_table(report) in result_tables.bench_markdown(name)
