import socket

import pytest
import torch
from tiny import tiny_eagle3, tiny_pair

torch.set_num_threads(1)  # tiny models: threads only add overhead, and CI has 2 cores


@pytest.fixture(scope="session")
def pair():
    return tiny_pair()


def tiny_feature_pair():
    """The tiny target with a tiny EAGLE-3 draft reading its features."""
    from diversed_demo.models.pair import ModelPair

    base = tiny_pair()
    return ModelPair(
        base.target, tiny_eagle3(base.target), base.tokenizer, "tiny-target", "tiny-eagle3", base.device
    )


@pytest.fixture(scope="session")
def feature_pair():
    return tiny_feature_pair()


@pytest.fixture(scope="session", params=["standalone", "feature"])
def any_pair(request, pair, feature_pair):
    """Each kind of draft in turn: every decoding guarantee must hold for both."""
    return pair if request.param == "standalone" else feature_pair


@pytest.fixture(scope="session")
def restricted_pair():
    """A tiny pair whose draft proposes only 20 of the 45 tokens (logits −inf elsewhere)."""
    from diversed_demo.models.vocab import restrict_draft_vocab

    pair = tiny_pair()
    restrict_draft_vocab(pair.draft, list(range(0, 40, 2)))
    return pair


@pytest.fixture
def heads_dir(tmp_path, monkeypatch):
    """A fresh user heads folder for one test."""
    monkeypatch.setenv("DIVERSED_HEADS_DIR", str(tmp_path / "heads"))
    return tmp_path / "heads"


PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13], [1, 20], [1, 4, 4, 8, 30, 31, 32, 33, 5]]


def free_port() -> int:
    """A free localhost port for a test server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
