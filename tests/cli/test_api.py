"""The package's public names: what README's Python examples import."""

import subprocess
import sys

import pytest
from tiny import save_tiny_pair

import diversed_demo


def test_the_public_names_decode_a_pair_from_local_paths(tmp_path):
    from diversed_demo import generate, load_pair

    target, draft = save_tiny_pair(tmp_path)
    pair = load_pair(target, draft, "cpu")
    summary, events = generate(pair, "the cat sat on", mode="static", ensemble_weight=0.5, max_new_tokens=8)
    assert 1 <= summary.new_tokens <= 8
    assert [e.token_id for e in events if e.kind != "rejected"] == summary.token_ids


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'decode_fast'"):
        diversed_demo.decode_fast  # noqa: B018


def test_the_command_line_starts_without_loading_torch():
    code = "import sys, diversed_demo.cli; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
