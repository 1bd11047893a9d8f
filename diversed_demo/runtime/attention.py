"""The target's attention on CPU: grouped K/V heads read in place, with or without a mask.

With grouped-query attention (SmolLM2: 9 query heads over 3 K/V heads), transformers' SDPA path copies the
K/V heads of the whole cache once per query head group whenever the pass has a mask, i.e. in every
multi-token pass over a cache: each verification. PyTorch's CPU kernel takes grouped heads and a mask
together (`enable_gqa`); on CUDA that combination falls back to the math kernel, so this is for the CPU.
A one-token pass in bf16 or fp16 attends in float32 products instead, where that is the faster here.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..common.timing import runs_faster

GROUPED_SDPA = "sdpa_grouped"


def grouped_sdpa_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' attention signature: query [B, Hq, T, D], key/value [B, Hkv, S, D] ->
    ([B, T, Hq, D], None)."""
    if query.shape[2] == 1 and attention_mask is None and single_query_pays(query.dtype):
        return single_query_attention(query, key, value, scaling), None
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


def single_query_attention(query, key, value, scaling=None):
    """One query per head over grouped K/V heads, in float32 products: as accurate as PyTorch's CPU flash
    kernel, and on some CPUs faster for one query in bf16 (docs/measurements/speed.md). -> [B, 1, Hq, D]."""
    batch, n_query_heads, _, dim = query.shape
    n_kv_heads = key.shape[1]
    grouped = query.reshape(batch, n_kv_heads, n_query_heads // n_kv_heads, dim).float()
    scores = torch.matmul(grouped, key.float().transpose(-1, -2)) * (scaling or dim**-0.5)
    out = torch.matmul(scores.softmax(-1), value.float())
    return out.view(batch, 1, n_query_heads, dim).to(query.dtype)


@functools.cache
def single_query_pays(dtype: torch.dtype) -> bool:
    """Whether `single_query_attention` beats PyTorch's kernel here for one query (SmolLM2's 9 heads over 3
    K/V heads, 256 cached tokens), timed once per process (tens of ms): it depends on the CPU. Never in
    float32, where the target must compute exactly what transformers does."""
    if dtype == torch.float32:
        return False
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 9, 1, 64, generator=generator).to(dtype)
    key, value = (torch.randn(1, 3, 256, 64, generator=generator).to(dtype) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return runs_faster(
        lambda: single_query_attention(query, key, value), lambda: sdpa(query, key, value, enable_gqa=True)
    )


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model on the CPU from SDPA to `grouped_sdpa_attention` where its heads are
    grouped; returns whether it did."""
    config = getattr(model, "config", None)
    parameter = next(model.parameters(), None)
    if not hasattr(config, "get_text_config") or parameter is None or parameter.device.type != "cpu":
        return False
    text = config.get_text_config()
    grouped = getattr(text, "num_key_value_heads", None) not in (None, text.num_attention_heads)
    if not (grouped and getattr(config, "_attn_implementation", None) == "sdpa"):
        return False
    model.set_attn_implementation(GROUPED_SDPA)
    single_query_pays(parameter.dtype)  # timed now rather than in the first decoding step
    return True


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
