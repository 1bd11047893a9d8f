"""The public entry points: stream a decode as token events then a Summary (`speculative_generate`), run
one to the end (`generate`), or decode a batch of rows (`decode_batch`)."""

from __future__ import annotations

import time

import torch

from .decode import Row, decode_rows, decode_steps
from .events import output_events, step_events
from .prompt import encode_prompt
from .settings import check_args, check_context
from .stats import Tally


@torch.inference_mode()
def decode_batch(
    pair,
    rows: list[Row],
    n_draft: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> list[Tally]:
    """Decode rows as one batch (arguments already checked): each row's Tally, its summary finished."""
    tallies = [Tally() for _ in rows]
    for r, step in decode_rows(pair, rows, n_draft, max_new_tokens, temperature, top_p):
        tallies[r].add(step)
    for tally in tallies:
        tally.finish(pair.tokenizer)
    return tallies


@torch.inference_mode()
def speculative_generate(
    pair,
    prompt,
    mode: str = "static",
    ensemble_weight: float = 0.5,
    head=None,
    n_draft: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    chat: bool = True,
    emit_events: bool = True,
    prompt_lookup: bool = False,
):
    """Decode `prompt` and yield a TokenEvent per decided token, then one Summary.

    mode: "ar" (target only), "exact" (nu = p), "static" (nu = w·p + (1 − w)·q with w = ensemble_weight)
    or "dynamic" (w_t from `head`). temperature 0 is greedy. emit_events=False yields only the Summary
    (the bare loop). Summary.events_s is the time the events took, which prices streaming. In greedy
    decoding, prompt_lookup lets copies from the text stand in for drafted tokens (core/lookup.py): the app,
    `generate` and the bench turn it on; the frontier, head training and the draft's own figures measure
    the draft's proposals alone.
    """
    check_args(mode, ensemble_weight, head, n_draft, max_new_tokens, temperature, top_p, seed)
    tokenizer = pair.tokenizer
    prompt_ids = encode_prompt(tokenizer, prompt, chat)
    check_context(pair, prompt_ids, max_new_tokens)
    tally = Tally()
    start = time.perf_counter()
    for step in decode_steps(
        pair,
        prompt_ids,
        mode,
        ensemble_weight=ensemble_weight,
        head=head,
        n_draft=n_draft,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        prompt_lookup=prompt_lookup,
    ):
        tally.add(step)
        if emit_events:
            t3 = time.perf_counter()
            events = step_events(tokenizer, step, mode)
            yield from output_events(events, len(step.new_ids))
            tally.summary.events_s += time.perf_counter() - t3
    yield tally.finish(tokenizer, time.perf_counter() - start)


def generate(pair, prompt, **kwargs):
    """Run a decode to the end: (summary, events). The events include rejected drafts."""
    events = list(speculative_generate(pair, prompt, **kwargs))
    return events[-1], events[:-1]
