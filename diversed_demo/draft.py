"""The two kinds of draft, behind the one interface the decoder sees.

A draft proposes n tokens, each with its distribution q over the whole vocabulary and the hidden state
an ensemble head reads, then learns the verified sequence through `observe` and drops whatever the
target rejected. Neither kind ever recomputes the prefix: both keep a KV cache and crop it.

- StandaloneDraft: a causal LM of its own (any Hugging Face model that shares the target's tokenizer).
- FeatureDraft: an EAGLE-3 draft (eagle.py) that reads the target's hidden states of verified
  positions, so after every verification it restarts from the target's true features.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .eagle import Eagle3Draft, cached_attention
from .verify import sample, sampling_probs


class Sampler:
    """Turns logits into (token, probs) the same way for draft and target: temperature 0 is greedy."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator):
        self.temperature, self.top_p, self.generator = temperature, top_p, generator

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return sampling_probs(logits, self.temperature, self.top_p)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = self.probs(logits)
        token = probs.argmax(-1) if self.greedy else sample(probs, self.generator)
        return token, probs


class CachedLM:
    """A causal LM with its KV cache and the number of sequence tokens the cache holds."""

    def __init__(self, model, vocab_size: int, aux_layer_ids=()):
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.vocab_size = vocab_size
        self.aux_layer_ids = list(aux_layer_ids)  # hidden_states to return besides the last, for a feature draft
        self.cache = DynamicCache(config=model.config)
        self.length = 0

    def forward(self, tokens: torch.Tensor, keep: int):
        """Feed tokens [k]; return logits [keep, V] and last hidden states [keep, H] of the last `keep`,
        and the aux hidden states of all k tokens ([k, n_aux·H], or None without aux layers)."""
        out = self.decoder(input_ids=tokens.view(1, -1), past_key_values=self.cache, use_cache=True,
                           output_hidden_states=bool(self.aux_layer_ids))
        hidden = out.last_hidden_state[0, -keep:]
        logits = self.lm_head(hidden)[:, : self.vocab_size]
        self.length += tokens.numel()
        aux = torch.cat([out.hidden_states[i][0] for i in self.aux_layer_ids], -1) if self.aux_layer_ids else None
        return logits, hidden, aux

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length


class StandaloneDraft:
    """A draft LM of its own: it feeds the verified tokens it has not seen, then samples n tokens."""

    aux_layer_ids: list[int] = []

    def __init__(self, model, vocab_size: int):
        self.lm = CachedLM(model, vocab_size)

    def ready(self, length: int) -> bool:
        return True

    def propose(self, sequence: torch.Tensor, n: int, sampler: Sampler):
        """Draft tokens [n], their q [n, V] and the draft's hidden states [n, H]."""
        feed, tokens, probs, hidden = sequence[self.lm.length:], [], [], []
        for _ in range(n):
            logits, last, _ = self.lm.forward(feed, keep=1)
            token, q = sampler(logits[0])
            tokens.append(token.view(1))
            probs.append(q)
            hidden.append(last[0])
            feed = token.view(1)
        return torch.cat(tokens), torch.stack(probs), torch.stack(hidden)

    def observe(self, length: int, target_features=None) -> None:
        """The sequence is now `length` tokens long; keep the cache on its verified part (all but the last)."""
        self.lm.rollback(length - 1)


class FeatureDraft:
    """An EAGLE-3 draft over the target's features.

    Its cache entry i holds (target features at i, token i + 1). Proposing feeds the verified entries it
    has not seen (true features, from `observe`) in one pass, then drafts on its own outputs.
    """

    def __init__(self, model: Eagle3Draft):
        self.model = model
        self.aux_layer_ids = model.aux_layer_ids
        self.cache: list = []
        self.length = 0  # cache entries that are verified
        self.pending = None  # true features [P, n_aux·H] of positions length .. length + P − 1

    def ready(self, length: int) -> bool:
        """Whether the features of every verified position but the last are known (not before the target's first pass)."""
        return self.pending is not None and self.length + len(self.pending) >= length - 1

    def propose(self, sequence: torch.Tensor, n: int, sampler: Sampler):
        model, end = self.model, len(sequence) - 1
        positions = torch.arange(self.length, end, device=sequence.device)
        features = model.fuse(self.pending[: end - self.length])
        hidden = model.layer(features[None], sequence[self.length + 1: end + 1][None], positions[None],
                             self._attend)[0, -1:]
        self.length, self.pending = end, None
        tokens, probs, states = [], [], []
        for step in range(n):
            token, q = sampler(model.logits(hidden)[0])
            tokens.append(token.view(1))
            probs.append(q)
            states.append(hidden[0])
            if step < n - 1:  # the draft's own output stands in for the target's features of the next position
                hidden = model.layer(hidden[None], token.view(1, 1), positions.new_tensor([[end + step]]),
                                     self._attend)[0]
        return torch.cat(tokens), torch.stack(probs), torch.stack(states)

    def _attend(self, q, k, v):
        return cached_attention(self.cache, q, k, v)

    def observe(self, length: int, target_features=None) -> None:
        """Drop the speculative entries and queue the target's features of newly verified positions."""
        if self.cache and self.cache[0].shape[2] > self.length:
            self.cache[:] = [t[:, :, : self.length] for t in self.cache]
        if target_features is not None:
            self.pending = target_features if self.pending is None else torch.cat([self.pending, target_features])
