"""Where the app runs: a public Space (training off) or a ZeroGPU Space (a GPU only inside a call)."""

from __future__ import annotations

import importlib.util
import os

PUBLIC_ENV = "DIVERSED_PUBLIC"  # set to 1 on a public Space: the Train tab is off


def public_space() -> bool:
    return os.environ.get(PUBLIC_ENV, "").strip().lower() not in ("", "0", "false", "no")


def zero_gpu_space() -> bool:
    """Whether this is a ZeroGPU Space (its `spaces` package is installed): a GPU is attached only inside a
    call."""
    return importlib.util.find_spec("spaces") is not None


def on_gpu(fn):
    """On ZeroGPU Spaces, run `fn` with a GPU attached; elsewhere fn runs as is."""
    if not zero_gpu_space():
        return fn
    import spaces

    return spaces.GPU(fn)
