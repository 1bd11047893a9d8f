"""DIVERSED: relaxed speculative decoding with dynamic ensemble verification, as a library and a demo.

    from diversed_demo import DecodeConfig, load_pair, generate
    pair = load_pair("smollm2-135m")  # or any Hugging Face target and draft that share a tokenizer
    summary, events = generate(pair, "Why is the sky blue?", DecodeConfig(mode="static", ensemble_weight=0.5))

The layers, bottom to top: common, core (the decoding algorithm), models (loading them), runtime (how they
run fast here), eval, training, distill, ui, cli.
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
