"""The Train tab's handler: bad uploads refused with a message, and training off on a public Space."""

from __future__ import annotations

import gradio as gr
import pytest
from conftest import app_components, ui_examples

from diversed_demo.ui import runs, space
from diversed_demo.ui.app import build_app
from diversed_demo.ui.tabs import train


def test_train_handler_refuses_a_malformed_upload(pair, tmp_path):
    upload = tmp_path / "bad.jsonl"
    upload.write_text('{"prompt": "fine"}\nnot json\n')
    job = runs.TrainingJob()
    with pytest.raises(gr.Error, match="line 2"):
        list(
            train.on_start_training(
                pair, job, "general", "Uploaded JSONL", str(upload), 2, 2, 0.5, 1e-3, None
            )
        )
    with pytest.raises(gr.Error, match="upload a .jsonl"):
        list(train.on_start_training(pair, job, "general", "Uploaded JSONL", None, 2, 2, 0.5, 1e-3, None))


def test_a_public_space_turns_training_off(pair, heads_dir, monkeypatch):
    monkeypatch.setenv(space.PUBLIC_ENV, "1")
    job = runs.TrainingJob()
    with pytest.raises(gr.Error, match="training is off"):
        list(train.on_start_training(pair, job, "general", "Built-in examples", None, 2, 2, 0.5, 1e-3, None))
    assert not job.running
    by_id = app_components(build_app(pair, examples=ui_examples()))
    assert by_id["train-start"]["interactive"] is False and "train-off" in by_id
    monkeypatch.setenv(space.PUBLIC_ENV, "0")
    assert not space.public_space()


@pytest.mark.parametrize(
    "host, share, env, public",
    [
        (None, False, {}, False),
        ("127.0.0.1", False, {}, False),
        ("0.0.0.0", False, {}, True),
        (None, True, {}, True),
        (None, False, {"SPACE_ID": "someone/diversed"}, True),
        (None, False, {space.PUBLIC_ENV: "1"}, True),
    ],
)
def test_training_is_off_wherever_the_app_is_public(monkeypatch, host, share, env, public):
    for name in (space.PUBLIC_ENV, space.ALLOW_TRAINING_ENV, "SPACE_ID"):
        monkeypatch.setenv(name, env.get(name, ""))
    assert space.mark_public(host, share, allow_training=False) is None
    assert space.public_space() == public


def test_allow_training_reopens_it_with_a_warning(monkeypatch):
    for name in (space.PUBLIC_ENV, space.ALLOW_TRAINING_ENV, "SPACE_ID"):
        monkeypatch.setenv(name, "")
    warning = space.mark_public("0.0.0.0", True, allow_training=True)
    assert "any visitor" in warning and not space.public_space()


@pytest.mark.parametrize(
    "task, line", [("general", '{"prompt": "x", "test_code": "import os"}'), ("code", '{"prompt": "x"}')]
)
def test_an_upload_never_carries_code_to_run(pair, tmp_path, task, line):
    upload = tmp_path / "prompts.jsonl"
    upload.write_text(line + "\n")
    job = runs.TrainingJob()
    with pytest.raises(gr.Error, match="test_code"):
        list(train.on_start_training(pair, job, task, "Uploaded JSONL", str(upload), 2, 2, 0.5, 1e-3, None))
    assert not job.running
