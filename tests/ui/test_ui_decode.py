"""The Decode tab's handlers: a decode streamed as tokens, stats, chart and trace; a trace replayed."""

from __future__ import annotations

import gradio as gr
import pytest
from conftest import UI_PROMPT

from diversed_demo.ui.tabs import decode


def test_generate_handler_streams_html_stats_chart_and_the_trace(pair, heads_dir):
    updates = list(decode.on_generate(pair, UI_PROMPT, "static", 0.5, None, 3, 24, 1.0, 0))
    tokens, stats, chart, files = updates[-1]
    assert "dd-tok" in tokens and 'data-state="done"' in stats and chart.data
    assert 'data-mode="static"' in stats
    assert sorted(f.rsplit(".", 1)[1] for f in files) == ["csv", "json"]
    skip = type(gr.skip())
    assert all(isinstance(update[3], skip) for update in updates[:-1])  # the trace once, at the end


@pytest.mark.parametrize(
    "inputs, message",
    [
        (("", "static", 0.5, None), "empty"),
        ((UI_PROMPT, "dynamic", 0.5, None), "needs a trained head"),
        ((UI_PROMPT, "dynamic", 0.5, "nope"), "no head"),
    ],
)
def test_generate_handler_turns_bad_input_into_gr_error(pair, heads_dir, inputs, message):
    with pytest.raises(gr.Error, match=message):
        list(decode.on_generate(pair, *inputs, 3, 24, 1.0, 0))


@pytest.mark.parametrize("seed", [2**40, -1, None, 1.5])
def test_a_bad_seed_is_a_message(pair, seed):
    with pytest.raises(gr.Error, match="seed"):
        list(decode.on_generate(pair, UI_PROMPT, "static", 0.5, None, 3, 8, 1.0, seed))


def test_replay_handler_plays_a_trace_without_models_and_refuses_bad_files(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "REPLAY_S", 0.05)
    updates = list(decode.on_generate(pair, UI_PROMPT, "static", 0.5, None, 3, 24, 1.0, 0))
    tokens, stats, _chart, files = updates[-1]
    json_path = next(f for f in files if f.endswith(".json"))
    assert '"label": "Static ensemble"' in open(json_path).read()  # the run as the page names it
    *_, (replayed_tokens, replayed_stats, chart) = decode.on_replay(json_path)
    assert replayed_tokens == tokens and "data-replay" in replayed_stats and chart.data
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for path, message in (
        (str(bad), "not a DIVERSED trace"),
        (None, "choose a JSON trace"),
        (str(tmp_path / "t.csv"), "reads the JSON"),
    ):
        with pytest.raises(gr.Error, match=message):
            list(decode.on_replay(path))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(gr.Error, match="not"):
        list(decode.on_replay(str(binary)))
