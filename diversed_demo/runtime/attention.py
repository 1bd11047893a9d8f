"""The target's attention on CPU: grouped K/V heads read in place, with or without a mask.

With grouped-query attention (SmolLM2: 9 query heads over 3 K/V heads), transformers' SDPA path copies the
K/V heads of the whole cache once per query head group whenever the pass has a mask, i.e. in every
multi-token pass over a cache: each verification. PyTorch's CPU kernel takes grouped heads and a mask
together (`enable_gqa`); on CUDA that combination falls back to the math kernel, so this is for the CPU.
One sequence's decoding steps and verifications in bf16 or fp16 attend in blocks instead
(block_attention.py), so that a position gets the same logits in a one-token pass and in a verification.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..core.config import PASS_ROWS
from .block_attention import attend_in_blocks, feed_rows, mask_bias, padded_width

GROUPED_SDPA = "sdpa_grouped"


def grouped_sdpa_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' attention signature: query [B, Hq, T, D], key/value [B, Hkv, S, D] ->
    ([B, T, Hq, D], None)."""
    if takes_blocks(query, attention_mask, scaling):
        return attention_in_blocks(query, key, value, attention_mask), None
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


def takes_blocks(query, attention_mask, scaling) -> bool:
    """Whether a pass attends row-invariantly (block_attention.py): one sequence's decoding step or
    verification, in bf16 or fp16 (a float32 model computes exactly what transformers does)."""
    batch, _, new, dim = query.shape
    plain = attention_mask is None or attention_mask.dtype == torch.bool
    default_scale = scaling is None or scaling == dim**-0.5
    return batch == 1 and new <= PASS_ROWS and query.dtype != torch.float32 and plain and default_scale


def attention_in_blocks(query, key, value, attention_mask):
    """`takes_blocks`' passes: query [1, Hq, T, D] over key/value [1, Hkv, S, D] (a causal feed of the last
    T positions where attention_mask [1, 1, T, S] is None) -> [1, T, Hq, D]."""
    _, n_query, new, dim = query.shape
    used = key.shape[2]
    width = padded_width(used)
    if attention_mask is None:
        _, mask = feed_rows(used - new, used, query.device)
    else:
        mask = F.pad(attention_mask[0, 0], (0, width - used), value=False)
    keys, values = (F.pad(t[0], (0, 0, 0, width - used)) for t in (key, value))  # [Hkv, W, D]
    bias = mask_bias(mask, n_query // key.shape[1])
    out = attend_in_blocks(query[0].transpose(0, 1), keys, values, bias)
    return out.view(1, new, n_query, dim)


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
