"""The target's attention on CPU: grouped K/V heads read in place, with or without a mask.

With grouped-query attention (SmolLM2: 9 query heads over 3 K/V heads), transformers' SDPA path copies the
K/V heads of the whole cache once per query head group whenever the pass has a mask, i.e. in every
multi-token pass over a cache: each verification. PyTorch's CPU kernel takes grouped heads and a mask
together (`enable_gqa`); on CUDA that combination falls back to the math kernel, so this is for the CPU.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "sdpa_grouped"


def grouped_sdpa_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' attention signature: query [B, Hq, T, D], key/value [B, Hkv, S, D] ->
    ([B, T, Hq, D], None)."""
    causal = module.is_causal if is_causal is None else is_causal
    # Without a mask transformers relies on SDPA's causal flag (a prefill over an empty cache: T == S).
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_attention(model: torch.nn.Module) -> None:
    """Switch a transformers model on the CPU from SDPA to `grouped_sdpa_attention` where its heads are
    grouped."""
    config = getattr(model, "config", None)
    parameter = next(model.parameters(), None)
    if not hasattr(config, "get_text_config") or parameter is None or parameter.device.type != "cpu":
        return
    text = config.get_text_config()
    grouped = getattr(text, "num_key_value_heads", None) not in (None, text.num_attention_heads)
    if grouped and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(GROUPED_SDPA)


@contextlib.contextmanager
def stock_attention(*models: torch.nn.Module):
    """Run the models with transformers' own SDPA attention, as a transformers user runs them (for
    comparisons)."""
    switched = [
        m for m in models if getattr(getattr(m, "config", None), "_attn_implementation", None) == GROUPED_SDPA
    ]
    for model in switched:
        model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        for model in switched:
            model.set_attn_implementation(GROUPED_SDPA)
