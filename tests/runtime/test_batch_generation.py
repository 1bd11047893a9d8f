"""Batched generation (runtime/batch_generation.py): what the draft's data and the heads' positions are
made with."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model

from diversed_demo.runtime.batch_generation import generate_batch


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_batched_generation_greedy_rows_equal_one_by_one_greedy_decoding(attention):
    # Left padding, per-row greedy/sampled choice and pruning of finished rows must not change a greedy row;
    # nor must the prompt pass's SDPA where the target decodes with eager attention (as on a CPU).
    target = tiny_model(0, 2)
    target.set_attn_implementation(attention)
    prompts = [[1, 5, 6, 7], [1, 9], [1, 20, 21, 22, 23, 24, 25], [1, 8, 8]]
    g = torch.Generator().manual_seed(0)
    results = generate_batch(target, prompts, [True, False, True, True], 20, 2, 3, g, prune_every=2)
    assert target.config._attn_implementation == attention  # restored after the prompt pass
    for prompt, greedy, (ids, ended) in zip(prompts, [True, False, True, True], results):
        if not greedy:
            continue
        reference = target.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=20, eos_token_id=2, pad_token_id=3
        )[0, len(prompt) :].tolist()
        assert ids == reference[: len(ids)] and (ended == (ids[-1] == 2))
