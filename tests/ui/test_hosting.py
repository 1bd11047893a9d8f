"""Safe to host: what a file or a name from outside can and cannot make the server do."""

import os
import pickle

import pytest
import torch

from diversed_demo.common import files
from diversed_demo.models.heads import HeadError, load_head, new_head, save_head
from diversed_demo.ui import runs, trace


def test_an_atomic_write_reaches_the_disk_before_and_after_its_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real(fd))
    files.write_text(tmp_path / "card.json", "{}")
    assert synced[0].startswith(str(tmp_path / "card.json.tmp")) and synced[-1] == str(tmp_path)
    assert (tmp_path / "card.json").read_text() == "{}"


def test_a_head_name_is_never_a_path(pair, heads_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere" / "h.safetensors"
    save_head(new_head(pair), elsewhere)
    with pytest.raises(HeadError, match="nor a head name"):
        load_head("../elsewhere/h", pair)
    settings = runs.APP_CONFIG.replace(mode="dynamic", head=str(elsewhere))  # as a visitor could send it
    with pytest.raises(ValueError, match="pick one in the sidebar"):
        runs.resolve_head(pair, settings)
    save_head(new_head(pair), heads_dir / "mine.safetensors")
    assert runs.resolve_head(pair, runs.APP_CONFIG.replace(mode="dynamic", head="mine")) is not None


def test_a_checkpoint_never_unpickles_objects(tmp_path):
    from diversed_demo.common.optim import adamw_with_schedule, load_checkpoint

    optimizer, scheduler = adamw_with_schedule([torch.nn.Parameter(torch.zeros(2))], 1e-3, 1, 10)
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "x": Exploit()},
        tmp_path / "checkpoint.pt",
    )
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(tmp_path / "checkpoint.pt", optimizer, scheduler)


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/diversed-exploited",))


def test_traces_go_to_a_folder_of_this_user_alone(pair):
    from conftest import UI_PROMPT, decode_settings

    *_, run = runs.stream_decode(pair, UI_PROMPT, decode_settings(max_new_tokens=4))
    paths = trace.trace_files({"Static ensemble": run}, pair, "decode")
    folder = trace.TRACES_DIR
    assert str(os.getuid()) in folder.name and all(str(folder) in p for p in paths)
    assert folder.stat().st_mode & 0o077 == 0


def test_a_public_app_never_runs_generated_code_in_the_sweep(pair, monkeypatch):
    import gradio as gr

    from diversed_demo.eval.tasks import app_examples
    from diversed_demo.ui import space
    from diversed_demo.ui.tabs import dial

    monkeypatch.setenv(space.PUBLIC_ENV, "1")
    monkeypatch.setenv(space.ALLOW_TRAINING_ENV, "")
    monkeypatch.setattr(dial, "sweep_rows", lambda *a, **k: pytest.fail("decoded"))
    examples = app_examples()["code"]
    assert examples  # the app's examples include code prompts
    with pytest.raises(gr.Error, match="public app"):
        list(dial.on_sweep(pair, examples, "code", 1, [0.5], 8, 2, 0.0, 0.1))


def test_a_public_apps_sweep_is_bounded(pair, monkeypatch):
    from diversed_demo.eval.tasks import app_examples
    from diversed_demo.ui import space
    from diversed_demo.ui.tabs import dial

    monkeypatch.setenv(space.PUBLIC_ENV, "1")
    monkeypatch.setenv(space.ALLOW_TRAINING_ENV, "")
    asked = {}

    def record(pair, chosen, task, weights, tokens, *rest):
        asked.update(prompts=len(chosen), tokens=tokens)
        raise ValueError("recorded")

    monkeypatch.setattr(dial, "sweep_rows", record)
    examples = app_examples()["summarization"] * 5
    with pytest.raises(Exception, match="recorded"):
        list(dial.on_sweep(pair, examples, "summarization", 10, [0.5], 512, 2, 0.0, 0.1))
    assert asked == {"prompts": dial.PUBLIC_SWEEP_PROMPTS, "tokens": dial.PUBLIC_SWEEP_TOKENS}


def test_one_visitor_holds_one_decode_slot_at_a_time(pair, monkeypatch):
    from types import SimpleNamespace

    import gradio as gr
    from conftest import UI_PROMPT

    from diversed_demo.runtime import model_thread
    from diversed_demo.ui.tabs import decode

    monkeypatch.setattr(
        model_thread, "SLICE_S", 0
    )  # token by token: the tiny model's decode is still running

    def generate(visitor):
        request = SimpleNamespace(session_hash=visitor)  # what Gradio passes as gr.Request
        return decode.on_generate(pair, UI_PROMPT, "static", 0.5, None, 2, 8, 1.0, 0, request=request)

    running = generate("visitor")
    next(running)
    with pytest.raises(gr.Error, match="already have a decode running"):
        next(generate("visitor"))
    assert list(generate("someone else"))  # another visitor is served meanwhile
    running.close()  # Stop, or the visitor left
    finishing = generate("visitor")
    for _, stats, *_ in finishing:
        if 'data-state="done"' in stats:
            break  # the page shows the run as done: the visitor may go again at once
    assert list(generate("visitor"))
