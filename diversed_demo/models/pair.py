"""A (target, draft) pair that shares a tokenizer, as the decoder sees it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..common import priority


class PairError(ValueError):
    """A model pair that cannot work together (or cannot be found); the message says why."""


class Upgrades:
    """A pair's upgrades, each a function that swaps one in whole: run while no decode of the pair is
    running (`in_use`)."""

    def __init__(self):
        # Reentrant: a decode left to the garbage collector may end (and swap) inside any of these calls.
        self.lock, self.offered, self.users = threading.RLock(), [], 0

    def __deepcopy__(self, memo) -> Upgrades:
        return Upgrades()  # a copy of a pair is another pair, with nothing offered to it

    def offer(self, swap: Callable[[], None]) -> threading.Event:
        """Swap `swap` in at once where no decode runs, else when the last running one ends (on the thread
        that ran it: in the app, the model thread); the event is set once it is in."""
        done = threading.Event()
        with self.lock:
            self.offered.append((swap, done))
            if not self.users:
                self._swap_offered()
        return done

    @contextlib.contextmanager
    def in_use(self):
        """Around a decode: no upgrade is swapped in while one runs, and the builds of the next ones stop
        (common/priority.py)."""
        with self.lock:
            self.users += 1
        try:
            with priority.decoding():
                yield
        finally:
            with self.lock:
                self.users -= 1
                if not self.users:
                    self._swap_offered()

    def _swap_offered(self) -> None:  # under the lock: no decode starts halfway through a swap
        offered, self.offered = self.offered, []
        for swap, done in offered:
            swap()
            done.set()


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    target_name: str
    draft_name: str
    device: torch.device
    dtype_choice: dict | None = None  # how the dtype was chosen, where it was measured (runtime/dtype_choice)
    # Set by the runtime (runtime/plan.py), never by a model: how the pair runs here, and the compiled or
    # graphed passes it lends to one decode at a time (the draft's: a standalone draft's pass, or an
    # EAGLE-3 draft's step). The decoder runs what it is given here, eagerly where None.
    runtime: object | None = None
    # What a drafted token (c) and a pass over j drafts and the bonus position (v[j]) cost here, in
    # target-token units, as the runtime measured them; the adaptive draft length reads them (None: its
    # defaults).
    costs: dict | None = None
    target_pass: object | None = None
    draft_pass: object | None = None
    # A greedy head's w_t in one native call (runtime/greedy_head.py: `takes(head)`, `greedy_weights(head,
    # p, q, target_hidden, draft_hidden)`), where the runtime built it; the head's own operations elsewhere.
    head_kernel: object | None = None
    # What the runtime builds aside while the pair serves (a faster kernel's operands, compiled passes),
    # swapped in between decodes: nothing changes under a running decode.
    upgrades: Upgrades = field(default_factory=lambda: Upgrades(), repr=False)

    def offer_upgrade(self, swap: Callable[[], None]) -> threading.Event:
        return self.upgrades.offer(swap)

    def in_use(self):
        return self.upgrades.in_use()

    @property
    def vocab_size(self) -> int:
        # Same tokenizer, but checkpoints may pad their embedding tables differently: compare on the
        # shared part, which covers every real token.
        return min(text_config(self.target).vocab_size, text_config(self.draft).vocab_size)

    @property
    def fingerprint(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)


def text_config(model):
    """The text config of a Hugging Face model, or the equivalent of a feature draft."""
    return getattr(model, "text_config", None) or model.config.get_text_config()


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary and special tokens: equal fingerprints mean interchangeable ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
