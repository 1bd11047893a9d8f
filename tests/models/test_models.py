"""The pair's layers on CPU: the fast linear product and the grouped attention must compute what
transformers' own do."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_pair

from diversed_demo.runtime import linear
from diversed_demo.runtime.linear import FastLinear, linear_product, stock_linear


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 65, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_project_is_the_linear_product(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 24, generator=generator)
    bias = torch.randn(48, generator=generator) if with_bias else None
    hidden = torch.randn(1, rows, 24, generator=generator)
    expected = torch.nn.functional.linear(hidden, weight, bias)
    out = linear_product(weight, hidden, bias)
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out, expected)


def test_project_trains_like_linear():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(8, 6, generator=generator, requires_grad=True)
    hidden = torch.randn(3, 6, generator=generator)
    linear_product(weight, hidden).square().sum().backward()
    fast_grad, weight.grad = weight.grad, None
    torch.nn.functional.linear(hidden, weight).square().sum().backward()
    torch.testing.assert_close(fast_grad, weight.grad)


def test_pair_uses_the_stock_product_where_the_fast_one_does_not_pay(monkeypatch):
    monkeypatch.setattr(linear, "fast_product_pays", lambda: False)
    pair = tiny_pair()
    assert not any(type(m) is FastLinear for m in pair.target.modules())


def test_pair_uses_fast_linear_with_unchanged_weights_and_logits(monkeypatch):
    monkeypatch.setattr(linear, "fast_product_pays", lambda: True)
    pair = tiny_pair()
    linears = [m for m in pair.target.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is FastLinear for m in linears)
    keys = pair.target.state_dict().keys()
    ids = torch.tensor([[1, 5, 9, 7, 12]])
    with torch.inference_mode():
        for n in (1, 3, 5):  # decoding-sized blocks through the fast path
            fast = pair.target(ids[:, :n]).logits
            with stock_linear(pair.target):
                assert all(type(m) is torch.nn.Linear for m in linears)
                assert pair.target.state_dict().keys() == keys
                stock = pair.target(ids[:, :n]).logits
            torch.testing.assert_close(fast, stock)
    assert all(type(m) is FastLinear for m in linears)


def test_a_gguf_is_parsed_once_per_conversion(tmp_path):
    """transformers opens the GGUF three times during a conversion: inside it they share one reader and one
    tensor-name map, and outside it gguf is left as it was."""
    import gguf
    from gguf import GGUFWriter

    from diversed_demo.models.gguf_cache import _gguf_read_once

    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
    with _gguf_read_once():
        assert gguf.GGUFReader(str(path)) is gguf.GGUFReader(str(path))
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2
        )
        assert gguf_utils.load_gguf_checkpoint is not originals[2]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint) == originals
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))


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


def test_runs_faster_picks_the_faster_call():
    from diversed_demo.common.timing import runs_faster

    quick, slow = (lambda: sum(range(10)), lambda: sum(range(20000)))
    assert runs_faster(quick, slow, rounds=3, repeats=3)
    assert not runs_faster(slow, quick, rounds=3, repeats=3)
