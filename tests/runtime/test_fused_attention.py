"""The fused attention kernel (runtime/fused_attention.py): attention to float32 rounding, and a row's bits
independent of the rows beside it and of masked slots between its own, so that exact decoding is exact on
chains and trees."""

from __future__ import annotations

import pytest
import torch

from diversed_demo.runtime import fused_attention
from diversed_demo.runtime.block_attention import feed_rows, padded_mask

needs_kernel = pytest.mark.skipif(
    not (fused_attention.serves(torch.bfloat16, 64) and fused_attention.ensure()),
    reason="this CPU has neither AVX-512 with BF16 nor AVX2 (or the kernel did not build)",
)
pytestmark = needs_kernel


def cache(n_kv: int, dim: int, slots: int = 512, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n_kv, slots, dim, generator=generator).bfloat16() for _ in range(2)]


def reference(query, keys, values, mask):
    """float64 softmax attention over the slots each row sees."""
    k, n_q, dim = query.shape
    n_kv, width = keys.shape[0], mask.shape[1]
    group = n_q // n_kv
    q = query.double().view(k, n_kv, group, dim).transpose(0, 1)  # [n_kv, k, group, D]
    scores = q @ keys[:, :width].double().transpose(-1, -2)[:, None] / dim**0.5
    scores = scores.masked_fill(~mask[None, :, None], float("-inf"))
    out = torch.softmax(scores, -1) @ values[:, :width].double()[:, None]
    return out.transpose(0, 1).reshape(k, n_q * dim)


@pytest.mark.parametrize(("n_q", "n_kv", "dim"), [(9, 3, 64), (4, 2, 32), (8, 8, 128), (6, 1, 64)])
@pytest.mark.parametrize("used", [1, 15, 17, 300])
def test_it_is_softmax_attention_to_float32_rounding(n_q, n_kv, dim, used):
    keys, values = cache(n_kv, dim)
    for k in (1, 5):
        query = torch.randn(k, n_q, dim, generator=torch.Generator().manual_seed(k + used)).bfloat16()
        _, mask = feed_rows(used, used + k)
        out = fused_attention.attend(query, keys, values, mask)
        assert out.shape == (k, n_q * dim) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), reference(query, keys, values, mask), rtol=2**-7, atol=2e-3)


@pytest.mark.parametrize("rows", [2, 5, 8, 9])
def test_a_chains_rows_get_the_bits_of_one_token_passes(rows):
    """A verification of a chain: its row at position i gives what a one-token pass at i gives."""
    keys, values = cache(3, 64)
    query = torch.randn(rows, 9, 64, generator=torch.Generator().manual_seed(rows)).bfloat16()
    start = 300
    together = fused_attention.attend(query, keys, values, feed_rows(start, start + rows)[1])
    for i in range(rows):
        alone = fused_attention.attend(query[i : i + 1], keys, values, feed_rows(start + i, start + i + 1)[1])
        assert torch.equal(together[i : i + 1], alone), f"row {i} of {rows}"


def tree_and_chain(used: int = 200):
    """A cache where a node's ancestors sit at slots used + 0, 2, 4 (siblings between), and the cache of the
    chain over its path, at used + 0, 1, 2."""
    keys, values = cache(3, 64)
    path = [used, used + 2, used + 4]
    chain_keys, chain_values = keys.clone(), values.clone()
    for depth, slot in enumerate(path):
        chain_keys[:, used + depth], chain_values[:, used + depth] = keys[:, slot], values[:, slot]
    return used, path, (keys, values), (chain_keys, chain_values)


def test_a_tree_nodes_row_gets_the_bits_of_the_chain_over_its_path():
    """A node whose ancestors sit between their siblings (slots used + 0, 2, 4) gives what the chain over
    its path (slots used + 0, 1, 2) gives: positions, not slots, order every sum."""
    used, path, (keys, values), (chain_keys, chain_values) = tree_and_chain()
    query = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    sees = torch.zeros(2, used + 5, dtype=torch.bool)
    sees[:, :used] = True
    sees[0, path] = True
    sees[1, [used, used + 1]] = True  # a sibling row beside it
    tree = fused_attention.attend(query, keys, values, padded_mask(sees))
    chain = fused_attention.attend(query[:1], chain_keys, chain_values, feed_rows(used + 2, used + 3)[1])
    assert torch.equal(tree[:1], chain)


def test_a_kernel_that_sums_by_slot_fails_the_tree_test():
    """The tree test can fail: attention that sums a row's slots by their place in the cache (masked ones
    between) differs from the chain's in the last bits for some node."""
    used, path, (keys, values), (chain_keys, chain_values) = tree_and_chain()
    differ = 0
    for seed in range(20):
        query = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(seed)).bfloat16()
        sees = torch.zeros(1, used + 5, dtype=torch.bool)
        sees[:, :used] = True
        sees[0, path] = True
        by_slot = by_slot_attention(query, keys, values, padded_mask(sees))
        chain = by_slot_attention(query, chain_keys, chain_values, feed_rows(used + 2, used + 3)[1])
        differ += not torch.equal(by_slot, chain)
    assert differ > 0


def by_slot_attention(query, keys, values, mask):
    """float32 attention (left unrounded) whose sums run over the slots in cache order, in lanes of 16."""
    k, n_q, dim = query.shape
    n_kv, width = keys.shape[0], mask.shape[1]
    q = query.float().view(k, n_kv, n_q // n_kv, dim).transpose(0, 1)
    scores = (q @ keys[:, :width].float().transpose(-1, -2)[:, None] / dim**0.5).masked_fill(
        ~mask[None, :, None], float("-inf")
    )
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    lanes = weights.unflatten(-1, (-1, 16)).sum(-2)  # a lane sums slots lane, lane + 16, ... in order
    out = (weights @ values[:, :width].float()[:, None]) / lanes.sum(-1, keepdim=True)
    return out.transpose(0, 1).reshape(k, n_q * dim)
