"""The target's KV cache for one sequence or a batch of rows (rollback by cropping, holes where rows
differ), and the feature draft's cached attention."""

from __future__ import annotations

import inspect
import weakref

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def cache_keyword(forward) -> str:
    """The argument under which a model's or layer's forward takes its KV cache: transformers 5.24 renamed
    past_key_values (the old name then warns) to cache; earlier versions know only the old one."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


MAX_FEED = 8  # new tokens a chain's step feeds: up to 7 drafts (or copies) and the unseen token


class CachedLM:
    """A causal LM with its KV cache and the number of sequence tokens the cache holds, for one sequence or
    a batch of rows.

    One row crops its cache on rollback. Rows of a batch advance together through one cache (each step
    feeds every row the same number of slots), so a row's rolled-back entries cannot be cropped while
    another row still needs the slots after them: they become holes, masked out of attention, and each
    slot keeps its row's position for the rotary embedding. Trailing slots no row needs are cropped.
    """

    def __init__(self, model, vocab_size: int, aux_layer_ids=(), rows: int = 1, runner=None):
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.vocab_size = vocab_size
        self.aux_layer_ids = list(
            aux_layer_ids
        )  # hidden_states to return besides the last, for a feature draft
        self.cache = DynamicCache(config=model.config)
        self.cache_keyword = cache_keyword(self.decoder.forward)
        self.lengths = [0] * rows  # sequence tokens each row's cache holds
        self.slot_positions = None  # [rows, slots]: each slot's position in its row's sequence, −1 for a hole
        # `runner`: a compiled or graphed pass of the model (runtime/compiled_pass.py), lent to one decode
        # at a time. While this one-row LM holds it, passes of a few tokens after the prompt run there, over
        # its static cache instead of `cache`.
        self.runner, self.compiled = (runner if rows == 1 else None), None

    @property
    def length(self) -> int:
        return self.lengths[0]

    def forward(self, tokens: torch.Tensor, keep: int, rows=None):
        """Feed one row's tokens [k]; return logits [keep, V] and last hidden states [keep, H] of the last
        `keep`, and the aux hidden states of all k tokens ([k, n_aux·H], or None without aux layers).
        `rows`: a draft tree's (positions [k], visible [k, length + k]: the slots each token sees, as
        `tree_feed` makes them), else the tokens follow each other."""
        k = tokens.numel()
        if self.compiled is not None and not self.compiled.fits(self.lengths[0], k):
            self._leave_compiled()
        if self.compiled is not None:
            try:
                logits, hidden, aux = self.compiled.forward(tokens, self.lengths[0], rows=rows)
            except RuntimeError as error:  # the decode goes on eagerly, from the slots it had
                self.compiled.fail(error)
                self._leave_compiled()
            else:
                self.lengths[0] += k
                return (
                    logits[k - keep :, : self.vocab_size],
                    hidden[k - keep :],
                    aux if self.aux_layer_ids else None,
                )
        tree = {} if rows is None else {"position_ids": rows[0][None], "attention_mask": rows[1][None, None]}
        out = self.decoder(
            input_ids=tokens.view(1, -1),
            use_cache=True,
            **{self.cache_keyword: self.cache},
            output_hidden_states=bool(self.aux_layer_ids),
            **tree,
        )
        self.lengths[0] += k
        outputs = self._outputs(out, 0, k, keep)
        self._enter_compiled()
        return outputs

    def _enter_compiled(self) -> None:
        """Move the cache into the model's compiled pass, if it has one for these aux layers and is free."""
        compiled = self.runner
        if compiled is None or self.slot_positions is not None or not compiled.fits(self.length, 1):
            return
        if self.aux_layer_ids and list(self.aux_layer_ids) != list(compiled.module.aux_layer_ids):
            return
        if not compiled.acquire(self):
            return  # another decode holds it: this one stays eager
        weakref.finalize(self, compiled.release, id(self))
        compiled.load(list(self.cache), self.length)
        self.compiled, self.cache = compiled, None

    def _leave_compiled(self) -> None:
        """Go on eagerly from the compiled pass's static cache (a long pass, or the cache is full)."""
        layers = self.compiled.layers(self.length)
        self.cache = DynamicCache(layers, config=self.model.config)
        self.close()

    def close(self) -> None:
        """Give the compiled pass back to other decodes (also done when this LM is garbage)."""
        if self.compiled is not None:
            self.compiled.release(id(self))
        self.compiled, self.runner = None, None

    def forward_rows(self, feeds: list[torch.Tensor], keeps: list[int]) -> list[tuple]:
        """`forward` for every row of the batch in one pass: feeds[r] [k_r] and keeps[r] as there."""
        if len(feeds) != len(self.lengths):
            raise ValueError(f"{len(feeds)} feeds for a batch of {len(self.lengths)} rows")
        if self.slot_positions is None and len(feeds) == 1:  # one sequence: no holes, no mask
            return [self.forward(feeds[0], keeps[0])]
        if self.slot_positions is None:
            return self._first_pass(feeds, keeps)
        width = max(len(f) for f in feeds)
        device = feeds[0].device
        offsets = torch.arange(width, device=device)
        tokens = torch.stack([torch.cat([f, f.new_zeros(width - len(f))]) for f in feeds])
        starts = torch.tensor(self.lengths, device=device)[:, None]
        real = offsets[None] < torch.tensor([len(f) for f in feeds], device=device)[:, None]
        positions = torch.where(real, starts + offsets, -1)
        self.slot_positions = torch.cat([self.slot_positions, positions], 1)
        out = self.decoder(
            input_ids=tokens,
            use_cache=True,
            **{self.cache_keyword: self.cache},
            attention_mask=(self.slot_positions >= 0).long(),
            position_ids=(starts + offsets),
            output_hidden_states=bool(self.aux_layer_ids),
        )
        for r, f in enumerate(feeds):
            self.lengths[r] += len(f)
        return [self._outputs(out, r, len(f), keep) for r, (f, keep) in enumerate(zip(feeds, keeps))]

    def _first_pass(self, feeds: list[torch.Tensor], keeps: list[int]) -> list[tuple]:
        """The batch's first pass (the prompts): each distinct feed runs alone, once however many rows share
        it (an example's points, a prompt's rollouts), so no row pays for another's padding; then the
        caches join, the shorter ones padded with holes."""
        alone, runs = {}, []  # (tokens, keep) -> (its one-row cache as [(keys, values, …)], its outputs)
        for feed, keep in zip(feeds, keeps):
            key = (tuple(feed.tolist()), keep)
            if key not in alone:
                single = CachedLM(self.model, self.vocab_size, self.aux_layer_ids)
                outputs = single.forward(feed, keep)
                alone[key] = (list(single.cache), outputs)
            runs.append(alone[key])
        caches = [cache for cache, _ in runs]
        width = max(len(f) for f in feeds)
        pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2]))  # noqa: E731
        layers = [
            (torch.cat([pad(c[i][0]) for c in caches]), torch.cat([pad(c[i][1]) for c in caches]))
            for i in range(len(caches[0]))
        ]
        self.cache = DynamicCache(layers, config=self.model.config)
        self.lengths = [len(f) for f in feeds]
        slots = torch.arange(width, device=feeds[0].device)
        self.slot_positions = torch.stack([torch.where(slots < n, slots, -1) for n in self.lengths])
        return [outputs for _, outputs in runs]

    def _outputs(self, out, row: int, fed: int, keep: int):
        hidden = out.last_hidden_state[row, fed - keep : fed]
        logits = self.lm_head(hidden)[:, : self.vocab_size]
        aux = (
            torch.cat([out.hidden_states[i][row, :fed] for i in self.aux_layer_ids], -1)
            if self.aux_layer_ids
            else None
        )
        return logits, hidden, aux

    def rollback(self, length: int, row: int = 0) -> None:
        """Keep the row's first `length` sequence tokens."""
        if length >= self.lengths[row]:
            return
        if self.compiled is not None:  # slots past the length are overwritten by the next pass
            self.lengths[row] = length
            return
        if self.slot_positions is None:
            self.cache.crop(
                length - self.lengths[row]
            )  # transformers takes the number of slots to drop, negated
            self.lengths[row] = length
            return
        self.lengths[row] = length
        self.slot_positions[row][self.slot_positions[row] >= length] = -1
        used = (self.slot_positions >= 0).any(0).nonzero()
        keep = int(used[-1]) + 1 if len(used) else 0
        if keep < self.slot_positions.shape[1]:
            self.cache.crop(keep - self.slot_positions.shape[1])
            self.slot_positions = self.slot_positions[:, :keep]

    def keep_path(self, length: int, kept: torch.Tensor) -> None:
        """One row's cache keeps its first `length` slots and then the slots `kept` [m] (a draft tree's kept
        path, in order), moved up behind them: as a chain's cache would hold the same tokens."""
        in_place = 0  # a leading run of the path already where it belongs (first children) stays
        for slot in kept.tolist():
            if slot != length + in_place:
                break
            in_place += 1
        length, kept = length + in_place, kept[in_place:]
        if self.compiled is not None:  # slots past the length are overwritten by the next pass
            if len(kept):
                self.compiled.keep_slots(length, kept)
        else:
            for layer in self.cache.layers if len(kept) else ():
                for name in ("keys", "values"):
                    entries = getattr(layer, name)
                    entries[:, :, length : length + len(kept)] = entries[:, :, kept]
            self.cache.crop(length + len(kept) - self.lengths[0])  # transformers takes the slots to drop
        self.lengths[0] = length + len(kept)

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every other row of the batch (finished decodes; after the batch's first pass)."""
        index = torch.tensor(rows, device=self.slot_positions.device)
        self.cache.batch_select_indices(index)
        self.lengths = [self.lengths[r] for r in rows]
        self.slot_positions = self.slot_positions[index]


def tree_feed(length: int, offsets: torch.Tensor, sees: torch.Tensor):
    """The rows of a feed into the slots after `length` cached ones whose tokens sit at positions
    length + offsets [k] and see every cached slot and, among themselves, what `sees` [k, k] says (a draft
    tree's ancestors): (positions [k], visible [k, length + k]), as `CachedLM.forward` takes them."""
    k = len(offsets)
    visible = torch.ones(k, length + k, dtype=torch.bool, device=sees.device)
    visible[:, length:] = sees
    return length + offsets.to(sees.device), visible


def cached_attention(cache: list, q, k, v, visible=None):
    """Decoding: append k, v to `cache` ([keys, values] or empty) and attend over it, causally, or to what
    `visible` [new, total] says each new position sees (a draft tree's rows)."""
    if cache:
        cache[0], cache[1] = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    else:
        cache[:] = [k, v]
    keys, values = cache
    new, total = q.shape[2], keys.shape[2]
    mask = visible
    if new > 1 and mask is None:  # the new positions see the cache and each other causally
        mask = torch.ones(new, total, dtype=torch.bool, device=q.device).tril(total - new)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
