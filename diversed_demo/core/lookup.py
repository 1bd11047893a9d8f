"""Prompt lookup: in greedy decoding, a drafted token may be copied from the text so far.

Summaries, extractions and translations repeat the prompt's names, numbers and phrases, where a small draft
guesses worst. Where the last 2–4 tokens (verified, then drafted) occurred before, the token that followed
their latest occurrence is proposed instead of the draft's own choice; the draft still runs on it, so q and
w_t are those of that prefix. Greedy verification keeps a drafted token only where it is argmax nu, so exact
decoding still emits the target's own tokens; sampled verification needs drafts drawn from q, so lookup is
greedy's alone. In exact decoding (nu = p) a block may be copies alone, up to one compiled pass's room, with
q a point mass on each and no draft step (the draft feeds what it skipped at its next proposal): blocks
longer than N pay only without the draft's steps (docs/measurements/speed.md).
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

    def match(self) -> tuple[int | None, int]:
        """The token after the latest earlier occurrence of the tail's longest indexed n-gram, and n (None and
        0 where no n-gram of the tail occurred before)."""
        for n in range(MAX_MATCH, MIN_MATCH - 1, -1):
            found = self.followers[n].get(tuple(self.tail[-n:])) if len(self.tail) >= n else None
            if found is not None:
                return found, n
        return None, 0

    def guess(self) -> int | None:
        """The copy `match` finds, if any."""
        return self.match()[0]

    def choose(self, drafted: torch.Tensor) -> torch.Tensor:
        """The token to propose at the next position: the copy if there is one, else the draft's `drafted`
        (a one-element tensor); the choice extends the tail."""
        copied = self.guess()
        token = drafted if copied is None else drafted.new_tensor(copied).view_as(drafted)
        self.tail = (self.tail + [copied if copied is not None else int(drafted)])[-MAX_MATCH:]
        return token

    def copies(self, room: int, pays=None) -> list[int]:
        """Up to `room` tokens copied one after another while the text has a follower for the tail and
        `pays(copied so far, n of the match)` (draft_length.py prices a block; None: every copy is taken)."""
        copied = []
        while len(copied) < room:
            token, n = self.match()
            if token is None or (pays is not None and not pays(len(copied), n)):
                break
            copied.append(token)
            self.tail = (self.tail + [token])[-MAX_MATCH:]
        return copied
