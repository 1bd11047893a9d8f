"""An EAGLE-3 draft's decoding step as one module over a static KV cache, so that AOTInductor can compile
it into one graph (runtime/compiled_pass.py builds and lends it as it does the target's pass).

Eager, a drafted token is mostly overhead: one decoder layer and the LM head are a few small products,
and the norms, rotary embedding, attention and the cache's growth are each a Python call and a
dispatch. As one graph they fuse (docs/measurements/speed.md). A step feeds p ≤ K_MAX rows (features,
the token after each, positions, a mask), writes their keys and values at the slots the mask gives them,
and returns the draft's hidden states [p, H] (what `Eagle3Draft.layer` returns) and its logits over the
draft vocabulary for every row [p, Vd] (`Eagle3Draft.draft_logits`: a draft tree expands several nodes
at once), for the last row alone where p > K_MAX (a prompt's feed: its other rows' logits are never read,
and over the 8k vocabulary they cost as much as the layer). The features are fused (`Eagle3Draft.fuse`)
or the draft's own output, as in `core.draft.FeatureDraft`.

Where the draft runs its products on 8-bit weights (runtime/int8_draft.py), so does the step, on up to
K_MAX rows (the eager draft stops at INT8_ROWS: the compiled graph takes any row count up to K_MAX, and
the choice cannot depend on it). A longer feed (the prompt's features, run eagerly) stays on the GGUF
kernel's records (any number of rows), as the eager draft does; PyTorch's dense product would build its
kernels afresh for each new prompt length (a feed of 600–650 rows on the Xeon: 19–27 ms at a new length,
10–13 at one met before, 9–12 on the 8-bit records; docs/measurements/speed.md). Without the kernel, the
dense weights, in row buckets (row_buckets.py), and attention on PyTorch's kernel. The projections are
stacked (q, k, v; gate, up), so the step holds its own copy of the draft's weights (about 30 MB with the
8-bit codes); the target's embedding it borrows.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from . import fused_attention
from .block_attention import attend_in_blocks, mask_bias, own_slots, padded_width
from .int8_draft import int8_product
from .lean_layer import rms_norm
from .row_buckets import linear_in_buckets
from .static_pass import K_MAX, rotate


class StaticDraftStep(nn.Module):
    """The step over the draft's tensors (stacked copies; the embedding shared) and its static cache."""

    def __init__(self, draft, max_len: int = 2048, fused: bool = False):
        """fused: a step's attention on the fused kernel (runtime/fused_attention.py, loaded)."""
        super().__init__()
        self.fused = fused
        layer = draft.layers[0]
        attn = layer.self_attn
        self.n_query, self.n_kv, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.eps, self.max_len = layer.input_layernorm.eps, max_len
        self.norm_before_residual = layer.norm_before_residual
        dtype = draft.fc.weight.dtype
        products = {
            "qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
            "o": (attn.o_proj,),
            "gate_up": (layer.mlp.gate_proj, layer.mlp.up_proj),
            "down": (layer.mlp.down_proj,),
            "lm_head": (draft.lm_head,),
        }
        self.int8 = all(hasattr(m, "int8") for ms in products.values() for m in ms)
        self.n_int8 = (
            len(draft.lm_head.int8) if self.int8 else 0
        )  # 1: the GGUF kernel's records; 2: PyTorch's
        self.int8_rows = sys.maxsize if self.n_int8 == 1 else K_MAX  # the GGUF kernel takes any number
        for name, modules in products.items():  # stacked output rows: exact for per-row or per-block scales
            self.register_buffer(name, torch.cat([m.weight.detach() for m in modules]), persistent=False)
            for j, parts in enumerate(zip(*(m.int8 for m in modules)) if self.int8 else ()):
                self.register_buffer(f"{name}_int8_{j}", torch.cat(parts), persistent=False)
        self.register_buffer("embed", draft.embed_tokens.weight.detach(), persistent=False)
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            self.register_buffer(name, getattr(layer, name).weight.detach(), persistent=False)
        self.register_buffer("final_norm", draft.norm.weight.detach(), persistent=False)
        device = draft.fc.weight.device
        cos, sin = draft.rotary(torch.arange(max_len, device=device))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name in ("keys", "values"):
            slots = torch.zeros(self.n_kv, padded_width(max_len), self.head_dim, dtype=dtype, device=device)
            self.register_buffer(name, slots, persistent=False)

    n_layers = 1  # its cache, as compiled_pass.CompiledPass reads a static cache

    def buffers_of_layer(self, i: int):
        return self.keys, self.values

    def forward(self, tokens, positions, mask, features):
        """tokens, positions [p] (the rotary embedding's); mask [p, S] (S = the used length after this step;
        each row writes the last slot it sees: `own_slots`); features [p, H] -> (hidden [p, H], logits
        [p, Vd]: a draft tree expands several rows at once)."""
        residual = features
        features = rms_norm(features, self.hidden_norm, self.eps)
        if self.norm_before_residual:
            residual = features
        embeds = rms_norm(F.embedding(tokens, self.embed).to(features.dtype), self.input_layernorm, self.eps)
        x = torch.cat([embeds, features], dim=-1)
        p, n_q, n_kv, dim = x.shape[0], self.n_query, self.n_kv, self.head_dim
        qkv = self._product("qkv", x).view(p, n_q + 2 * n_kv, dim)
        qk = rotate(qkv[:, : n_q + n_kv], self.cos[positions][:, None], self.sin[positions][:, None])
        slots = own_slots(mask)
        self.keys.index_copy_(1, slots, qk[:, n_q:].transpose(0, 1))
        self.values.index_copy_(1, slots, qkv[:, n_q + n_kv :].transpose(0, 1))
        out = self._attend(qk[:, :n_q], mask)
        hidden = residual + self._product("o", out)
        gate, up = self._product("gate_up", rms_norm(hidden, self.post_attention_layernorm, self.eps)).chunk(
            2, -1
        )
        hidden = hidden + self._product("down", F.silu(gate) * up)
        # a feed longer than a step (the prompt's features) is a chain's: only its last row drafts
        heads = hidden if p <= K_MAX else hidden[-1:]
        return hidden, self._product("lm_head", rms_norm(heads, self.final_norm, self.eps))

    def _attend(self, query: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """query [p, n_q, D] over the used slots: the fused kernel or float32 products for a step (the
        graph's), PyTorch's kernel for a longer feed (eager: a prompt's scores in float32 would take hundreds
        of MB)."""
        if query.shape[0] <= K_MAX and self.fused:
            return fused_attention.attend(query, self.keys, self.values, mask)
        if query.shape[0] <= K_MAX:
            return attend_in_blocks(query, self.keys, self.values, mask_bias(mask, self.n_query // self.n_kv))
        used = mask.shape[1]
        keys, values = self.keys[None, :, :used], self.values[None, :, :used]
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1)[None], keys, values, attn_mask=mask, enable_gqa=True
        )
        return out[0].transpose(0, 1).reshape(query.shape[0], -1)

    def _product(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        if self.int8 and rows.shape[0] <= self.int8_rows:
            return int8_product(rows, *(getattr(self, f"{name}_int8_{j}") for j in range(self.n_int8)))
        return linear_in_buckets(rows, getattr(self, name))
