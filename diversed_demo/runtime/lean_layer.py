"""A Llama decoder layer for passes over 4-bit weights: one product for q, k and v, one for gate and up, the
rotary embedding applied to q and k at once, and no submodule calls in between.

With the weights at 4 bits a decoding pass is mostly per-call overhead of small operations and modules; this
layer cuts their number. It takes every pass the 4-bit kernel takes (a few tokens on PyTorch's, a prompt too
on the AMX one); longer passes run transformers' own layer on the dense weights.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, eager_attention_forward, rotate_half

from ..core.cache import cache_keyword
from .class_swap import swap_class
from .gguf_int4 import GgufLinear, int4_product, stack_operands, uses_quantised


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in fewer operations (float32 inside, weight applied in the input dtype)."""
    return weight * torch.rms_norm(hidden.float(), hidden.shape[-1:], eps=eps).to(hidden.dtype)


# transformers 5.24 renamed a layer's past_key_values argument to cache: take either, hand on the one it has.
CACHE_ARGUMENT = cache_keyword(LlamaDecoderLayer.forward)

# The kernels pack output rows in blocks of 64 (PyTorch's with AVX-512; 32 with AVX2 and in the AMX one):
# projections whose row counts are multiples of it stack by concatenating their packed operands.
PACKED_ROWS = 64


def fused_int4(*linears: GgufLinear) -> tuple[torch.Tensor, ...]:
    """The int4 operands of several projections of the same input, stacked: one product computes them all."""
    return stack_operands(*(m.operands for m in linears))


def fusable(projections) -> bool:
    return all(
        type(p) is GgufLinear and p.bias is None and p.out_features % PACKED_ROWS == 0 for p in projections
    )


class LeanLlamaLayer(LlamaDecoderLayer):
    """LlamaDecoderLayer whose passes that the 4-bit kernel takes (`gguf_int4.uses_quantised`: a few tokens on
    PyTorch's, any number on the AMX one) take the short path above (`qkv` and `gate_up`: the fused 4-bit
    operands); same parameters and state dict."""

    qkv: tuple[torch.Tensor, ...]
    gate_up: tuple[torch.Tensor, ...]

    def forward(self, hidden_states, attention_mask=None, position_ids=None, **kwargs):
        cache = kwargs.pop("cache", None)
        cache = kwargs.pop("past_key_values", None) if cache is None else cache
        batch, length, width = hidden_states.shape
        on_blocks = uses_quantised(self.qkv, hidden_states.reshape(-1, width), self.self_attn.q_proj.weight)
        if not on_blocks or kwargs.get("output_attentions"):
            kwargs[CACHE_ARGUMENT] = cache
            return super().forward(hidden_states, attention_mask, position_ids, **kwargs)
        norm = self.input_layernorm
        normed = rms_norm(hidden_states, norm.weight, norm.variance_epsilon).view(-1, width)
        attended = self._attention(normed, batch, attention_mask, cache, kwargs["position_embeddings"])
        hidden_states = hidden_states + attended.view(batch, length, width)
        norm = self.post_attention_layernorm
        normed = rms_norm(hidden_states, norm.weight, norm.variance_epsilon).view(-1, width)
        return hidden_states + self._mlp(normed).view(batch, length, width)

    def _attention(self, rows, batch, attention_mask, cache, position_embeddings):
        attn, config = self.self_attn, self.self_attn.config
        n_q, n_kv = config.num_attention_heads, config.num_key_value_heads
        qkv = int4_product(rows, *self.qkv).view(batch, -1, n_q + 2 * n_kv, attn.head_dim)
        cos, sin = (table.unsqueeze(2) for table in position_embeddings)  # [B, T, 1, D]
        qk = qkv[:, :, : n_q + n_kv]
        qk = qk * cos + rotate_half(qk) * sin  # transformers' rotary embedding, on q and k together
        query, key = qk[:, :, :n_q].transpose(1, 2), qk[:, :, n_q:].transpose(1, 2)
        value = qkv[:, :, n_q + n_kv :].transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, attn.layer_idx)
        functions, name = ALL_ATTENTION_FUNCTIONS, config._attn_implementation
        interface = functions.get_interface(name, eager_attention_forward)
        out, _ = interface(attn, query, key, value, attention_mask, dropout=0.0, scaling=attn.scaling)
        return int4_product(out.reshape(len(rows), -1), *attn.o_proj.operands)

    def _mlp(self, rows):
        mlp = self.mlp
        gate, up = int4_product(rows, *self.gate_up).chunk(2, -1)
        return int4_product(mlp.act_fn(gate) * up, *mlp.down_proj.operands)


def use_lean_layers(model: torch.nn.Module) -> int:
    """Switch every Llama layer whose seven projections are bias-free GgufLinear (row counts stacking whole
    packed blocks) to LeanLlamaLayer, or fuse a lean layer's operands anew (after its projections moved to
    another kernel); returns how many were switched or fused."""
    switched = 0
    for layer in model.modules():
        if type(layer) not in (LlamaDecoderLayer, LeanLlamaLayer):
            continue
        attn, mlp = layer.self_attn, layer.mlp
        projections = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj]
        projections.append(mlp.down_proj)
        if fusable(projections):
            qkv = fused_int4(attn.q_proj, attn.k_proj, attn.v_proj)
            swap_class(layer, LeanLlamaLayer, qkv=qkv, gate_up=fused_int4(mlp.gate_proj, mlp.up_proj))
            switched += 1
    return switched
