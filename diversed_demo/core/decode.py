"""The decoder: one loop for target-only, exact speculative and DIVERSED decoding, emitting token events.

Each step the draft proposes up to N tokens (draft.py: a standalone LM or a feature draft, one
interface), the target scores them and the bonus position in one pass, `verify_step` decides, and the
loop keeps the accounting and turns the verdict into events. Both models keep a KV cache of the emitted
sequence; on rejection the caches are cropped back, so the prefix is never recomputed. Target-only
decoding is the same loop with N = 0: every step then emits the target's own "bonus" token. The loop
also runs a batch of sequences through one target pass a step (`decode_rows`), which head training uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .cache import CachedLM
from .draft import make_draft
from .head import weight_rule
from .prompt import eos_ids
from .sampling import Sampler
from .verify import verify_block, verify_block_greedy


@dataclass
class Verdict:
    """What one verification decided, with everything the events, the accounting and training read."""

    draft_tokens: torch.Tensor  # [n]
    draft_probs: torch.Tensor  # [n, V]
    target_probs: torch.Tensor  # [n + 1, V]
    w: torch.Tensor  # [n]
    n_accepted: int
    next_token: torch.Tensor  # the resampled token at the first rejection, or the bonus token
    accept_probs: torch.Tensor  # [n]
    target_hidden: torch.Tensor  # [n + 1, H] the target's last hidden states at the scored positions
    draft_hidden: torch.Tensor | None  # [n, Hd] what the head read beside them
    target_features: torch.Tensor | None  # aux hidden states of the verified positions, for a feature draft


def verify_step(scored, fed: int, draft_tokens, draft_probs, draft_hidden, weigh, sampler) -> Verdict:
    """Decide one row's drafts from the target's pass over its `fed` unseen tokens and the drafts:
    scored = (logits [n + 1, V], last hidden [n + 1, H], aux hidden of the fed tokens or None)."""
    logits, target_hidden, aux = scored
    n = len(draft_tokens)
    target_probs = sampler.probs(logits)
    w = weigh(target_hidden[:n], draft_hidden).float() if n else target_probs.new_ones(0)
    if sampler.greedy:
        n_accepted, next_token, accept_probs = verify_block_greedy(draft_tokens, draft_probs, target_probs, w)
    else:
        n_accepted, next_token, accept_probs = verify_block(
            draft_tokens, draft_probs, target_probs, w, sampler.generator
        )
    verified = None if aux is None else aux[: fed + n_accepted]
    return Verdict(
        draft_tokens,
        draft_probs,
        target_probs,
        w,
        n_accepted,
        next_token,
        accept_probs,
        target_hidden,
        draft_hidden,
        verified,
    )


@dataclass
class Step:
    """One decoding step: the sequence before it, the verdict, the tokens it emits, and its timing."""

    index: int
    sequence: torch.Tensor
    verdict: Verdict
    new_ids: list[int]  # emitted tokens, cut after an EOS
    stopped: bool  # an EOS ended the decode
    draft_s: float
    verify_s: float


@dataclass
class Row:
    """One sequence of a batch: its prompt, its random stream and how w is set for it."""

    prompt_ids: list[int]
    seed: int = 0
    mode: str = "static"
    ensemble_weight: float = 0.5
    head: object = None


def decode_steps(
    pair,
    prompt_ids: list[int],
    mode: str,
    ensemble_weight: float = 0.5,
    head=None,
    n_draft: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
):
    """The decoding loop for one sequence, one Step at a time (arguments already checked)."""
    for _, step in decode_rows(
        pair,
        [Row(prompt_ids, seed, mode, ensemble_weight, head)],
        n_draft,
        max_new_tokens,
        temperature,
        top_p,
    ):
        yield step


def decode_rows(
    pair,
    rows: list[Row],
    n_draft: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 1.0,
):
    """The decoding loop over a batch of sequences, yielding (row, Step) for each row still decoding at
    each step. Every row has its own draft state, weight rule and random stream, so row r follows the law
    (and, up to rounding, the tokens) of a decode of rows[r] alone; the rows share one target pass a step,
    which streams the target's weights once for all of them (a Step's verify_s is its share of that pass).
    The event stream, the frontier and head training's rollouts all read this loop: one law."""
    device = pair.target.device
    samplers = [
        Sampler(temperature, top_p, torch.Generator(device=device).manual_seed(row.seed)) for row in rows
    ]
    stop_ids = eos_ids(pair)
    drafts = [make_draft(pair, row.mode) for row in rows]
    weighs = [weight_rule(row.mode, row.ensemble_weight, row.head) for row in rows]
    aux_layer_ids = next((d.aux_layer_ids for d in drafts if d is not None), ())
    target = CachedLM(pair.target, pair.vocab_size, aux_layer_ids, rows=len(rows))
    sequences = [torch.tensor(row.prompt_ids, device=device) for row in rows]
    emitted, active, index = [0] * len(rows), list(range(len(rows))), 0
    while active:
        index += 1
        proposals, draft_s = [], []
        for r in active:
            # Never draft past the budget: the step emits at most n + 1 tokens. A feature draft waits for
            # the target's first pass over the prompt.
            draft, sequence = drafts[r], sequences[r]
            n = min(n_draft, max_new_tokens - emitted[r] - 1) if draft and draft.ready(len(sequence)) else 0
            t0 = time.perf_counter()
            if n > 0:
                proposals.append(draft.propose(sequence, n, samplers[r]))
            else:
                proposals.append(
                    (sequence.new_empty(0), torch.empty(0, pair.vocab_size, device=device), None)
                )
            if device.type == "cuda":
                torch.cuda.synchronize()
            draft_s.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        feeds = [
            torch.cat([sequences[r][target.lengths[i] :], proposal[0]])
            for i, (r, proposal) in enumerate(zip(active, proposals))
        ]
        scored = target.forward_rows(feeds, [len(p[0]) + 1 for p in proposals])
        verdicts = [
            verify_step(out, len(feed) - len(p[0]), *p, weighs[r], samplers[r])
            for r, out, feed, p in zip(active, scored, feeds, proposals)
        ]
        verify_s = (time.perf_counter() - t1) / len(active)
        still = []
        for i, (r, verdict) in enumerate(zip(active, verdicts)):
            new_ids = torch.cat(
                [verdict.draft_tokens[: verdict.n_accepted], verdict.next_token.view(1)]
            ).tolist()
            stop_at = next((j + 1 for j, t in enumerate(new_ids) if t in stop_ids), None)
            new_ids = new_ids[:stop_at]
            yield r, Step(index, sequences[r], verdict, new_ids, stop_at is not None, draft_s[i], verify_s)
            emitted[r] += len(new_ids)
            sequences[r] = torch.cat([sequences[r], sequences[r].new_tensor(new_ids)])
            if stop_at is not None or emitted[r] >= max_new_tokens:
                continue
            still.append(i)
            # Keep the caches on the new sequence minus its last token (which is fed next step).
            target.rollback(len(sequences[r]) - 1, i)
            if drafts[r] is not None:
                drafts[r].observe(len(sequences[r]), verdict.target_features)
        if len(still) < len(active):
            if still:
                target.keep_rows(still)
            active = [active[i] for i in still]
