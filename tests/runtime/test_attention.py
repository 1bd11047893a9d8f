"""The pair's attention on CPU (runtime/attention.py): grouped and in blocks, it computes what transformers'
own SDPA does."""

from __future__ import annotations

import torch
from tiny import tiny_pair


def _passes(lm, feeds_per_pass):
    """Logits of every row of every forward_rows pass (rows rolled back between passes as listed)."""
    logits = []
    for feeds, rollbacks in feeds_per_pass:
        logits += [out[0] for out in lm.forward_rows(feeds, [len(f) for f in feeds])]
        for row, length in rollbacks:
            lm.rollback(length, row)
    return logits


def test_grouped_attention_computes_transformers_sdpa():
    """The target's grouped attention (K/V heads read in place, mask or not) gives transformers' SDPA logits:
    one sequence (prefill, a one-token pass, a 3-token verification block) and a batch of two rows with a
    rolled-back row's holes masked out."""
    from diversed_demo.core.cache import CachedLM
    from diversed_demo.runtime.attention import GROUPED_SDPA, stock_attention

    pair = tiny_pair()
    assert (
        pair.target.config._attn_implementation == GROUPED_SDPA
    )  # tiny models have 4 query heads over 2 K/V
    one = [
        ([torch.tensor([1, 5, 9, 7, 12, 6])], []),
        ([torch.tensor([8])], []),
        ([torch.tensor([4, 11, 13])], [(0, 8)]),
        ([torch.tensor([10, 14, 15])], []),
    ]
    batch = [
        ([torch.tensor([1, 5, 9, 7]), torch.tensor([1, 6])], []),
        ([torch.tensor([8, 4, 11]), torch.tensor([9, 10, 12])], [(0, 5)]),
        ([torch.tensor([13, 14]), torch.tensor([15, 16])], []),
    ]
    with torch.inference_mode():
        for passes, rows in ((one, 1), (batch, 2)):
            grouped = _passes(CachedLM(pair.target, pair.vocab_size, rows=rows), passes)
            with stock_attention(pair.target):
                assert pair.target.config._attn_implementation == "sdpa"
                stock = _passes(CachedLM(pair.target, pair.vocab_size, rows=rows), passes)
            for a, b in zip(grouped, stock, strict=True):
                torch.testing.assert_close(a, b)
    assert pair.target.config._attn_implementation == GROUPED_SDPA


def test_ungrouped_heads_keep_transformers_sdpa():
    from transformers import LlamaConfig, LlamaForCausalLM

    from diversed_demo.runtime.attention import use_grouped_attention

    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model = LlamaForCausalLM(config)
    use_grouped_attention(model)
    assert model.config._attn_implementation == "sdpa"


def test_bf16_attention_in_blocks_is_as_accurate_as_transformers_sdpa():
    """In bf16 one sequence's decoding steps and verifications attend in blocks (block_attention.py): over a
    prompt, a step and a verification, their logits are no further from float32's on the same weights than
    transformers' own bf16 SDPA's (bf16's rounding through the layers, not the attention, sets both)."""
    import copy

    from diversed_demo.core.cache import CachedLM
    from diversed_demo.runtime.attention import stock_attention

    pair = tiny_pair()
    model = pair.target.to(torch.bfloat16)
    reference = copy.deepcopy(model).float()
    passes = [
        ([torch.tensor([1, 5, 9, 7, 12, 6])], []),
        ([torch.tensor([8])], []),
        ([torch.tensor([4, 3, 11])], []),
    ]
    with torch.inference_mode():
        ours = _passes(CachedLM(model, pair.vocab_size), passes)
        with stock_attention(model, reference):
            stock = _passes(CachedLM(model, pair.vocab_size), passes)
            exact = _passes(CachedLM(reference, pair.vocab_size), passes)

    def error(logits):
        return max((a.float() - b.float()).abs().max().item() for a, b in zip(logits, exact, strict=True))

    assert error(ours) <= error(stock)
