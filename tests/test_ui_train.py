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
