"""A run's trace as files: JSON that replays the run exactly, CSV with a row per event, bad traces refused
with a message, and old trace folders removed."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest
from conftest import UI_PROMPT, decode_settings

from diversed_demo.ui import render, runs, trace

CSV_COLUMNS = (
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
)


def test_a_trace_round_trips_through_json_and_lists_every_event_in_csv(pair, tmp_path):
    *_, run = runs.stream_decode(pair, UI_PROMPT, decode_settings())
    data = trace.trace_of({"Static ensemble": run}, trace.pair_info(pair), "decode")
    json_path, csv_path = trace.write_trace(data, tmp_path, "t")
    replayed = trace.load_trace(open(json_path).read())
    assert [e.to_dict() for e in replayed.events] == [e.to_dict() for e in run.events]
    assert replayed.settings == run.settings and replayed.prompt == UI_PROMPT
    assert (replayed.acceptance_rate, replayed.tau, replayed.new_tokens) == (
        run.acceptance_rate,
        run.tau,
        run.new_tokens,
    )
    assert render.render_tokens(replayed.events) == render.render_tokens(run.events)
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == len(run.events)
    assert all(column in rows[0] for column in CSV_COLUMNS)
    assert {row["kind"] for row in rows} <= {"accepted", "rejected", "resampled", "bonus", "ar"}


def test_old_trace_folders_are_pruned(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "TRACES_DIR", tmp_path / "traces")
    (tmp_path / "traces" / "old").mkdir(parents=True)
    (tmp_path / "traces" / "recent").mkdir()
    os.utime(tmp_path / "traces" / "old", (0, 0))
    *_, run = runs.stream_decode(pair, UI_PROMPT, decode_settings(max_new_tokens=4))
    json_path, csv_path = trace.trace_files({"Static ensemble": run}, pair, "decode")
    assert not (tmp_path / "traces" / "old").exists() and (tmp_path / "traces" / "recent").exists()
    assert json_path.startswith(str(tmp_path / "traces")) and csv_path.endswith(".csv")


def test_trace_cleanup_survives_a_folder_removed_by_a_concurrent_request(monkeypatch, tmp_path):
    """Two decodes finishing together both sweep expired trace folders: one must not fail on the other's
    removal."""
    monkeypatch.setattr(trace, "TRACES_DIR", tmp_path)
    gone = tmp_path / "expired"
    gone.mkdir()
    os.utime(gone, (time.time() - 2 * trace.TRACE_KEEP_S,) * 2)
    real_stat = Path.stat

    def stat_after_removal(self, *args, **kwargs):
        if self == gone:
            if os.path.isdir(gone):  # the other request removes it between listing and stat
                os.rmdir(gone)
            raise FileNotFoundError(str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat_after_removal)
    monkeypatch.setattr(trace, "write_trace", lambda data, folder, stem: [str(folder / f"{stem}.json")])
    monkeypatch.setattr(trace, "trace_of", lambda runs, info, view: {})
    monkeypatch.setattr(trace, "pair_info", lambda pair: {})
    files = trace.trace_files({}, None, "decode")
    assert len(files) == 1 and not os.path.isdir(gone)


def test_a_tree_decodes_trace_keeps_its_trees_and_a_bad_tree_is_refused(feature_pair):
    import json

    settings = decode_settings().replace(mode="static", tree="on", n_draft=4, max_new_tokens=16)
    *_, run = runs.stream_decode(feature_pair, UI_PROMPT, settings)
    trees = [event.tree for event in run.events if event.tree]
    assert trees and all(node["text"] for tree in trees for node in tree["nodes"])
    data = trace.trace_of({"DIVERSED": run}, trace.pair_info(feature_pair), "decode")
    replayed = trace.load_trace(trace.trace_json(data))
    assert [e.tree for e in replayed.events] == [e.tree for e in run.events]
    event = next(e for e in data["runs"][0]["events"] if e["tree"])
    event["tree"]["nodes"][0]["parent"] = 5  # a node whose parent comes after it
    with pytest.raises(ValueError, match="node 1's parent must be an earlier node"):
        trace.load_trace(json.dumps(data))
    event["tree"] = {"nodes": "<script>"}
    with pytest.raises(ValueError, match="tree must hold lists of nodes and rows"):
        trace.load_trace(json.dumps(data))


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


def hostile_trace(times, settings=None) -> str:
    import json

    events = [
        {"token_id": 5, "text": "x", "kind": "ar", "step": i + 1, "elapsed_s": t} for i, t in enumerate(times)
    ]
    run = {"label": "Target only", "settings": settings or {"mode": "ar"}, "prompt": "p", "events": events}
    return json.dumps({"format": trace.TRACE_FORMAT, "runs": [run]})


def test_a_replay_never_outlasts_its_budget_whatever_the_times_say(tmp_path):
    from diversed_demo.ui.tabs import decode

    path = tmp_path / "t.json"
    path.write_text(hostile_trace([1e9, 0.0, 5.0]))
    assert trace.load_trace(path.read_text()).event_times == [1e9, 1e9, 1e9]  # never earlier than before
    started = time.perf_counter()
    list(decode.on_replay(str(path)))
    assert time.perf_counter() - started < decode.REPLAY_S + 1.0
    path.write_text(hostile_trace([0.0, float("inf")]).replace("Infinity", "1e999"))
    with pytest.raises(ValueError, match="finite"):
        trace.load_trace(path.read_text())


def test_oversized_traces_are_refused_before_they_are_read(tmp_path, monkeypatch):
    from diversed_demo.ui.tabs import decode

    path = tmp_path / "big.json"
    path.write_text(hostile_trace([0.0] * (trace.MAX_EVENTS + 1)))
    with pytest.raises(ValueError, match="at most"):
        trace.load_trace(path.read_text())
    monkeypatch.setattr(decode, "MAX_TRACE_BYTES", 100)
    with pytest.raises(ValueError, match="MB"):
        decode.read_trace_file(str(path))


def test_a_replayed_traces_hostile_settings_are_refused_and_its_head_name_escaped():
    hostile = {"mode": '"><script>alert(1)</script>', "seed": "<b>", "ensemble_weight": "1 onmouseover=x"}
    with pytest.raises(ValueError, match="seed must be an integer"):  # checked as any settings
        trace.load_trace(hostile_trace([0.0], hostile))
    named = {"mode": "dynamic", "head": '"><script>alert(1)</script>'}  # a name is free text: escaped
    shown = render.stats_html(trace.load_trace(hostile_trace([0.0], named)), replayed=True)
    assert "<script>" not in shown
