"""The draft on 8-bit weights: the products it computes, where it is switched on, and its proposals."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import PROMPTS, tiny_feature_pair

from diversed_demo.core.config import PASS_ROWS
from diversed_demo.core.draft import FeatureDraft
from diversed_demo.core.sampling import Sampler
from diversed_demo.runtime import amx_gguf, int8_draft
from diversed_demo.runtime.int8_draft import INT8_ROWS, Int8Linear, quantise_rows, use_int8_draft


@pytest.mark.parametrize("rows", [1, INT8_ROWS, INT8_ROWS + 3])
def test_int8_linear_computes_its_codes_few_rows_and_the_dense_weight_beyond(rows):
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 96, bias=False).bfloat16()
    layer.weight.data = (torch.randn(96, 64, generator=g) / 8).bfloat16()
    dense = layer.weight.detach().clone()
    codes, scales = quantise_rows(dense)
    assert (codes.float() * scales.float()[:, None] - dense.float()).abs().max() <= scales.float().max() / 2
    layer.int8 = (codes, scales)
    layer.__class__ = Int8Linear
    x = torch.randn(1, rows, 64, generator=g).bfloat16()
    weight = codes.float() * scales.float()[:, None] if rows <= INT8_ROWS else dense.float()
    expected = x.float() @ weight.T
    assert torch.allclose(layer(x).float(), expected, atol=0.05, rtol=0.02)


needs_kernel = pytest.mark.skipif(
    not amx_gguf.AmxKernel().available(wait=True), reason="the GGUF kernel does not serve on this CPU"
)


@needs_kernel
@pytest.mark.parametrize("rows", [1, INT8_ROWS, 2 * INT8_ROWS + 3, PASS_ROWS + 5])
def test_on_the_gguf_kernel_the_draft_multiplies_its_blocks_at_the_rows_it_takes(rows):
    """Q8_0 blocks (an fp16 scale per 32 weights) on the kernel: within half a step of each weight, and the
    product of those weights (and rows as it multiplies them) for any number of rows, a draft's prompt too."""
    g = torch.Generator().manual_seed(1)
    layer = torch.nn.Linear(64, 96, bias=False).bfloat16()
    layer.weight.data = (torch.randn(96, 64, generator=g) / 8).bfloat16()
    draft = torch.nn.Sequential(layer)
    draft.lm_head = layer
    assert (
        use_int8_draft(draft, when_faster=False, kernel=True) == 1 and int8_draft.products(draft) == "blocks"
    )
    (records,) = layer.int8
    unit = torch.eye(64).bfloat16()
    weights = int8_draft.int8_product(unit, records).float().T  # the kernel's own weights, column by column
    steps = layer.weight.float().abs().unflatten(1, (2, 32)).amax(-1, keepdim=True) / 127
    assert ((weights - layer.weight.float()).unflatten(1, (2, 32)).abs() <= steps / 2 + 1e-3).all()
    x = torch.randn(rows, 64, generator=g).bfloat16()
    expected = int8_draft.int8_product(x, records)
    assert torch.equal(layer(x), expected)
    multiplied = amx_gguf.rows_as_multiplied(x)
    torch.testing.assert_close(expected.float(), multiplied @ weights.T, atol=0.02, rtol=2**-7)


def test_only_a_bf16_draft_on_the_cpu_where_it_pays_is_switched(monkeypatch):
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: True)
    assert use_int8_draft(copy.deepcopy(tiny_feature_pair().draft)) == 0  # float32 keeps its layers
    draft = copy.deepcopy(tiny_feature_pair().draft).bfloat16()
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: False)
    assert use_int8_draft(draft) == 0 and not any(isinstance(m, Int8Linear) for m in draft.modules())
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: True)
    switched = use_int8_draft(draft)
    assert switched == sum(isinstance(m, torch.nn.Linear) for m in draft.modules()) > 0


def test_an_int8_draft_proposes_what_its_dense_self_does(monkeypatch):
    # The rounding moves q a little: the same greedy drafts, and q close in total variation.
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: True)
    pair = tiny_feature_pair()
    dense = copy.deepcopy(pair.draft).bfloat16()
    quantised = copy.deepcopy(dense)
    use_int8_draft(quantised)
    context = PROMPTS[3]
    with torch.no_grad():
        out = pair.target.model(torch.tensor([context]), output_hidden_states=True)
        features = torch.cat([out.hidden_states[i] for i in dense.aux_layer_ids], -1)[0]
    proposals = []
    for model in (dense, quantised):
        draft = FeatureDraft(model)
        draft.observe(len(context), features[:-1].bfloat16())
        sampler = Sampler(0.0, 1.0, torch.Generator().manual_seed(0))
        proposals.append(draft.propose(torch.tensor(context), 4, sampler))
    (dense_tokens, dense_q, _), (tokens, q, _) = proposals
    assert torch.equal(tokens, dense_tokens)
    distance = 0.5 * (q - dense_q).abs().sum(-1)
    assert 0 < distance.max() < 0.05  # the 8-bit products ran, and moved q only a little


@needs_kernel
def test_a_draft_on_rows_gets_its_blocks_aside_for_the_kernel_built_since(monkeypatch):
    """A first start's draft runs on PyTorch's per-row products until the kernel is built; then its records
    are built without touching it (a decode may be running) and, swapped in, serve as a later start's do."""
    monkeypatch.setattr(int8_draft, "int8_pays", lambda dtype: True)
    monkeypatch.setattr(int8_draft, "blocks_pay", lambda: True)
    layer = torch.nn.Linear(64, 96, bias=False).bfloat16()  # a record's 32 rows and inputs fit
    draft = torch.nn.Sequential(layer)
    draft.lm_head = layer
    use_int8_draft(draft, kernel=False)
    assert int8_draft.products(draft) == "rows"
    aside = int8_draft.blocks_aside(draft)
    assert aside and int8_draft.products(draft) == "rows"  # nothing changed yet
    int8_draft.use_blocks(aside)
    assert int8_draft.products(draft) == "blocks" and not int8_draft.blocks_aside(draft)
    layer, (records,) = next(iter(aside.items()))
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert torch.equal(layer(x), int8_draft.int8_product(x, records))


@needs_kernel
def test_a_dense_draft_gets_its_blocks_too(monkeypatch):
    """Where PyTorch's 8-bit products did not pay at a first start, the draft stays dense until the kernel is
    built; then it moves onto the kernel's blocks as a later start's draft does."""
    monkeypatch.setattr(int8_draft, "blocks_pay", lambda: True)
    layer = torch.nn.Linear(64, 96, bias=False).bfloat16()
    draft = torch.nn.Sequential(layer)
    draft.lm_head = layer
    assert int8_draft.products(draft) == "dense"
    int8_draft.use_blocks(int8_draft.blocks_aside(draft))
    assert int8_draft.products(draft) == "blocks" and isinstance(layer, Int8Linear)


@needs_kernel
def test_the_static_step_feeds_a_prompt_on_the_blocks():
    """A prompt's feed (more rows than a step) multiplies on the GGUF kernel's records, which take any
    number of rows, as the eager draft does."""
    from tiny import tiny_eagle3, tiny_model

    from diversed_demo.runtime.static_draft import K_MAX, StaticDraftStep

    draft = tiny_eagle3(tiny_model(0, num_layers=3, hidden=128)).bfloat16()  # its widths fit the records
    assert (
        use_int8_draft(draft, when_faster=False, kernel=True) > 0 and int8_draft.products(draft) == "blocks"
    )
    step = StaticDraftStep(draft, max_len=256)
    assert step.int8_rows > 300  # the kernel takes any number of rows
    width = step.lm_head.shape[1]
    for rows in (K_MAX, K_MAX + 9, 300):
        x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows)).bfloat16()
        with torch.inference_mode():
            expected = int8_draft.int8_product(x, step.lm_head_int8_0)
            assert torch.equal(step._product("lm_head", x), expected)
