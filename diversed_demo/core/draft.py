"""The two kinds of draft, behind the one interface the decoder sees.

A draft proposes n tokens, each with its distribution q over the whole vocabulary and the hidden state
an ensemble head reads, then learns the verified sequence through `observe` and drops whatever the
target rejected. Neither kind ever recomputes the prefix: both keep a KV cache and crop it.

- StandaloneDraft: a causal LM of its own (any Hugging Face model that shares the target's tokenizer).
- FeatureDraft: an EAGLE-3 draft (eagle.py) that reads the target's hidden states of verified
  positions, so after every verification it restarts from the target's true features.
"""

from __future__ import annotations

import weakref

import torch

from .cache import CachedLM, cached_attention
from .sampling import Sampler


class StandaloneDraft:
    """A draft LM of its own: it feeds the verified tokens it has not seen, then samples n tokens."""

    aux_layer_ids: list[int] = []

    def __init__(self, model, vocab_size: int, runner=None):
        self.lm = CachedLM(model, vocab_size, runner=runner)

    def ready(self, length: int) -> bool:
        return True

    def lag(self, length: int) -> int:
        """Tokens of a `length`-token sequence the next proposal would feed first."""
        return length - self.lm.length

    def propose(self, sequence: torch.Tensor, n: int, sampler: Sampler, lookup=None, length=None):
        """Draft tokens [m], their q [m, V] and the draft's hidden states [m, H] (a token copied by `lookup`
        where it has one), m ≤ n: fewer where `length` (draft_length.py) stops the draft."""
        feed, tokens, probs, hidden = sequence[self.lm.length :], [], [], []
        for j in range(n):
            logits, last, _ = self.lm.forward(feed, keep=1)
            token, q = sampler(logits[0])
            if lookup is not None:
                token = lookup.choose(token)
            if length is not None and not length.keeps(j + 1, float(draft_confidence(q, token, sampler))):
                break
            tokens.append(token.view(1))
            probs.append(q)
            hidden.append(last[0])
            feed = token.view(1)
            if length is not None and not length.go_on(j + 1):
                break
        if not tokens:
            return no_drafts(sequence, self.lm.vocab_size)
        return torch.cat(tokens), torch.stack(probs), torch.stack(hidden)

    def propose_tree(self, sequence: torch.Tensor, grower, sampler: Sampler):
        """A tree of drafts (draft_tree.py): the verified tokens fed, then each expanded depth in one pass
        whose rows see the sequence and their own ancestors."""
        logits, last, _ = self.lm.forward(sequence[self.lm.length :], keep=1)
        grower.root(sampler.probs(logits[0]), last[0])
        entries = {}  # node -> its slot in the draft's cache
        while nodes := grower.to_expand():
            tokens = sequence.new_tensor([grower.tokens[i] for i in nodes])
            positions = sequence.new_tensor([len(sequence) - 1 + grower.depth_of[i] for i in nodes])
            visible = tree_visible(grower, nodes, entries, self.lm.length, sequence.device)
            logits, last, _ = self.lm.forward(tokens, keep=len(nodes), rows=(positions, visible))
            grower.expanded(nodes, sampler.probs(logits), last)
        return grower.tree(lambda ids: ids.to(sequence.device), lambda probs: probs)

    def observe(self, length: int, target_features=None) -> None:
        """The sequence is `length` tokens long: keep the cache on its verified part (all but the last)."""
        self.lm.rollback(length - 1)

    def close(self) -> None:
        self.lm.close()


class FeatureDraft:
    """An EAGLE-3 draft over the target's features.

    Its cache entry i holds (target features at i, token i + 1). Proposing feeds the verified entries it
    has not seen (true features, from `observe`) in one pass, then drafts on its own outputs.
    """

    def __init__(self, model, step=None):
        self.model = model
        self.token_ids = model.draft_token_ids
        self.aux_layer_ids = model.aux_layer_ids
        self.cache: list = []
        self.length = 0  # cache entries that are verified
        self.pending = None  # true features [P, n_aux·H] of positions length .. length + P − 1
        # `step`: the draft's compiled or graphed step (runtime/compiled_draft.py), lent to one decode at a
        # time; while this draft holds it (`compiled`), its static cache stands in for `cache`.
        self.step, self.compiled = step, None

    def ready(self, length: int) -> bool:
        """Whether the features of every verified position but the last are known (not before the target's
        first pass)."""
        return self.pending is not None and self.length + len(self.pending) >= length - 1

    def lag(self, length: int) -> int:
        """Verified positions of a `length`-token sequence the next proposal would feed first."""
        return length - 1 - self.length

    def propose(self, sequence: torch.Tensor, n: int, sampler: Sampler, lookup=None, length=None):
        """As StandaloneDraft.propose, from the target's features of the verified positions."""
        end = len(sequence) - 1
        features = self.model.fuse(self.pending[: end - self.length])
        hidden, logits = self._step(features, sequence[self.length + 1 : end + 1], self.length)
        self.length, self.pending = end, None
        tokens, small_probs, states = [], [], []
        for step in range(n):
            # Sampled over the draft's own vocabulary (q is 0 elsewhere): the same law, a sixth of the cost.
            index, small_q = sampler(logits)
            own = self.token_ids[index]
            token = own if lookup is None else lookup.choose(own)
            if length is not None:
                confidence = draft_confidence(
                    small_q, index, sampler, None if token is own else self.token_ids == token
                )
                if not length.keeps(step + 1, float(confidence)):
                    break
            tokens.append(token.view(1))
            small_probs.append(small_q)
            states.append(hidden[0])
            if length is not None and not length.go_on(step + 1):
                break
            if step < n - 1:  # the draft's own output stands in for the next position's target features
                hidden, logits = self._step(hidden, token.view(1), end + step)
        if not tokens:
            return no_drafts(sequence, self.model.vocab_size)
        probs = self.model.full_probs(torch.stack(small_probs))  # over the whole vocabulary, once a block
        return torch.cat(tokens), probs, torch.stack(states)

    def propose_tree(self, sequence: torch.Tensor, grower, sampler: Sampler):
        """A tree of drafts (draft_tree.py) from the target's features of the verified positions: each
        expanded depth in one step whose rows read their parents' hidden states and see the verified
        entries and their own ancestors'."""
        end = len(sequence) - 1
        features = self.model.fuse(self.pending[: end - self.length])
        hidden, logits = self._step(features, sequence[self.length + 1 : end + 1], self.length)
        self.length, self.pending = end, None
        grower.root(sampler.probs(logits), hidden[0])
        entries, used = {}, end  # node -> its slot; the cache's entries so far
        while nodes := grower.to_expand():
            parents = [grower.parents[i] + 1 for i in nodes]
            features = torch.stack([grower.rows[row][1] for row in parents])
            tokens = self.token_ids[torch.tensor([grower.tokens[i] for i in nodes])]
            positions = sequence.new_tensor([end + grower.depth_of[i] - 1 for i in nodes])
            visible = tree_visible(grower, nodes, entries, used, sequence.device)
            hidden, logits = self._layer(features, tokens, used, rows=(positions, visible))
            used += len(nodes)
            grower.expanded(nodes, sampler.probs(logits), hidden)
        return grower.tree(lambda ids: self.token_ids[ids], self.model.full_probs)

    def _step(self, features, token_ids, start: int):
        """The draft's layer over rows at positions start, start + 1, …: (its last hidden state [1, H], its
        logits over the draft vocabulary [Vd])."""
        hidden, logits = self._layer(features, token_ids, start)
        return hidden[-1:], logits[-1]

    def _layer(self, features, token_ids, start: int, rows=None):
        """The draft's layer over rows fed into its cache's slots from `start`: a chain's, at positions start,
        start + 1, …, or a tree's, `rows` = (positions [m], visible [m, start + m]: the slots each sees):
        (hidden states [m, H], logits over the draft vocabulary: a tree's [m, Vd]; a chain's [m, Vd] from a
        compiled step, else [1, Vd], its last row's, the only one a chain drafts from)."""
        if start == 0 and self.compiled is None:
            self._enter_compiled()
        if self.compiled is not None and start + len(token_ids) >= self.compiled.module.max_len:
            self._leave_compiled(start)  # too long for its cache
        if self.compiled is not None:
            try:
                return self.compiled.forward(token_ids, start, features, rows=rows)
            except RuntimeError as error:
                self.compiled.fail(error)
                self._leave_compiled(start)
        if rows is None:
            positions, attend = (
                torch.arange(start, start + len(token_ids), device=token_ids.device),
                self._attend,
            )
        else:
            positions, attend = rows[0], lambda q, k, v: cached_attention(self.cache, q, k, v, rows[1])
        hidden = self.model.layer(features[None], token_ids[None], positions[None], attend)[0]
        return hidden, self.model.draft_logits(hidden if rows is not None else hidden[-1:])

    def _enter_compiled(self) -> None:
        compiled, self.step = self.step, None  # asked for once, at a decode's first proposal
        if compiled is not None and compiled.acquire(self):
            weakref.finalize(self, compiled.release, id(self))
            self.compiled = compiled

    def _leave_compiled(self, start: int) -> None:
        """Go on eagerly from the compiled step's static cache of `start` positions."""
        self.cache = list(self.compiled.layers(start)[0])
        self.close()

    def close(self) -> None:
        """Give the compiled step back to other decodes (also done when this draft is garbage)."""
        if self.compiled is not None:
            self.compiled.release(id(self))
        self.compiled = None

    def _attend(self, q, k, v):
        return cached_attention(self.cache, q, k, v)

    def observe(self, length: int, target_features=None) -> None:
        """Drop the speculative entries and queue the target's features of newly verified positions (a
        static cache's are overwritten in place)."""
        if self.cache and self.cache[0].shape[2] > self.length:
            self.cache[:] = [t[:, :, : self.length] for t in self.cache]
        if target_features is not None:
            self.pending = (
                target_features if self.pending is None else torch.cat([self.pending, target_features])
            )


def tree_visible(grower, nodes: list[int], entries: dict, used: int, device=None) -> torch.Tensor:
    """What the rows expanding `nodes` see of a draft's cache [m, used + m], on `device`: the verified slots,
    their ancestors' entries (`entries`: node -> slot, filled in here with theirs) and their own."""
    visible = torch.zeros(len(nodes), used + len(nodes), dtype=torch.bool)
    visible[:, : used - len(entries)] = True
    for j, node in enumerate(nodes):
        ancestor = grower.parents[node]
        while ancestor >= 0:
            visible[j, entries[ancestor]] = True
            ancestor = grower.parents[ancestor]
        entries[node] = used + j
        visible[j, used + j] = True
    return visible.to(device)  # built on the host, element by element; moved once


def no_drafts(sequence: torch.Tensor, vocab_size: int):
    """A proposal of no drafts (tokens [0], q [0, V], no hidden states): the step is the target's own."""
    return sequence.new_empty(0), torch.empty(0, vocab_size, device=sequence.device), None


def draft_confidence(q: torch.Tensor, index, sampler: Sampler, copied=None) -> torch.Tensor:
    """What the draft length rule reads of a drafted position's q [V]: greedy, q of the proposed token (a
    copy's, where `copied` marks it, may be 0); sampled, q's top probability, how sure the draft is there
    (the sampled token's own q says more of the draw than of the position's acceptance 1 − TV)."""
    if not sampler.greedy:
        return q.max()
    return q[index] if copied is None else q[copied].sum()


def is_feature_draft(model) -> bool:
    """Whether a draft model reads the target's features (an EAGLE-3 draft) rather than tokens alone."""
    return getattr(model, "reads_target_features", False)


def make_draft(pair, mode: str):
    """The pair's draft behind the decoder's interface (none for target-only decoding)."""
    if mode == "ar":
        return None
    if is_feature_draft(pair.draft):
        return FeatureDraft(pair.draft, pair.draft_pass)
    return StandaloneDraft(pair.draft, pair.vocab_size, pair.draft_pass)
