"""An EAGLE-3 draft: one decoder layer over the target's own features, in vLLM `speculators` format.

At position i the draft reads the target's hidden states at position i (three layers, low/middle/high,
fused by `fc`) and the embedding of the token that follows, x_{i+1}; its output h_i predicts x_{i+2}.
Drafting further, h_i itself stands in for the target's features of the next position. The layer's
attention takes [embedding; features] (2·H wide) and its residual stream is the features.

The weights and config.json follow speculators' Eagle3DraftModel (keys `fc`, `layers.0.*`, `norm`,
`lm_head`, `d2t`, `t2d`; `eagle_aux_hidden_state_layer_ids`, `draft_vocab_size`), so vLLM can serve the
draft. `eagle_aux_hidden_state_layer_ids` = k means the input of target layer k, which is Hugging Face's
`hidden_states[k]`. The token embedding is the target's own (frozen, not stored); `lm_head` covers the
draft vocabulary, target ids `arange(draft_vocab_size) + d2t`, and is stored. `Eagle3Draft.save` writes
a draft; `models.load_eagle3` loads one for a target, checking that it fits.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from ..common.files import atomic_write

WEIGHTS_FILE = "model.safetensors"


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class Eagle3Layer(nn.Module):
    """EAGLE-3's first decoder layer. `attend(q, k, v)` decides what each query sees: the decoding cache
    or the training-time-test pattern (see `ttt_attention`)."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        intermediate: int,
        eps: float,
        norm_before_residual: bool,
    ):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim)
        self.mlp = MLP(hidden, intermediate)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, features, cos, sin, attend):
        """embeds, features [B, T, H]; cos, sin [B, T, head_dim] -> [B, T, H]."""
        attn = self.self_attn
        residual = features
        features = self.hidden_norm(features)
        if self.norm_before_residual:
            residual = features
        x = torch.cat([self.input_layernorm(embeds), features], dim=-1)
        batch, length, _ = x.shape

        def heads(proj, n):
            return proj(x).view(batch, length, n, attn.head_dim).transpose(1, 2)

        q, k, v = (
            heads(attn.q_proj, attn.heads),
            heads(attn.k_proj, attn.kv_heads),
            heads(attn.v_proj, attn.kv_heads),
        )
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = attend(q, k, v).transpose(1, 2).reshape(batch, length, -1)
        hidden = residual + attn.o_proj(out)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Draft(nn.Module):
    reads_target_features = True  # core.draft serves it as a FeatureDraft

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        layer = config["transformer_layer_config"]
        hidden = layer["hidden_size"]
        self.hidden_size = hidden
        self.vocab_size = layer["vocab_size"]
        self.aux_layer_ids = list(config["eagle_aux_hidden_state_layer_ids"])
        # What the rest of the project reads from a model's text config (pair checks, head identity).
        self.text_config = SimpleNamespace(
            model_type="eagle3", hidden_size=hidden, num_hidden_layers=1, vocab_size=self.vocab_size
        )
        head_dim = layer.get("head_dim") or hidden // layer["num_attention_heads"]
        self.embed_tokens = nn.Embedding(self.vocab_size, hidden).requires_grad_(False)
        self.fc = nn.Linear(len(self.aux_layer_ids) * hidden, hidden, bias=False)
        self.layers = nn.ModuleList(
            [
                Eagle3Layer(
                    hidden,
                    layer["num_attention_heads"],
                    layer["num_key_value_heads"],
                    head_dim,
                    layer["intermediate_size"],
                    layer["rms_norm_eps"],
                    config.get("norm_before_residual", False),
                )
            ]
        )
        self.norm = RMSNorm(hidden, layer["rms_norm_eps"])
        draft_vocab = config["draft_vocab_size"]
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False).requires_grad_(False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(self.vocab_size, dtype=torch.bool)
            if draft_vocab == self.vocab_size
            else torch.zeros(self.vocab_size, dtype=torch.bool),
        )
        theta = (layer.get("rope_parameters") or {}).get("rope_theta") or layer.get("rope_theta", 10000.0)
        self.register_buffer(
            "inv_freq", 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim), persistent=False
        )

    # ---------------------------------------------------------- pieces shared by decoding and training

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in lm_head row order."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def set_vocab(self, token_ids: torch.Tensor, target_lm_head: torch.Tensor) -> None:
        """Restrict the draft to `token_ids` (sorted), with the target's LM-head rows for them."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long).unique()
        if len(token_ids) != len(self.d2t):
            raise ValueError(f"a draft vocabulary of {len(self.d2t)} ids is needed, got {len(token_ids)}")
        with torch.no_grad():
            self.d2t.copy_(token_ids - torch.arange(len(token_ids)))
            self.t2d.zero_()
            self.t2d[token_ids] = True
            self.lm_head.weight.copy_(target_lm_head[token_ids])

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        dtype = self.fc.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def fuse(self, target_features: torch.Tensor) -> torch.Tensor:
        """The target's aux hidden states, concatenated [..., n_aux·H] -> the draft's input features
        [..., H]."""
        return self.fc(target_features.to(self.fc.weight.dtype))

    def layer(self, features, token_ids, positions, attend) -> torch.Tensor:
        """features [B, T, H] (fused target features or the draft's own output), token_ids [B, T] the
        token after each position, positions [B, T] -> the draft's hidden state [B, T, H] (pre-norm)."""
        cos, sin = self.rotary(positions)
        embeds = self.embed_tokens(token_ids).to(features.dtype)
        return self.layers[0](embeds, features, cos, sin, attend)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., draft_vocab]."""
        return self.lm_head(self.norm(hidden))

    def full_probs(self, small_probs: torch.Tensor) -> torch.Tensor:
        """A distribution over the draft vocabulary [..., draft_vocab] -> over the whole one [..., V]."""
        full = small_probs.new_zeros((*small_probs.shape[:-1], self.vocab_size))
        return full.index_copy_(-1, self.draft_token_ids, small_probs)

    # ------------------------------------------------------------------ files

    def save(self, directory, dtype: torch.dtype = torch.float16) -> None:
        """config.json + model.safetensors (without the target's embedding), written atomically."""
        from safetensors.torch import save_file

        directory = Path(directory)
        state = {
            k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
            for k, v in self.state_dict().items()
            if not k.startswith("embed_tokens")
        }
        atomic_write(
            directory / "config.json", lambda tmp: tmp.write_text(json.dumps(self.config, indent=2) + "\n")
        )
        atomic_write(
            directory / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"})
        )


def new_config(target_config, aux_layer_ids=None, draft_vocab_size: int = 8192, verifier: str = "") -> dict:
    """A speculators EAGLE-3 config for a draft of one decoder layer shaped like the target's layers."""
    text = target_config.get_text_config()
    n = text.num_hidden_layers
    aux_layer_ids = list(aux_layer_ids or [2, n // 2, n - 3])  # speculators' default for an n-layer target
    layer = {
        key: getattr(text, key)
        for key in (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
            "rms_norm_eps",
            "hidden_act",
        )
    }
    layer.update(
        model_type="llama",
        num_hidden_layers=1,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        rope_parameters=dict(
            getattr(text, "rope_parameters", None)
            or {"rope_type": "default", "rope_theta": getattr(text, "rope_theta", 10000.0)}
        ),
    )
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": min(draft_vocab_size, text.vocab_size),
        "norm_before_residual": True,
        "target_hidden_size": text.hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier or None,
                "architectures": list(target_config.architectures or []),
            },
        },
        "transformer_layer_config": layer,
    }


def target_features(hidden_states, aux_layer_ids) -> torch.Tensor:
    """Concatenate the target's aux hidden states ([..., n_aux·H]) from Hugging Face's `hidden_states`."""
    return torch.cat([hidden_states[i] for i in aux_layer_ids], dim=-1)


# ---------------------------------------------------------------------- attention patterns
