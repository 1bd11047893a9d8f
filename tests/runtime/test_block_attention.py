"""Attention in blocks (runtime/block_attention.py): a query row's result does not depend on the rows beside
it nor on the masked slots after its own, so a verification gives each position a one-token pass's logits."""

from __future__ import annotations

import random

import pytest
import torch
from tiny import tiny_model

from diversed_demo.core.cache import MAX_FEED, CachedLM
from diversed_demo.runtime.block_attention import BLOCK, attend_in_blocks, feed_rows, mask_bias, padded_width

N_KV, GROUP, DIM, SLOTS = 3, 3, 64, 1024  # SmolLM2's heads


def cache(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(N_KV, SLOTS, DIM, generator=generator).bfloat16() for _ in range(2)]


def attend(query, keys, values, start: int):
    """The rows of query [k, n_q, D] at positions start.. over the cache, as a pass feeds them."""
    _, mask = feed_rows(start, start + len(query))
    return attend_in_blocks(query, keys, values, mask_bias(mask, GROUP))


def test_a_row_attends_alike_in_a_pass_of_several_rows_and_alone():
    keys, values = cache(0)
    rng, generator = random.Random(0), torch.Generator().manual_seed(1)
    for _ in range(60):
        k, start = rng.randint(2, MAX_FEED), rng.randint(1, SLOTS - 2 * BLOCK)
        query = torch.randn(k, N_KV * GROUP, DIM, generator=generator).bfloat16()
        together = attend(query, keys, values, start)
        for i in range(k):
            assert torch.equal(together[i], attend(query[i : i + 1], keys, values, start + i)[0]), (
                k,
                start,
                i,
            )


def test_attention_in_blocks_computes_attention():
    keys, values = cache(2)
    query = torch.randn(4, N_KV * GROUP, DIM, generator=torch.Generator().manual_seed(3)).bfloat16()
    start = 300
    ours = attend(query, keys, values, start).float().view(4, N_KV * GROUP, DIM)
    used = start + 4
    mask = torch.arange(used)[None] <= torch.arange(start, used)[:, None]
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.float().transpose(0, 1),
        keys[:, :used].float().repeat_interleave(GROUP, 0),
        values[:, :used].float().repeat_interleave(GROUP, 0),
        attn_mask=mask,
    ).transpose(0, 1)
    torch.testing.assert_close(ours, reference, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("used", [1, 63, 64, 65, 128, 1000])
def test_a_mask_covers_the_used_slots_in_whole_blocks(used):
    width = padded_width(used)
    assert width % BLOCK == 0 and width >= max(used, 2 * BLOCK)
    assert width - used < BLOCK or width == 2 * BLOCK  # no more blocks than the slots need
    _, mask = feed_rows(used - 1, used)
    assert mask.shape == (1, width) and mask[0, :used].all() and not mask[0, used:].any()


def test_a_bf16_model_gives_a_position_the_same_logits_in_a_verification_and_alone():
    """The eager path (transformers' layers over a DynamicCache): feeds of several tokens and the same
    tokens one by one give bitwise the same logits, as exact decoding's equality with target-only needs."""
    from diversed_demo.runtime.attention import use_grouped_attention

    model = tiny_model(0, 2).to(torch.bfloat16)
    assert use_grouped_attention(model)
    vocab = model.config.vocab_size
    tokens = torch.randint(4, vocab, (90,), generator=torch.Generator().manual_seed(4))
    prompt, rest = tokens[:60], tokens[60:]
    with torch.inference_mode():
        one = CachedLM(model, vocab)
        one.forward(prompt, 1)
        alone = torch.cat([one.forward(t[None], 1)[0] for t in rest])
        chunked = CachedLM(model, vocab)
        chunked.forward(prompt, 1)
        parts = [chunked.forward(rest[i : i + 5], 5)[0] for i in range(0, len(rest), 5)]
    assert torch.equal(torch.cat(parts), alone)
