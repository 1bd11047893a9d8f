"""A run's trace as a file: its token events (fate, w_t, p, q, acceptance probability, timing), its
settings and the pair, as JSON (replayable in the Decode view without models) and CSV (one row per event).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

from ..core.events import KINDS, TokenEvent
from ..core.stats import Summary
from .runs import APP_CONFIG, DecodeRun

MAX_EVENTS = 5000  # a replayed run's events (a 512-token run has at most about 1000)

TRACE_FORMAT = "diversed-trace/1"
EVENT_FIELDS = [f.name for f in fields(TokenEvent)]
SETTING_FIELDS = [f.name for f in fields(APP_CONFIG)]
# One folder per user, readable by that user alone: traces hold prompts and outputs.
TRACES_DIR = Path(tempfile.gettempdir()) / f"diversed-traces-{getattr(os, 'getuid', lambda: 'user')()}"
TRACE_KEEP_S = 3600  # Gradio copies a served file into its own cache; our copy is only needed briefly


def pair_info(pair) -> dict:
    return {"target": pair.target_name, "draft": pair.draft_name, "device": str(pair.device)}


def run_record(label: str, run: DecodeRun) -> dict:
    stats = run.stats
    return {
        "label": label,
        "prompt": run.prompt,
        "settings": asdict(run.settings),
        "summary": {**stats.to_dict(), "text": stats.text, "events_s": stats.events_s},
        "events": [
            {**event.to_dict(), "elapsed_s": elapsed} for event, elapsed in zip(run.events, run.event_times)
        ],
    }


def trace_of(runs: dict[str, DecodeRun], pair_info: dict, view: str) -> dict:
    """The trace of the runs of one view (Decode: one run; Compare: one per mode)."""
    return {
        "format": TRACE_FORMAT,
        "view": view,
        "pair": pair_info,
        "runs": [run_record(label, run) for label, run in runs.items()],
    }


def trace_json(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False)  # no indent: one takes json's Python encoder, not its C one


def trace_csv(data: dict) -> str:
    """One row per event, each with its run's label, settings and pair, so the file stands on its own (a
    tree step's tree stays in the JSON: it does not fit a cell)."""
    out = io.StringIO()
    event_columns = [name for name in EVENT_FIELDS if name != "tree"]
    columns = ["run", "index", *event_columns, "elapsed_s", *SETTING_FIELDS, "target", "draft", "device"]
    writer = csv.DictWriter(out, columns, extrasaction="ignore")
    writer.writeheader()
    for record in data["runs"]:
        for i, event in enumerate(record["events"]):
            writer.writerow(
                {"run": record["label"], "index": i, **event, **record["settings"], **data["pair"]}
            )
    return out.getvalue()


def write_trace(data: dict, folder, stem: str) -> tuple[str, str]:
    """The trace as <stem>.json and <stem>.csv in `folder`: their paths."""
    paths = []
    for suffix, text in ((".json", trace_json(data)), (".csv", trace_csv(data))):
        path = folder / f"{stem}{suffix}"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    return paths[0], paths[1]


def remove_expired_traces() -> None:
    """Delete the trace folders older than TRACE_KEEP_S, so a long-running app does not fill the disk."""
    for old in TRACES_DIR.iterdir():
        try:
            expired = time.time() - old.stat().st_mtime > TRACE_KEEP_S
        except FileNotFoundError:  # a concurrent request removed it first
            continue
        if expired:
            shutil.rmtree(old, ignore_errors=True)


def trace_files(runs: dict[str, DecodeRun], pair, view: str) -> list[str]:
    """The runs' trace (runs by the label the page shows) written to a fresh folder under TRACES_DIR, which
    Gradio serves: [json, csv]."""
    TRACES_DIR.mkdir(mode=0o700, exist_ok=True)
    remove_expired_traces()
    folder = Path(tempfile.mkdtemp(dir=TRACES_DIR))
    return list(write_trace(trace_of(runs, pair_info(pair), view), folder, f"diversed-{view}-trace"))


MAX_TREE_NODES = 64  # more than any tree the decoder drafts (core/config.TREE_LIMITS)
NODE_NUMBERS = ("p", "q", "accept_prob")
ROW_NUMBERS = ("w", "entropy", "tv", "cost", "lam_tv")


def checked_tree(raw, where: str) -> dict:
    """A trace's tree (core/events.tree_figure) checked field by field and rebuilt from those fields alone:
    a ValueError naming what is wrong otherwise."""
    if not (
        isinstance(raw, dict) and isinstance(raw.get("nodes"), list) and isinstance(raw.get("rows"), list)
    ):
        raise ValueError(f"{where} must hold lists of nodes and rows")
    if len(raw["nodes"]) > MAX_TREE_NODES or len(raw["rows"]) > MAX_TREE_NODES + 1:
        raise ValueError(f"{where} has more than {MAX_TREE_NODES} nodes")
    nodes = [checked_node(node, i, f"{where}: node {i + 1}") for i, node in enumerate(raw["nodes"])]
    rows = []
    for j, row in enumerate(raw["rows"]):
        if not (isinstance(row, dict) and isinstance(row.get("row"), int) and 0 <= row["row"] <= len(nodes)):
            raise ValueError(f"{where}: row {j + 1} must name a row of the tree")
        numbers = {k: _number(row.get(k), f"{where}: row {j + 1}: {k}") for k in ROW_NUMBERS}
        rows.append({"row": row["row"], **numbers})
    rejected = raw.get("rejected_at")
    if rejected is not None and not (isinstance(rejected, int) and 0 <= rejected <= len(nodes)):
        raise ValueError(f"{where}: rejected_at must name a row of the tree")
    return {"nodes": nodes, "rows": rows, "rejected_at": rejected}


def checked_node(node, i: int, where: str) -> dict:
    """The i-th node of a trace's tree, checked and rebuilt (its text cut to 100 characters)."""
    if not isinstance(node, dict) or not isinstance(node.get("text"), str):
        raise ValueError(f"{where} needs its text")
    parent, depth, token = (node.get(k) for k in ("parent", "depth", "token_id"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (parent, depth, token)):
        raise ValueError(f"{where}'s parent, depth and token_id must be integers")
    if not -1 <= parent < i:
        raise ValueError(f"{where}'s parent must be an earlier node or −1")
    numbers = {k: _number(node.get(k), f"{where}: {k}") for k in NODE_NUMBERS}
    return {
        "token_id": token,
        "text": node["text"][:100],
        "parent": parent,
        "depth": depth,
        **numbers,
        "kept": node.get("kept") is True,
    }


def _number(value, where: str, optional: bool = True):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, not {value!r}")
    return value


def _elapsed(value, earlier: list[float], where: str) -> float:
    """An event's time: a finite number of seconds, never before the previous event's (a replay's pace and
    its sleeps follow these, so a visitor's file must not stretch them)."""
    value = _number(value, f"{where}: elapsed_s", optional=False)
    if not math.isfinite(value):
        raise ValueError(f"{where}: elapsed_s must be finite, not {value!r}")
    return max(value, earlier[-1] if earlier else 0.0)


def read_trace(text: str) -> dict:
    """The trace in a JSON text, checked to be one; ValueError with a readable message otherwise."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"not a JSON file ({err})") from None
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise ValueError(
            f'not a DIVERSED trace: expected "format": "{TRACE_FORMAT}" '
            "(download one from Decode's Trace fold or from Compare)"
        )
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise ValueError("the trace holds no runs")
    return data


def run_labels(data: dict) -> list[str]:
    """The runs of a trace by label (a Decode trace has one, a Compare trace one per mode)."""
    return [str(record.get("label", f"run {i + 1}")) for i, record in enumerate(data["runs"])]


def load_trace(text: str, label: str | None = None) -> DecodeRun:
    """A finished DecodeRun from a JSON trace (its first run, or the one labelled `label`).

    Raises ValueError with a readable message for anything that is not such a trace.
    """
    runs = read_trace(text)["runs"]
    record = next((r for r in runs if r.get("label") == label), runs[0]) if label else runs[0]
    try:
        given = record.get("settings", {})
        if "head_name" in given:  # as traces of earlier versions name the head
            given = {"head": given["head_name"], **given}
        settings = APP_CONFIG.replace(**{k: v for k, v in given.items() if k in SETTING_FIELDS})
        run = DecodeRun(settings, str(record.get("prompt", "")))
        events = record.get("events") or []
        if len(events) > MAX_EVENTS:
            raise ValueError(f"the run has {len(events)} events; a trace holds at most {MAX_EVENTS}")
        for i, raw in enumerate(events):
            where = f"event {i + 1}"
            if not isinstance(raw, dict) or raw.get("kind") not in KINDS:
                raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}")
            values = {k: raw[k] for k in EVENT_FIELDS if k in raw}
            for key in ("w", "p", "q", "accept_prob", "draft_ms", "verify_ms"):
                _number(values.get(key), f"{where}: {key}")
            if values.get("tree") is not None:
                values["tree"] = checked_tree(values["tree"], f"{where}: tree")
            event = TokenEvent(
                **{"text": "", "step": 0, **values, "token_id": int(values.get("token_id", -1))}
            )
            run.add(event, elapsed_s=_elapsed(raw.get("elapsed_s", 0.0), run.event_times, where))
        summary = record.get("summary") or {}
        counts = run.counts
        run.summary = Summary(
            str(summary.get("text", "")),
            counts.new_tokens,
            counts.target_passes,
            counts.drafted,
            counts.accepted,
            float(_number(summary.get("wall_time_s"), "wall_time_s") or counts.wall_time_s),
            mean_w=_number(summary.get("mean_w"), "mean_w"),
            token_ids=[e.token_id for e in run.output_events],
        )
    except TypeError as err:
        raise ValueError(f"the trace's run is malformed ({err})") from None
    return run
