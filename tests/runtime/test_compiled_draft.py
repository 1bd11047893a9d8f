"""The EAGLE-3 draft's step over a static cache (runtime/static_draft.py) and its compiled runner
(runtime/compiled_draft.py): drafting on it proposes what the eager draft does, through restarts, rollbacks,
lending and a cache that runs out."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import PROMPTS, tiny_feature_pair
from tiny import tiny_eagle3, tiny_model, tiny_tokenizer

from diversed_demo.core.draft import FeatureDraft
from diversed_demo.core.sampling import Sampler
from diversed_demo.models.pair import ModelPair
from diversed_demo.runtime import fused_attention, int8_draft
from diversed_demo.runtime.compiled_draft import (
    attach_draft,
    build_draft_package,
    fused_step,
    step_agrees_with_eager,
)
from diversed_demo.runtime.compiled_pass import CompiledPass
from diversed_demo.runtime.int8_draft import use_int8_draft
from diversed_demo.runtime.plan import speed_up
from diversed_demo.runtime.static_draft import StaticDraftStep


@pytest.fixture
def bf16_pair(monkeypatch, tmp_path):
    """The tiny feature pair in bf16, its draft on 8-bit products, as the app runs an EAGLE-3 draft."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: True)
    return bf16_int8(copy.deepcopy(tiny_feature_pair()))


@pytest.fixture
def wide_bf16_pair(monkeypatch, tmp_path):
    """As bf16_pair, with heads of 32 (the fused attention's smallest)."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: True)
    target = tiny_model(0, num_layers=3, hidden=128)
    pair = ModelPair(target, tiny_eagle3(target), tiny_tokenizer(), "tiny-wide", "tiny-eagle3", target.device)
    speed_up(pair)
    return bf16_int8(pair)


def bf16_int8(pair):
    pair.target.to(torch.bfloat16)
    pair.draft.to(torch.bfloat16)
    assert use_int8_draft(pair.draft) > 0
    return pair


def scripted_proposals(pair, sequence: list[int], start: int, advances: list[int]):
    """A FeatureDraft's proposals (tokens, q, hidden) of 3 tokens as a decode would ask for them, with the
    sequence growing by `advances` between proposals (an accepted prefix and a target token: the draft's
    speculative entries are dropped) and the target's true features observed."""
    with torch.no_grad():
        out = pair.target.model(torch.tensor([sequence]), output_hidden_states=True)
        features = torch.cat([out.hidden_states[i] for i in pair.draft.aux_layer_ids], -1)[0]
    draft, length, proposals = FeatureDraft(pair.draft, pair.draft_pass), start, []
    draft.observe(length, features[: length - 1])
    for advance in advances:
        sampler = Sampler(1.0, 1.0, torch.Generator().manual_seed(length))
        proposals.append(draft.propose(torch.tensor(sequence[:length]), 3, sampler))
        draft.observe(length + advance, features[length - 1 : length + advance - 1])
        length += advance
    draft.close()
    return proposals


def assert_same_proposals(got, expected):
    """The same q (to rounding) wherever the drafts saw the same tokens, and the same draws but perhaps one
    (a draw that lands on a boundary of q may go the other way, and the round's later steps with it)."""
    same_rounds = 0
    for (tokens, q, hidden), (tokens_e, q_e, hidden_e) in zip(got, expected, strict=True):
        seen = len(q) if torch.equal(tokens, tokens_e) else 1
        same_rounds += seen == len(q)
        assert 0.5 * (q[:seen] - q_e[:seen]).abs().sum(-1).max() < 0.05  # float32 attention products
        assert torch.allclose(hidden[:seen].float(), hidden_e[:seen].float(), atol=0.1, rtol=0.05)
    assert same_rounds >= len(expected) - 1


SEQUENCE = [1] + torch.randint(4, 40, (40,), generator=torch.Generator().manual_seed(0)).tolist()
START = 8  # the prompt
ADVANCES = [1, 3, 2, 4, 1, 1, 2, 3, 4, 2]


def test_drafting_on_the_static_step_proposes_what_the_eager_draft_does(bf16_pair):
    eager = scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES)
    bf16_pair.draft_pass = CompiledPass(StaticDraftStep(bf16_pair.draft, max_len=256))
    assert_same_proposals(scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES), eager)


def test_drafting_on_the_fused_attention_proposes_what_attention_in_blocks_does(wide_bf16_pair):
    """The step on the fused kernel against the same step attending in blocks (the eager draft of this
    wider pair departs from either by more bf16 rounding than the test above allows)."""
    pair = wide_bf16_pair
    if not (fused_step(pair.draft) and fused_attention.ensure()):
        pytest.skip("this CPU has neither AVX-512 with BF16 nor AVX2 (or the kernel did not build)")
    pair.draft_pass = CompiledPass(StaticDraftStep(pair.draft, 256, fused=False))
    in_blocks = scripted_proposals(pair, SEQUENCE, START, ADVANCES)
    pair.draft_pass = CompiledPass(StaticDraftStep(pair.draft, 256, fused=True))
    assert_same_proposals(scripted_proposals(pair, SEQUENCE, START, ADVANCES), in_blocks)


def test_drafting_past_the_static_cache_goes_on_eagerly(bf16_pair):
    eager = scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES)
    short = START + 12  # runs out mid-way
    bf16_pair.draft_pass = CompiledPass(StaticDraftStep(bf16_pair.draft, max_len=short))
    assert_same_proposals(scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES), eager)
    assert bf16_pair.draft_pass.acquire(object())  # given back when it ran out


def test_a_step_that_fails_mid_decode_drafts_on_eagerly(bf16_pair):
    eager = scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES)
    calls = 0

    def flaky(*inputs):  # the package's runner, failing on its fifth step
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("out of memory")
        return failing.module(*inputs)

    failing = CompiledPass(StaticDraftStep(bf16_pair.draft, max_len=256), runner=flaky)
    bf16_pair.draft_pass = failing
    with pytest.warns(RuntimeWarning, match="goes on eagerly"):
        assert_same_proposals(scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES), eager)
    assert calls == 5 and not failing.acquire(object())


def test_one_draft_at_a_time_holds_the_compiled_step(bf16_pair):
    compiled = CompiledPass(StaticDraftStep(bf16_pair.draft, max_len=256))
    first, second = FeatureDraft(bf16_pair.draft, compiled), FeatureDraft(bf16_pair.draft, compiled)
    features = torch.zeros(len(PROMPTS[0]) - 1, 3 * bf16_pair.draft.hidden_size, dtype=torch.bfloat16)
    sampler = lambda logits: (logits.argmax(), torch.softmax(logits.float(), -1))  # noqa: E731
    for draft in (first, second):
        draft.observe(len(PROMPTS[0]), features)
        draft.propose(torch.tensor(PROMPTS[0]), 2, sampler)
    assert first.compiled is compiled and second.compiled is None  # the second drafts eagerly
    first.close()
    assert compiled.acquire(object())


def test_a_step_that_disagrees_is_not_lent(bf16_pair):
    draft = bf16_pair.draft
    broken = CompiledPass(StaticDraftStep(draft, max_len=64), runner=lambda *inputs: wrong(*inputs))

    def wrong(*inputs):
        hidden, logits = broken.module(*inputs)
        return hidden, logits + 5.0

    assert not step_agrees_with_eager(draft, broken)
    assert step_agrees_with_eager(draft, CompiledPass(StaticDraftStep(draft, max_len=64)))


@pytest.mark.slow
def test_the_aot_compiled_draft_step_drafts_what_the_eager_draft_does(bf16_pair, tmp_path):
    eager = scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES)
    path = build_draft_package(bf16_pair.draft, tmp_path / "step.pt2")
    bf16_pair.draft_pass = attach_draft(bf16_pair.draft, path)
    assert bf16_pair.draft_pass is not None
    assert_same_proposals(scripted_proposals(bf16_pair, SEQUENCE, START, ADVANCES), eager)


def test_a_change_to_the_steps_code_builds_a_new_package(bf16_pair, monkeypatch):
    from diversed_demo.runtime import compiled_draft

    path = compiled_draft.draft_package_path(bf16_pair.draft)
    assert compiled_draft.draft_package_path(bf16_pair.draft) == path  # the same draft, the same package
    monkeypatch.setattr(compiled_draft, "STEP_SOURCES", compiled_draft.STEP_SOURCES[:-1])
    assert compiled_draft.draft_package_path(bf16_pair.draft) != path


@pytest.mark.parametrize("checks_out", [True, False])
@pytest.mark.parametrize("part", ["target", "draft"])
def test_an_autotuned_package_that_does_not_check_out_is_built_again_plainly(
    bf16_pair, tmp_path, monkeypatch, checks_out, part
):
    from diversed_demo.runtime import compiled_draft, compiled_pass

    builds, said = [], []
    monkeypatch.setattr(compiled_pass, "compile_module", lambda m, i, path, configs: builds.append(configs))
    attached = lambda *a, **k: object() if checks_out else None  # noqa: E731
    monkeypatch.setattr(compiled_pass, "attach", attached)
    monkeypatch.setattr(compiled_draft, "attach_draft", attached)
    if part == "target":
        monkeypatch.setattr(compiled_pass, "StaticPass", lambda *args: None)  # the tiny target is not lean
        compiled_pass.build_package(bf16_pair.target, [], tmp_path / "pass.pt2", log=said.append)
    else:
        compiled_draft.build_draft_package(bf16_pair.draft, tmp_path / "step.pt2", log=said.append)
    assert builds == ([None] if checks_out else [None, {}])
    assert bool(said) is not checks_out
