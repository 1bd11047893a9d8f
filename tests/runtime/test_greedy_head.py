"""The greedy head kernel (runtime/greedy_head.py): a head's w_t as its own operations give them, the first
index of a tie as torch.max takes it, the same greedy decode, and the runtime handing it to the pair."""

from __future__ import annotations

import time

import pytest
import torch
from tiny import tiny_pair

from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.generate import generate
from diversed_demo.core.head import EnsembleHead, weight_rule
from diversed_demo.runtime import greedy_head, native_build, plan

# Skipped only where it does not compile (no g++): a kernel that builds but computes wrong fails here.
pytestmark = pytest.mark.skipif(not greedy_head.build(), reason="the kernel does not compile here")
KERNEL = greedy_head.Kernel()


@pytest.fixture(autouse=True)
def loaded():
    if not greedy_head.loaded():
        native_build.load_built(greedy_head.library_path(), greedy_head.WHAT)


def test_its_check_at_load_passes():
    assert greedy_head.ensure()


def random_head(target_hidden: int, draft_hidden: int, units: int, w_min: float, seed: int) -> EnsembleHead:
    generator = torch.Generator().manual_seed(seed)
    head = EnsembleHead(target_hidden, draft_hidden, hidden_size=units, w_min=w_min, pq_features=True)
    with torch.no_grad():  # a logit of about unit scale: w_t away from 0 and 1
        for layer in (head.mlp[0], head.mlp[2]):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) / layer.in_features**0.5)
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator) / 10)
    return head.eval()


def rows(n: int, vocab: int, widths: tuple[int, int], seed: int):
    generator = torch.Generator().manual_seed(seed)
    p, q = (torch.softmax(4 * torch.randn(n, vocab, generator=generator), -1) for _ in range(2))
    hidden = [torch.randn(n, width, generator=generator).bfloat16() for width in widths]
    return p, q, *hidden


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("vocab", [300, 3000, 49152])
def test_its_weights_are_the_heads_own(n, vocab):
    head = random_head(40, 24, 16, 0.2 * (n % 2), seed=n + vocab)
    p, q, target_hidden, draft_hidden = rows(n, vocab, (40, 24), seed=vocab)
    p[0, vocab - 1] = 1.0  # one row's maximum at the very end (in the tail, where V is not whole blocks)
    with torch.inference_mode():
        fused = greedy_head.greedy_weights(head, p, q, target_hidden, draft_hidden)
        own = greedy_head.reference_weights(head, p, q, target_hidden, draft_hidden)
    torch.testing.assert_close(fused, own, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("tied", [(7, 1500), (1030, 2047), (5, 2990)])
def test_a_tie_in_p_goes_to_its_first_index(tied):
    """p's maximum at two indices (in two blocks, one block, a block and the tail), the draft choosing the
    second: the two choices differ (TV = 1), as torch.max's first index says; a kernel taking the last
    index would see them agree and give another w_t."""
    head = random_head(40, 24, 16, 0.0, seed=3)
    with torch.no_grad():
        head.mlp[0].weight[:, -2] *= 30  # TV's column: its term moves w_t plainly
    p, q, target_hidden, draft_hidden = rows(2, 3000, (40, 24), seed=5)
    first, second = tied
    p[:, first] = p[:, second] = 1.0
    q[:, second] = 1.0
    with torch.inference_mode():
        fused = greedy_head.greedy_weights(head, p, q, target_hidden, draft_hidden)
        own = greedy_head.reference_weights(head, p, q, target_hidden, draft_hidden)
        p[:, first] = 0.5  # the draft's choice alone at the top: the terms, and so w_t, change
        agreeing = greedy_head.reference_weights(head, p, q, target_hidden, draft_hidden)
    torch.testing.assert_close(fused, own, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(fused, agreeing, atol=1e-3)


def test_a_greedy_decode_on_it_gives_the_heads_own_tokens(monkeypatch):
    pair = tiny_pair()
    hidden = pair.target.config.hidden_size
    head = random_head(hidden, hidden, 8, 0.0, seed=13)
    calls = []
    fused = greedy_head.greedy_weights
    spy = staticmethod(lambda *args: calls.append(1) or fused(*args))
    monkeypatch.setattr(greedy_head.Kernel, "greedy_weights", spy)
    config = DecodeConfig(mode="dynamic", head=head, n_draft=3, temperature=0.0, max_new_tokens=24)
    tokens, weights = {}, {}
    for kernel in (None, KERNEL):
        pair.head_kernel = kernel
        _, events = generate(pair, "the cat sat on", config)
        tokens[kernel] = [(event.kind, event.token_id) for event in events]
        weights[kernel] = [event.w for event in events if event.w is not None]
    assert calls, "the decode did not weigh on the kernel"
    assert tokens[KERNEL] == tokens[None]
    assert weights[KERNEL] == pytest.approx(weights[None], abs=1e-5) and len(set(weights[None])) > 3


def test_heads_it_does_not_take_keep_their_own_operations(monkeypatch):
    called = staticmethod(lambda *args: pytest.fail("the kernel was called"))
    monkeypatch.setattr(greedy_head.Kernel, "greedy_weights", called)
    hidden_only = EnsembleHead(8, 8, hidden_size=8)
    linear = EnsembleHead(8, 8, hidden_size=0, pq_features=True)
    reading = random_head(8, 8, 8, 0.0, seed=1)
    assert not greedy_head.takes(hidden_only) and not greedy_head.takes(linear)
    assert greedy_head.takes(reading)
    assert not greedy_head.takes(random_head(8, 8, 8, 0.0, seed=1).bfloat16())
    sampled = weight_rule(DecodeConfig(mode="dynamic", head=reading, temperature=1.0), False, KERNEL)
    p, q, target_hidden, draft_hidden = rows(3, 300, (8, 8), seed=2)
    assert sampled(p, q, None, target_hidden, draft_hidden).shape == (3,)


def test_the_runtime_hands_the_pair_the_kernel(monkeypatch):
    lines = []
    pair = tiny_pair()
    plan.attach_head_kernel(pair, lines.append, wait=True)
    assert isinstance(pair.head_kernel, greedy_head.Kernel) and lines == [plan.ATTACHED]
    monkeypatch.setenv(greedy_head.SWITCH, "0")
    switched_off = tiny_pair()
    plan.attach_head_kernel(switched_off, lines.append, wait=True)
    assert switched_off.head_kernel is None


def test_a_kernel_not_built_yet_is_built_aside_and_handed_over(monkeypatch):
    """At a start where the library is not built, load_pair returns at once; the kernel is compiled on a
    background thread and handed over once built."""
    built_on = []
    monkeypatch.setattr(greedy_head, "built", lambda: False)
    monkeypatch.setattr(greedy_head, "build", lambda background: built_on.append(background) or True)
    pair, lines = tiny_pair(), []
    plan.attach_head_kernel(pair, lines.append, wait=False)
    deadline = time.monotonic() + 30
    while pair.head_kernel is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(pair.head_kernel, greedy_head.Kernel) and built_on == [True]
