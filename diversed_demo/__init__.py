"""DIVERSED: relaxed speculative decoding with dynamic ensemble verification, as a library and a demo.

    from diversed_demo import DecodeConfig, load_pair, generate
    pair = load_pair("smollm2-135m")  # or any Hugging Face target and draft that share a tokenizer
    summary, events = generate(pair, "Why is the sky blue?", DecodeConfig(mode="static", ensemble_weight=0.5))

Its folders are its layers; a module imports only from its own layer and those below. docs/architecture.md's
table lists them bottom to top, the one place the order is written (tests/docs/test_layering.py reads it).
"""

import importlib

# The public names, imported on first use so that `import diversed_demo.cli` stays light.
PUBLIC = {
    "load_pair": "runtime.plan",
    "DecodeConfig": "core.config",
    "ModelPair": "models.pair",
    "PairError": "models.pair",
    "generate": "core.generate",
    "speculative_generate": "core.generate",
    "load_head": "models.heads",
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module 'diversed_demo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{PUBLIC[name]}"), name)
