"""The public entry points: stream a decode as token events then a Summary (`speculative_generate`), run
one to the end (`generate`), or decode a batch of prompts (`decode_batch`)."""

from __future__ import annotations

import time

import torch

from .config import DecodeConfig, check_context
from .decode import decode_rows
from .events import output_events, step_events
from .prompt import encode_prompt
from .stats import Tally


@torch.inference_mode()
def decode_batch(pair, prompts: list[list[int]], configs: list[DecodeConfig]) -> list[Tally]:
    """Decode the prompts as one batch, prompts[r] by configs[r]: each row's Tally, its summary finished."""
    tallies = [Tally() for _ in prompts]
    for r, step in decode_rows(pair, prompts, configs):
        tallies[r].add(step)
    for tally in tallies:
        tally.finish(pair.tokenizer)
    return tallies


def settings_config(config: DecodeConfig | None, settings: dict) -> DecodeConfig:
    """`config` with `settings` (DecodeConfig's fields by keyword) applied, or a config of them alone."""
    if config is None:
        return DecodeConfig(**settings)
    return config.replace(**settings) if settings else config


@torch.inference_mode()
def speculative_generate(
    pair, prompt, config: DecodeConfig | None = None, emit_events: bool = True, **settings
):
    """Decode `prompt` (text, or token ids) by `config` and yield a TokenEvent per decided token, then one
    Summary. DecodeConfig's fields may also be given by keyword (mode="static", ensemble_weight=0.5, ...),
    alone or over `config`. emit_events=False yields only the Summary (the bare loop); Summary.events_s is
    the time the events took, which prices streaming."""
    config = settings_config(config, settings)
    tokenizer = pair.tokenizer
    prompt_ids = encode_prompt(tokenizer, prompt, config.chat)
    check_context(pair, prompt_ids, config.max_new_tokens)
    tally = Tally()
    start = time.perf_counter()
    for _, step in decode_rows(pair, [prompt_ids], [config]):
        tally.add(step)
        if emit_events:
            t3 = time.perf_counter()
            events = step_events(tokenizer, step, config.mode, config.lam if config.mode == "cost" else None)
            yield from output_events(events, len(step.new_ids))
            tally.summary.events_s += time.perf_counter() - t3
    yield tally.finish(tokenizer, time.perf_counter() - start)


def generate(pair, prompt, config: DecodeConfig | None = None, **settings):
    """Run a decode to the end: (summary, events). The events include rejected drafts."""
    events = list(speculative_generate(pair, prompt, config, **settings))
    return events[-1], events[:-1]
