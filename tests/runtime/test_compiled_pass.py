"""The target's whole pass over a static cache (runtime/static_pass.py) and its compiled runner
(runtime/compiled_pass.py): what the eager pass computes, through CachedLM's rollbacks and fallbacks."""

from __future__ import annotations

import os
import time

import pytest
import torch
from references import AUX, TREE_PARENTS, decode_like, path_to, random_feeds, tree_logits_match_paths
from tiny import tiny_model, tiny_q4_model

from diversed_demo.core.cache import CachedLM
from diversed_demo.core.config import TREE_LIMITS
from diversed_demo.runtime import amx_gguf, compiled_pass, fused_attention, gguf_int4
from diversed_demo.runtime.amx_gguf import AmxKernel
from diversed_demo.runtime.attention import use_grouped_attention
from diversed_demo.runtime.compiled_build import prune
from diversed_demo.runtime.compiled_pass import CompiledPass, agrees_with_eager, attach, build_package
from diversed_demo.runtime.gguf_int4 import use_gguf_int4
from diversed_demo.runtime.lean_layer import use_lean_layers
from diversed_demo.runtime.static_pass import K_MAX, StaticPass, compilable


@pytest.fixture
def lean_model(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_int4, "int4_pays", lambda dtype: True)  # the kernel's logic, whatever the CPU
    path = tmp_path / "tiny.gguf"
    model = tiny_q4_model(path).to(torch.bfloat16)
    use_grouped_attention(model)
    use_gguf_int4(model, path, AmxKernel())
    use_lean_layers(model)
    assert compilable(model)
    return model


def fused_kernel() -> bool:
    return fused_attention.serves(torch.bfloat16, 32) and fused_attention.ensure()


@pytest.mark.parametrize("fused", [False, True])
def test_a_decode_through_the_static_pass_computes_the_eager_one(lean_model, fused):
    if fused and not fused_kernel():
        pytest.skip("this CPU has neither AVX-512 with BF16 nor AVX2 (or the kernel did not build)")
    feeds, rollbacks = random_feeds(0, lean_model.config.vocab_size, passes=12)
    eager, held = decode_like(lean_model, feeds, rollbacks)
    assert not held
    runner = CompiledPass(StaticPass(lean_model, AUX, 128, fused))
    static, held = decode_like(lean_model, feeds, rollbacks, runner=runner)
    assert held  # the passes after the prompt ran on the static cache
    for (a, a_hidden, a_aux), (b, b_hidden, b_aux) in zip(eager, static, strict=True):
        torch.testing.assert_close(b, a, rtol=0.03, atol=0.03)  # bf16, float32 attention on both sides
        # hidden states reach a few units, where one bf16 step is 0.03: feeds of up to 16 rows meet it
        torch.testing.assert_close(b_hidden, a_hidden, rtol=0.03, atol=0.05)
        torch.testing.assert_close(b_aux, a_aux, rtol=0.03, atol=0.05)


def test_long_passes_and_a_full_cache_go_on_eagerly_from_the_static_cache(lean_model):
    vocab = lean_model.config.vocab_size
    feeds, rollbacks = random_feeds(1, vocab, passes=6, prompt=30)
    feeds.insert(3, list(range(4, 4 + K_MAX + 3)))  # longer than a compiled pass takes
    rollbacks.insert(3, 2)
    eager, _ = decode_like(lean_model, feeds, rollbacks)
    runner = CompiledPass(StaticPass(lean_model, AUX, max_len=128))
    static, held = decode_like(lean_model, feeds, rollbacks, runner=runner)
    assert not held  # it left the compiled pass at the long feed, and stayed eager
    for (a, _, _), (b, _, _) in zip(eager, static, strict=True):
        torch.testing.assert_close(b, a, rtol=0.03, atol=0.03)
    feeds, rollbacks = random_feeds(2, vocab, passes=8, prompt=30)
    eager, _ = decode_like(lean_model, feeds, rollbacks)
    # a cache full within a few passes
    runner = CompiledPass(StaticPass(lean_model, AUX, max_len=40))
    near_full, held = decode_like(lean_model, feeds, rollbacks, runner=runner)
    assert not held
    for (a, _, _), (b, _, _) in zip(eager, near_full, strict=True):
        torch.testing.assert_close(b, a, rtol=0.03, atol=0.03)


def test_a_pass_that_fails_mid_decode_hands_the_decode_over_to_eager(lean_model):
    feeds, rollbacks = random_feeds(3, lean_model.config.vocab_size, passes=10)
    eager, _ = decode_like(lean_model, feeds, rollbacks)
    calls = 0

    def flaky(*inputs):  # the package's runner, out of memory on its fourth pass
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("out of memory")
        return failing.module(*inputs)

    failing = CompiledPass(StaticPass(lean_model, AUX, max_len=128), runner=flaky)
    with pytest.warns(RuntimeWarning, match="goes on eagerly"):
        handed_over, held = decode_like(lean_model, feeds, rollbacks, runner=failing)
    assert calls == 4 and not held  # eager from the failed pass on
    for (a, a_hidden, _), (b, b_hidden, _) in zip(eager, handed_over, strict=True):
        torch.testing.assert_close(b, a, rtol=0.03, atol=0.03)
        torch.testing.assert_close(b_hidden, a_hidden, rtol=0.03, atol=0.05)  # one bf16 step, as above
    assert not failing.acquire(object())  # later decodes stay eager


def test_one_decode_at_a_time_holds_the_compiled_pass(lean_model):
    compiled = CompiledPass(StaticPass(lean_model, AUX, max_len=128))
    vocab = lean_model.config.vocab_size
    first, second = (CachedLM(lean_model, vocab, AUX, runner=compiled) for _ in range(2))
    with torch.inference_mode():
        first.forward(torch.arange(4, 20), keep=1)
        second.forward(torch.arange(4, 20), keep=1)
    assert first.compiled is compiled and second.compiled is None  # the second decodes eagerly
    first.close()
    third = CachedLM(lean_model, vocab, AUX, runner=compiled)
    with torch.inference_mode():
        third.forward(torch.arange(4, 20), keep=1)
    assert third.compiled is compiled
    del third  # a decode dropped without close gives it back too
    assert compiled.acquire(object())


@pytest.mark.slow
def test_the_aot_compiled_package_computes_the_static_pass(lean_model, tmp_path):
    path = build_package(lean_model, AUX, tmp_path / "pass.pt2")
    os.utime(path, (0, 0))
    runner = attach(lean_model, AUX, path)
    assert runner is not None
    assert path.stat().st_mtime > time.time() - 60  # loading marks it in use, against pruning
    feeds, rollbacks = random_feeds(2, lean_model.config.vocab_size, passes=8)
    compiled, held = decode_like(lean_model, feeds, rollbacks, runner=runner)
    assert held
    static_runner = CompiledPass(StaticPass(lean_model, AUX, compiled_pass.MAX_LEN))
    static, _ = decode_like(lean_model, feeds, rollbacks, runner=static_runner)
    # inductor fuses away some bf16 roundings; where the kernel multiplies rows as 8-bit codes (AVX-512 VNNI,
    # AVX2) a last bit rounded otherwise moves a code by one: twice as far
    slack = 2 if amx_gguf.codes_rows() else 1
    for (a, _, a_aux), (b, _, b_aux) in zip(static, compiled, strict=True):
        torch.testing.assert_close(b, a, rtol=0.03, atol=0.03 * slack)
        torch.testing.assert_close(b_aux, a_aux, rtol=0.03, atol=0.05 * slack)


def test_packages_no_start_loaded_for_a_month_are_removed(tmp_path):
    old, fresh, wanted = (tmp_path / f"{name}.pt2" for name in ("old", "fresh", "wanted"))
    for package in (old, fresh, wanted):
        package.write_bytes(b"package")
    old.with_suffix(".log").write_text("its build log")
    timings = [package.with_suffix(".drafts-abc.json") for package in (old, wanted)]  # plan.tree_timing_path
    for timing in timings:
        timing.write_text('{"tree_speed": 0.95}')
    month_ago = time.time() - 31 * 86400
    for package in (old, wanted):
        os.utime(package, (month_ago, month_ago))
    assert prune(tmp_path, keep={wanted}) == [old]
    assert fresh.exists() and wanted.exists() and not old.exists() and not old.with_suffix(".log").exists()
    assert not timings[0].exists() and timings[1].exists()


def test_a_package_that_disagrees_is_not_attached(lean_model):
    broken = CompiledPass(StaticPass(lean_model, AUX, max_len=128), runner=lambda *inputs: wrong(*inputs))

    def wrong(tokens, positions, mask):
        logits, hidden, aux = broken.module(tokens, positions, mask)
        return logits + 5.0, hidden, aux

    assert not agrees_with_eager(lean_model, broken, AUX)
    good = CompiledPass(StaticPass(lean_model, AUX, max_len=128))
    assert agrees_with_eager(lean_model, good, AUX)


@pytest.mark.parametrize("kind", ["eager", "static", "static-fused", "eager-float32"])
def test_a_tree_pass_gives_each_node_what_a_pass_over_its_path_gives_it(lean_model, kind):
    """One pass over a draft tree scores every node as a chain over its own path would; keeping a path
    leaves the cache a chain's, so the next pass agrees too."""
    model = lean_model if kind != "eager-float32" else tiny_model(0, num_layers=3)
    vocab, prompt = model.config.vocab_size, torch.arange(4, 24)
    tokens = torch.tensor([7, 9, 11, 13, 15, 17])
    if kind == "static-fused" and not fused_kernel():
        pytest.skip("this CPU has neither AVX-512 with BF16 nor AVX2 (or the kernel did not build)")
    static = kind.startswith("static")
    fused = kind == "static-fused"
    runner = (lambda: CompiledPass(StaticPass(model, AUX, 128, fused))) if static else (lambda: None)
    with torch.inference_mode():
        exact = kind != "eager-float32"
        tree_lm, length = tree_logits_match_paths(model, runner, prompt, tokens, TREE_PARENTS, exact)
        kept = path_to(4, TREE_PARENTS)  # nodes 0, 2, 4: slots after the prefix's one
        tree_lm.keep_path(length + 1, torch.tensor(kept) + length + 1)
        after_tree, _, _ = tree_lm.forward(torch.tensor([19]), keep=1)
        chain = CachedLM(model, vocab, AUX, runner=runner())
        chain.forward(prompt[:-1], keep=1)
        chain.forward(torch.cat([prompt[-1:], tokens[kept]]), keep=1)
        after_chain, _, _ = chain.forward(torch.tensor([19]), keep=1)
        torch.testing.assert_close(after_tree, after_chain, rtol=1e-4, atol=1e-4)


# 15 nodes, the most a tree holds (core/config.TREE_LIMITS): with the unseen token, a pass of 16 rows
BIG_TREE = [-1, -1, -1, 0, 0, 0, 1, 1, 3, 3, 3, 6, 8, 8, 11]


def test_a_tree_of_the_most_nodes_runs_on_the_compiled_runner(lean_model):
    """A pass over a tree of the most nodes runs on the compiled runner, as its chains do: past the
    runner's range the module runs eagerly, which rounds otherwise than the AOT graph (greedy exact SD on
    15-node trees then departed from target-only: docs/results.md, "Draft trees against the chain")."""
    assert len(BIG_TREE) == TREE_LIMITS[3]
    fed = []

    def runner():
        module = StaticPass(lean_model, AUX, 128)
        return CompiledPass(module, lambda tokens, *rest: fed.append(len(tokens)) or module(tokens, *rest))

    tokens = torch.arange(7, 7 + len(BIG_TREE))
    with torch.inference_mode():
        tree_lm, _ = tree_logits_match_paths(lean_model, runner, torch.arange(4, 24), tokens, BIG_TREE, True)
        tree_lm.close()
    assert len(BIG_TREE) + 1 in fed
