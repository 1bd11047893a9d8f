"""The 4-bit target's whole decoding pass as one module over a static KV cache, so that AOTInductor can
compile it into one graph (runtime/compiled_pass.py).

Eager, a pass of the lean int4 layers is mostly per-operation overhead: 30 layers of small products,
norms, rotary embeddings and attention, each a Python call and a dispatch. As one compiled graph the
elementwise operations fuse and the overhead goes (docs/measurements/speed.md). A compiled graph needs
fixed tensors, so the cache is preallocated: per layer one key and one value buffer of `max_len` slots,
written in place at the new positions. The used length arrives as the width of the mask, so a pass reads
only the used slots.

A pass feeds k ≤ K_MAX new tokens of one sequence and returns what `core.cache.CachedLM` returns: logits
[k, V], the last hidden states [k, H] (after the final norm) and the aux hidden states [k, n_aux·H]
(transformers' `hidden_states[i]`, the input of layer i), which an EAGLE-3 draft reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from ..core.config import PASS_ROWS
from . import fused_attention
from .block_attention import attend_in_blocks, mask_bias, own_slots, padded_width
from .gguf_int4 import int4_product
from .lean_layer import LeanLlamaLayer, rms_norm

K_MAX = PASS_ROWS  # new tokens a compiled pass takes: a chain's step, or a draft tree's of up to 15 nodes


def compilable(model) -> bool:
    """Whether the model's layers are all lean 4-bit layers, which this pass reads."""
    layers = model.get_decoder().layers
    return len(layers) > 0 and all(isinstance(layer, LeanLlamaLayer) for layer in layers)


class StaticPass(nn.Module):
    """The pass over the model's own tensors (held as buffers, not copied) and its static cache."""

    def __init__(self, model, aux_layer_ids=(), max_len: int = 2048, fused: bool = False):
        """fused: attention on the fused kernel (runtime/fused_attention.py, loaded), else in blocks."""
        super().__init__()
        self.fused = fused
        config, decoder = model.config.get_text_config(), model.get_decoder()
        self.n_query, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_query
        self.eps, self.max_len = config.rms_norm_eps, max_len
        self.aux_layer_ids = tuple(aux_layer_ids)
        dtype = decoder.embed_tokens.weight.dtype
        self.register_buffer("embed", decoder.embed_tokens.weight.detach(), persistent=False)
        head = model.get_output_embeddings()
        self.head_operands = len(getattr(head, "operands", ()))  # an 8-bit head on the AMX kernel: 1
        for j, operand in enumerate(getattr(head, "operands", ())):
            self.register_buffer(f"lm_head_{j}", operand, persistent=False)
        if not self.head_operands:
            self.register_buffer("lm_head", head.weight.detach(), persistent=False)
        self.register_buffer("final_norm", decoder.norm.weight.detach(), persistent=False)
        cos, sin = self._rotary_tables(decoder.rotary_emb, max_len, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for i, layer in enumerate(decoder.layers):
            tensors = {
                "qkv": layer.qkv,
                "o": layer.self_attn.o_proj.operands,
                "gate_up": layer.gate_up,
                "down": layer.mlp.down_proj.operands,
            }
            for name, operands in tensors.items():
                for j, operand in enumerate(operands):
                    self.register_buffer(f"l{i}_{name}_{j}", operand, persistent=False)
                self.n_operands = len(operands)  # 2 on PyTorch's int4 kernel, 1 on the AMX one
            self.register_buffer(f"l{i}_norm1", layer.input_layernorm.weight.detach(), persistent=False)
            self.register_buffer(
                f"l{i}_norm2", layer.post_attention_layernorm.weight.detach(), persistent=False
            )
            for name in ("keys", "values"):
                slots = torch.zeros(
                    self.n_kv, padded_width(max_len), self.head_dim, dtype=dtype
                )  # a mask's width
                self.register_buffer(f"l{i}_{name}", slots, persistent=False)
        self.n_layers = len(decoder.layers)

    @staticmethod
    def _rotary_tables(rotary, max_len: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for every position, as transformers' rotary embedding computes them."""
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * rotary.inv_freq.float()[None]
        angles = torch.cat((angles, angles), -1)
        scale = rotary.attention_scaling
        return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)

    def buffers_of_layer(self, i: int):
        return (getattr(self, f"l{i}_{name}") for name in ("keys", "values"))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        """tokens, positions [k] (the rotary embedding's); mask [k, S] (S = the used length after this pass;
        each row writes the last slot it sees: `own_slots`) -> (logits [k, V], last hidden [k, H], aux
        [k, n_aux·H])."""
        k = mask.shape[0]
        hidden = F.embedding(tokens, self.embed)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [k, 1, D]
        slots = own_slots(mask)
        seen = mask if self.fused else mask_bias(mask, self.n_query // self.n_kv)
        aux = []
        for i in range(self.n_layers):
            if i in self.aux_layer_ids:
                aux.append(hidden)
            hidden = hidden + self._attention(i, hidden, slots, cos, sin, seen)
            hidden = hidden + self._mlp(i, hidden)
        last = rms_norm(hidden, self.final_norm, self.eps)
        aux_states = torch.cat(aux, -1) if aux else hidden.new_zeros(k, 0)
        return self._head(last), last, aux_states

    def _head(self, last: torch.Tensor) -> torch.Tensor:
        if self.head_operands:
            return int4_product(last, *(getattr(self, f"lm_head_{j}") for j in range(self.head_operands)))
        return F.linear(last, self.lm_head)

    def _product(self, i: int, name: str, rows: torch.Tensor) -> torch.Tensor:
        return int4_product(rows, *(getattr(self, f"l{i}_{name}_{j}") for j in range(self.n_operands)))

    def _mlp(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self._product(
            i, "gate_up", rms_norm(hidden, getattr(self, f"l{i}_norm2"), self.eps)
        ).chunk(2, -1)
        return self._product(i, "down", F.silu(gate) * up)

    def _attention(self, i, hidden, slots, cos, sin, seen):
        """Layer i's attention: q, k, v in one 4-bit product, the rotary embedding, the new keys and values
        written into the cache, then attention over the used slots (seen: the mask, or its bias in blocks)."""
        k, n_q, n_kv, dim = hidden.shape[0], self.n_query, self.n_kv, self.head_dim
        normed = rms_norm(hidden, getattr(self, f"l{i}_norm1"), self.eps)
        qkv = self._product(i, "qkv", normed).view(k, n_q + 2 * n_kv, dim)
        qk = rotate(qkv[:, : n_q + n_kv], cos, sin)
        keys, values = self.buffers_of_layer(i)
        keys.index_copy_(1, slots, qk[:, n_q:].transpose(0, 1))
        values.index_copy_(1, slots, qkv[:, n_q + n_kv :].transpose(0, 1))
        attend = fused_attention.attend if self.fused else attend_in_blocks
        return self._product(i, "o", attend(qk[:, :n_q], keys, values, seen))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of x [k, heads, D] at cos, sin [k, 1, D]."""
    return x * cos + rotate_half(x) * sin
