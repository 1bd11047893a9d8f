"""A decode's settings, in one object that checks itself once when it is built.

Terms: the mode says which verifier decides (see `MODES`); w (`ensemble_weight`) is the static verifier's
weight on the target; a head gives a per-token w_t; N (`n_draft`) is how many tokens the draft proposes a
step ("auto": as many as pay, step by step); temperature 0 is greedy. The library, the command line, the
app, the bench, the frontier and head training all build a DecodeConfig, and the decoder reads nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# ar: the target alone; exact: nu = p; static: nu = w·p + (1 − w)·q; cost: w_t from p and q by the
# per-token rule at λ (cost_rule.py); dynamic: w_t from a learned head.
MODES = ("ar", "exact", "static", "cost", "dynamic")
MAX_N_DRAFT = 32
AUTO = "auto"  # n_draft: the draft length chosen step by step (core/draft_length.py)
# tree: "off", a chain of drafts; "on", trees sized step by step (draft_tree.py); "auto", trees where the
# runtime found that they pay (`pair.runtime.drafts`), chains elsewhere; "W,E,D,N", trees of that shape.
TREE_OFF, TREE_ON = "off", "on"
MAX_SEED = 2**32 - 1  # past 64 bits torch's generator overflows; a browser's number box holds 32 exactly


@dataclass(frozen=True)
class DecodeConfig:
    """What a decode takes besides the pair and the prompt. Building one with a bad value raises a
    ValueError that names it, so callers build it before loading models."""

    mode: str = "static"
    ensemble_weight: float = 0.5  # w, for mode "static"
    head: object = None  # mode "dynamic": a loaded head, or its name until the caller loads it
    lam: float = 1.0  # mode "cost": λ, what a rejected draft is worth in nats of the target's likelihood
    n_draft: int | str = 4  # or "auto": as many as pay, step by step (draft_length.py)
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    prompt_lookup: bool = False  # greedy decoding: copies from the text may stand in for drafts (lookup.py)
    tree: str = AUTO  # several candidates a position: "off", "on", "auto" or "W,E,D,N" (above)
    chat: bool = True  # wrap a text prompt in the tokenizer's chat template

    def __post_init__(self):
        seed, w, n = self.seed, self.ensemble_weight, self.n_draft
        if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
            raise ValueError(f"the seed must be an integer from 0 to {MAX_SEED}, not {seed!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.mode == "static" and not (isinstance(w, (int, float)) and 0.0 <= w <= 1.0):
            raise ValueError(f"the ensemble weight w must be a number in [0, 1], not {w!r}")
        if self.mode == "cost" and not (isinstance(self.lam, (int, float)) and 0 <= self.lam < float("inf")):
            raise ValueError(f"λ (lam) must be a number ≥ 0, not {self.lam!r}")
        if self.mode == "dynamic" and self.head is None:
            raise ValueError("dynamic mode needs a head (--head PATH)")
        if self.mode != "ar" and n != AUTO and not (isinstance(n, int) and 1 <= n <= MAX_N_DRAFT):
            raise ValueError(f"n_draft must be an integer from 1 to {MAX_N_DRAFT} or {AUTO!r}, not {n!r}")
        tree_shape(self.tree)  # raises on a bad shape
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be a positive integer, not {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be ≥ 0 (0 is greedy), not {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")

    def replace(self, **changes) -> DecodeConfig:
        """This config with `changes`, checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def head_name(self) -> str | None:
        """The head's name: as given, or the loaded head's."""
        return self.head if isinstance(self.head, str) else getattr(self.head, "name", None)

    @property
    def batch_settings(self) -> tuple:
        """What the rows of one batch share: one target pass a step decides N, length and sampling."""
        return self.n_draft, self.max_new_tokens, self.temperature, self.top_p


PASS_ROWS = 16  # new tokens one compiled pass takes (runtime/static_pass.py): a tree and the unseen token
TREE_LIMITS = (8, 8, 7, PASS_ROWS - 1)  # width, expansion, depth, nodes at most: one pass scores them all


def tree_shape(tree: str) -> tuple[int, int, int, int] | None:
    """A tree setting's fixed shape (width, expansion, depth, nodes), None for "off", "on" and "auto"; a
    ValueError that says what is accepted otherwise."""
    if tree in (TREE_OFF, TREE_ON, AUTO):
        return None
    try:
        shape = tuple(int(part) for part in str(tree).split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or not all(1 <= a <= b for a, b in zip(shape, TREE_LIMITS)):
        limits = ", ".join(str(b) for b in TREE_LIMITS)
        raise ValueError(
            f"tree must be 'off', 'on', 'auto' or 'W,E,D,N' (children a node, nodes expanded a depth, depth, "
            f"nodes; each from 1 up to {limits}), not {tree!r}"
        )
    return shape


def check_context(pair, prompt_ids: list[int], max_new_tokens: int) -> None:
    """A ValueError where the prompt and the new tokens would not fit the target's context."""
    limit = getattr(pair.target.config.get_text_config(), "max_position_embeddings", None)
    if limit and len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's context of {limit} tokens"
        )
