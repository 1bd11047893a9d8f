"""Where the app runs: public (a Space, a shared link or a non-loopback interface: training off unless
allowed) or not, and on a ZeroGPU Space (a GPU only inside a call) or not."""

from __future__ import annotations

import importlib.util
import os

PUBLIC_ENV = "DIVERSED_PUBLIC"  # 1: the app is public, and the Train tab is off
ALLOW_TRAINING_ENV = "DIVERSED_ALLOW_TRAINING"  # 1: train even where the app is public (--allow-training)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_set(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def public_space() -> bool:
    """Whether visitors other than the machine's own user reach the app: on a Hugging Face Space
    (SPACE_ID), or wherever the launcher marked it public (`mark_public`). Training is then off unless
    explicitly allowed: a visitor's run would hold the shared CPU."""
    public = is_set(PUBLIC_ENV) or bool(os.environ.get("SPACE_ID"))
    return public and not is_set(ALLOW_TRAINING_ENV)


def mark_public(host: str | None, share: bool, allow_training: bool) -> str | None:
    """Before the app is built: mark it public where a share link or a non-loopback interface serves it,
    and allow training there only if asked. Returns a warning to print, or None."""
    if share or (host is not None and host not in LOOPBACK):
        os.environ[PUBLIC_ENV] = "1"
    if not allow_training:
        return None
    os.environ[ALLOW_TRAINING_ENV] = "1"
    return "training is allowed on a public app: any visitor can start a run that holds the CPU for minutes"


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
