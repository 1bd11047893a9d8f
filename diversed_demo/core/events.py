"""TODO."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .decode import Verdict

KINDS = ("accepted", "rejected", "resampled", "bonus", "ar")


@dataclass
class TokenEvent:
    token_id: int
    text: str
    kind: str  # one of KINDS; "rejected" is a draft token turned down, not part of the output
    step: int  # the decoding step (target pass) that decided it, from 1
    w: float | None = None  # ensemble weight w_t at this position (None where no draft competed)
    p: float | None = None  # target probability of the token
    q: float | None = None  # draft probability of the token
    accept_prob: float | None = None
    drafted: int = 0  # how many tokens the draft proposed in this step
    draft_ms: float = 0.0  # the step's drafting time
    verify_ms: float = 0.0  # the step's target pass and verification time

    def to_dict(self) -> dict:
        return asdict(self)


def output_events(events: list, n_output: int) -> list:
    """The events up to the n_output-th output token (an EOS cuts the step short: nothing after it,
    not even the draft that was rejected after it)."""
    kept, emitted = [], 0
    for event in events:
        if emitted == n_output:
            break
        kept.append(event)
        emitted += event.kind != "rejected"
    return kept


def token_text(tokenizer, context: list[int], token_id: int) -> str:
    """The text a token adds after `context` (decoded with a little context, for byte-level tokenizers)."""
    context = context[-4:]
    before = tokenizer.decode(context, skip_special_tokens=False) if context else ""
    return tokenizer.decode(context + [token_id], skip_special_tokens=False)[len(before) :]


def step_events(tokenizer, sequence, verdict: Verdict, mode, step, draft_ms, verify_ms) -> list[TokenEvent]:
    """The events of one decoding step, in order, with one host transfer for all their numbers."""
    draft_tokens, draft_probs, target_probs, w = (
        verdict.draft_tokens,
        verdict.draft_probs,
        verdict.target_probs,
        verdict.w,
    )
    n_accepted, next_token, accept_probs = verdict.n_accepted, verdict.next_token, verdict.accept_probs
    n = draft_tokens.numel()
    pos = torch.arange(n, device=draft_tokens.device)
    at = min(n_accepted, n)  # position of next_token among the drafted ones (n for the bonus)
    per_draft = (
        torch.stack(
            [
                target_probs[:n][pos, draft_tokens],
                draft_probs[pos, draft_tokens],
                accept_probs.float(),
                w.float(),
            ],
            dim=1,
        ).tolist()
        if n
        else []
    )
    next_p = float(target_probs[at, next_token])
    next_q = float(draft_probs[at, next_token]) if at < n else None
    drafted, nxt = draft_tokens.tolist(), int(next_token)
    context = sequence[-4:].tolist()
    timing = dict(step=step, drafted=n, draft_ms=draft_ms, verify_ms=verify_ms)
    events = []
    for i in range(n_accepted):
        p, q, a, wi = per_draft[i]
        events.append(
            TokenEvent(
                drafted[i],
                token_text(tokenizer, context, drafted[i]),
                "accepted",
                w=wi,
                p=p,
                q=q,
                accept_prob=a,
                **timing,
            )
        )
        context.append(drafted[i])
    if at < n:
        p, q, a, wi = per_draft[at]
        events.append(
            TokenEvent(
                drafted[at],
                token_text(tokenizer, context, drafted[at]),
                "rejected",
                w=wi,
                p=p,
                q=q,
                accept_prob=a,
                **timing,
            )
        )
        events.append(
            TokenEvent(
                nxt, token_text(tokenizer, context, nxt), "resampled", w=wi, p=next_p, q=next_q, **timing
            )
        )
    else:
        events.append(
            TokenEvent(
                nxt,
                token_text(tokenizer, context, nxt),
                "ar" if mode == "ar" else "bonus",
                p=next_p,
                **timing,
            )
        )
    return events
