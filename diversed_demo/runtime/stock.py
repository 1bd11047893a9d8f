"""Running a pair's models as transformers runs them: every layer this package swaps in at load time swapped
back for a while (for comparisons with transformers' own generate)."""

from __future__ import annotations

import contextlib

import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from .attention import stock_attention
from .class_swap import swap_class
from .gguf_int4 import GgufLinear
from .lean_layer import LeanLlamaLayer
from .linear import FastLinear

STOCK_CLASS = {FastLinear: torch.nn.Linear, GgufLinear: torch.nn.Linear, LeanLlamaLayer: LlamaDecoderLayer}


@contextlib.contextmanager
def stock_layers(*models: torch.nn.Module):
    """Run the models with transformers' own layers and attention; this package's are restored after."""
    switched = [(m, type(m)) for model in models for m in model.modules() if type(m) in STOCK_CLASS]
    for module, ours in switched:
        swap_class(module, STOCK_CLASS[ours])
    try:
        with stock_attention(*models):
            yield
    finally:
        for module, ours in switched:
            swap_class(module, ours)
