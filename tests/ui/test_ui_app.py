"""The app assembled: its API endpoints, what it shows on arrival (with and without a carded head), the
launchers' timed opening, and the Spaces entry point."""

from __future__ import annotations

import json

import pytest
from conftest import CPU_COSTS, UI_PROMPT, app_components, ui_examples

from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import opening
from diversed_demo.ui.app import build_app
from diversed_demo.ui.tabs import decode

EXAMPLES = ui_examples()


@pytest.fixture
def built(pair, heads_dir):
    return build_app(pair, examples=EXAMPLES)


@pytest.fixture
def carded_head(pair, saved_head, heads_dir):
    """The saved head with the shipped summarization card, rebound to the tiny pair: the card."""
    from diversed_demo.models.heads import pair_identity

    card = json.loads(HEADS_DIR.joinpath("summarization.json").read_text())
    card.update(head=saved_head, pair=pair_identity(pair))
    (heads_dir / f"{saved_head}.json").write_text(json.dumps(card))
    return card


def test_app_exposes_the_api_endpoints(built):
    names = {f.api_name for f in built.fns.values() if f.api_visibility == "public"}
    assert {"generate", "compare", "sweep", "train", "cancel_training", "replay"} <= names


def test_handlers_are_gradio_functions_with_their_own_inputs(built):
    generate_fn = next(f for f in built.fns.values() if f.api_name == "generate")
    assert generate_fn.name == "on_generate" and len(generate_fn.inputs) == 11  # prompt, mode, 9 settings
    train_fn = next(f for f in built.fns.values() if f.api_name == "train")
    assert len(train_fn.inputs) == 7  # the gr.Request is found through the bound signature


def test_the_mode_radio_shows_labels_and_passes_codes(built):
    mode = app_components(built)["mode"]
    shown = [tuple(choice) for choice in mode["choices"]]
    assert shown == [
        ("Target only", "ar"),
        ("Exact SD", "exact"),
        ("Static ensemble", "static"),
        ("Per-token rule", "cost"),
        ("DIVERSED", "dynamic"),
    ]


def test_without_a_card_the_app_arrives_with_the_example_and_says_how_to_draw_a_frontier(built):
    by_id = app_components(built)
    assert by_id["prompt"]["value"] == EXAMPLES[0].prompt == by_id["compare-prompt"]["value"]
    assert by_id["mode"]["value"] == "static"
    assert "No shipped frontier card" in by_id["dial-note"]["value"]
    assert "assistant_ensemble_weight" in by_id["dial-snippet"]["value"]


def test_with_a_carded_head_the_app_arrives_with_its_settings_and_its_frontier_drawn(pair, carded_head):
    """Built without a timed opening: the card's settings, its N included."""
    by_id = app_components(build_app(pair, examples=EXAMPLES))
    assert by_id["mode"]["value"] == "dynamic" and by_id["head"]["value"] == carded_head["head"]
    assert by_id["n-draft"]["value"] == carded_head["frontier"]["settings"]["n_draft"]
    assert "Shipped frontier" in by_id["dial-note"]["value"]
    drawn = json.loads(by_id["dial-quality"]["value"]["plot"])["data"]
    assert any(trace.get("marker", {}).get("symbol") == "star" for trace in drawn)


def test_the_app_command_opens_at_the_draft_length_timed_on_the_pair(pair, carded_head, monkeypatch):
    """`diversed-demo app` times the costs before building the app: N is the fastest for them, and the
    sidebar's note says why it is not the card's."""
    from diversed_demo import cli
    from diversed_demo.cli import shared
    from diversed_demo.ui import app as ui_app

    launched, loads = [], []
    monkeypatch.setattr(opening, "measure_costs", lambda *args, **kwargs: CPU_COSTS)
    monkeypatch.setattr(shared, "pair_from_args", lambda args, **how: loads.append(how) or pair)
    monkeypatch.setattr(ui_app, "launch", lambda app, **kwargs: launched.append(app))
    assert cli.main(["app"]) == 0
    assert loads == [{"compiled": "background", "serve_first": True}]  # a server: its page first
    by_id = app_components(launched[0])
    assert by_id["n-draft"]["value"] <= 2 < carded_head["frontier"]["settings"]["n_draft"]
    values = [str(c["props"].get("value")) for c in launched[0].get_config_file()["components"]]
    note = next(value for value in values if value.startswith("### Decoding settings"))
    assert note.endswith(f"(N = {by_id['n-draft']['value']} unticked, the fastest fixed N here).")
    why = f"N = {by_id['n-draft']['value']}, not {carded_head['frontier']['settings']['n_draft']},"
    assert any(why in value for value in values)  # in the sidebar's "Why these settings" fold


def test_the_app_works_with_a_feature_draft(feature_pair, heads_dir):
    snippet = app_components(build_app(feature_pair, examples=EXAMPLES))["dial-snippet"]["value"]
    assert "EAGLE-3" in snippet  # transformers cannot take it as an assistant
    *_, (tokens, stats, _chart, files) = decode.on_generate(
        feature_pair, UI_PROMPT, "exact", 0.5, None, 3, 16, 1.0, 0
    )
    assert "dd-tok" in tokens and 'data-state="done"' in stats and len(files) == 2


# ---------------------------------------------------------------- Spaces entry point


def load_app_module():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "spaces_app", Path(__file__).resolve().parents[2] / "app.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spaces_entry_takes_the_pair_from_env_then_flags(monkeypatch):
    spaces_app = load_app_module()
    for name in ("DIVERSED_TARGET", "DIVERSED_DRAFT", "DIVERSED_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    args = spaces_app.parse_args([])
    assert (args.target, args.draft, args.device) == ("smollm2-135m", None, "auto")
    monkeypatch.setenv("DIVERSED_TARGET", "org/big")
    monkeypatch.setenv("DIVERSED_DRAFT", "org/small")
    monkeypatch.setenv("DIVERSED_DEVICE", "cpu")
    args = spaces_app.parse_args(["--unknown-launcher-flag"])
    assert (args.target, args.draft, args.device) == ("org/big", "org/small", "cpu")
    assert spaces_app.parse_args(["--target", "t", "--device", "cuda"]).target == "t"


@pytest.mark.parametrize("api_name", ["generate", "compare", "sweep"])
def test_decoding_handlers_are_told_who_the_visitor_is(built, api_name):
    from types import SimpleNamespace

    import gradio as gr
    from gradio.helpers import special_args

    fn = next(f for f in built.fns.values() if f.api_name == api_name)
    request = gr.Request(SimpleNamespace(headers={}, query_params={}, client=None), session_hash="visitor")
    args, *_ = special_args(fn.fn, [None] * len(fn.inputs), request=request)
    assert args[-1] is request  # what the per-visitor decode limit counts by
