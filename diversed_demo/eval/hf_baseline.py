"""The transformers baseline: its own generate (plain or assisted, with an ensemble weight) on the
pair's models with their stock layers, which the bench times against ours."""

from __future__ import annotations

import copy
import time

import torch

from ..runtime.stock import stock_layers


def transformers_kwargs(config) -> dict | None:
    """generate() arguments for transformers' equivalent of a mode, or None where it has none: it accepts
    only 0 < w < 1 as an ensemble weight (w = 1 is its plain assisted generation, w = 0 has no
    equivalent), and has no EAGLE path."""
    if config.mode == "ar":
        return {}
    if config.mode == "exact":
        return {"assisted": True}
    if config.mode == "static":
        w = config.ensemble_weight
        return (
            {"assisted": True}
            if w == 1
            else {"assisted": True, "assistant_ensemble_weight": w}
            if 0 < w < 1
            else None
        )
    return None


def hf_generate(pair, prompt_ids, config):
    """transformers' own greedy generate on the same prompt, as `config` (a DecodeConfig) decodes it:
    plain, assisted, or assisted with an ensemble weight, at its N and length, on the pair's models with
    their stock layers and attention (as a transformers user runs them). The draft's generation config is
    set for the call and restored after it."""
    n_draft, max_new_tokens = config.n_draft, config.max_new_tokens
    extra = dict(transformers_kwargs(config))
    ids = torch.tensor([prompt_ids], device=pair.target.device)
    kwargs = {"do_sample": False, "max_new_tokens": max_new_tokens, "attention_mask": torch.ones_like(ids)}
    assisted = extra.pop("assisted", False)
    saved_config = pair.draft.generation_config if assisted else None
    if assisted:
        config = copy.deepcopy(saved_config)
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = n_draft, "constant"
        config.assistant_confidence_threshold = 0.0
        pair.draft.generation_config = config
        kwargs["assistant_model"] = pair.draft
        kwargs.update(extra)
    try:
        with stock_layers(pair.target, pair.draft):
            start = time.perf_counter()
            out = pair.target.generate(ids, **kwargs)
            seconds = time.perf_counter() - start
    finally:
        if assisted:
            pair.draft.generation_config = saved_config
    return out[0, len(prompt_ids) :].tolist(), seconds
