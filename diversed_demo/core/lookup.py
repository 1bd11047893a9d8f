"""Prompt lookup: in greedy decoding, a drafted token may be copied from the text so far.

Summaries, extractions, answers over a passage and translations repeat the prompt's names, numbers and
phrases, where a small draft guesses worst. Where the last 2–4 tokens (verified, then drafted) occurred
before, the token that followed their latest occurrence is proposed instead of the draft's own choice. The
draft still runs at every position (but in exact decoding's blocks of copies, below), on the proposed
tokens, so q, the draft's hidden state and the ensemble weight are what they would be for that prefix.
Greedy verification keeps a drafted token only where it is argmax nu, whoever proposed it, so exact
decoding still emits the target's own greedy tokens; only how many a pass keeps changes. A relaxed greedy
text can move, as with another N: the bonus token after a block is argmax p, a drafted position's argmax
nu, and copies move where blocks end. Sampled verification needs every drafted token drawn from q, so
lookup is greedy's alone. On a GPU each position reads its token on the host (a sync a drafted token),
which the CUDA bench's exact/no-lookup mode prices.

In exact decoding (nu = p, whatever q is) a block may be copies alone: where the text has a follower for
the tail, the copies go on while it has one, up to the room of one compiled pass, and the draft does not
run. Its q is then a point mass on each copy, which the verification takes as any proposal. The draft
feeds the positions it skipped at its next proposal. Longer blocks pay only so: with the draft running at
each copy they raised tau but not tokens/s (docs/measurements/speed.md).
"""

from __future__ import annotations

import torch

MIN_MATCH, MAX_MATCH = 2, 4  # tokens that must match: one alone guesses worse than two (docs/results.md)


class PromptLookup:
    """The verified sequence's n-grams (n = MIN_MATCH..MAX_MATCH), each with the token that followed its
    latest occurrence; `start` then `choose` over one block of drafts."""

    def __init__(self, copy_blocks: bool = False):
        self.copy_blocks = copy_blocks  # exact decoding: a block may be copies alone, without the draft
        self.followers = {n: {} for n in range(MIN_MATCH, MAX_MATCH + 1)}
        self.indexed: list[int] = []  # the verified tokens seen so far
        self.tail: list[int] = []  # the last tokens of the sequence being drafted on

    def start(self, sequence: torch.Tensor) -> None:
        """Index the verified tokens not seen yet (the sequence only grows); drafting follows the last."""
        assert len(sequence) >= len(self.indexed), "a verified sequence never shrinks"
        for token in sequence[len(self.indexed) :].tolist():
            for n, followers in self.followers.items():
                if len(self.indexed) >= n:
                    followers[tuple(self.indexed[-n:])] = token
            self.indexed.append(token)
        self.tail = self.indexed[-MAX_MATCH:]

    def guess(self) -> int | None:
        """The token after the latest earlier occurrence of the tail's longest indexed n-gram, if any."""
        for n in range(MAX_MATCH, MIN_MATCH - 1, -1):
            found = self.followers[n].get(tuple(self.tail[-n:])) if len(self.tail) >= n else None
            if found is not None:
                return found
        return None

    def choose(self, drafted: torch.Tensor) -> torch.Tensor:
        """The token to propose at the next position: the copy if there is one, else the draft's `drafted`
        (a one-element tensor); the choice extends the tail."""
        copied = self.guess()
        token = drafted if copied is None else drafted.new_tensor(copied).view_as(drafted)
        self.tail = (self.tail + [copied if copied is not None else int(drafted)])[-MAX_MATCH:]
        return token

    def copies(self, room: int) -> list[int]:
        """Up to `room` tokens copied one after another while the text has a follower for the tail."""
        copied = []
        while len(copied) < room and (token := self.guess()) is not None:
            copied.append(token)
            self.tail = (self.tail + [token])[-MAX_MATCH:]
        return copied
