"""A GGUF target's 4-bit weights multiplied as stored (GgufLinear), the lean decoder layer over them and the
one-query attention: what transformers' own layers compute, to bf16's precision."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_q4_model, tiny_tokenizer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from diversed_demo.core.cache import CachedLM
from diversed_demo.models.pair import ModelPair
from diversed_demo.runtime import amx_gguf, gguf_int4
from diversed_demo.runtime.amx_gguf import AmxKernel
from diversed_demo.runtime.attention import GROUPED_SDPA, use_grouped_attention
from diversed_demo.runtime.costs import weight_bytes
from diversed_demo.runtime.gguf_int4 import GgufLinear, dequantised, int4_product, pack, use_gguf_int4
from diversed_demo.runtime.lean_layer import LeanLlamaLayer, use_lean_layers
from diversed_demo.runtime.plan import fast_target
from diversed_demo.runtime.stock import stock_layers


@pytest.fixture(autouse=True, params=["aten", "amx"])
def kernel(tmp_path, monkeypatch, request):
    """Each test on PyTorch's int4 kernel and, where the CPU has AMX, on the project's AMX one."""
    if request.param == "amx" and not amx_gguf.AmxKernel().available(wait=True):
        pytest.skip("this CPU has no AMX (or the kernel did not build)")
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_int4, "int4_pays", lambda dtype: True)  # the kernel's logic, whatever the CPU
    monkeypatch.setattr(
        gguf_int4, "int4_kernel", lambda dtype, amx: request.param if dtype == torch.bfloat16 else "aten"
    )
    return request.param


def q4_blocks(n_rows=128, n_cols=256, seed=0):
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n_rows, n_cols), dtype=torch.int32, generator=generator)
    d = torch.rand(n_rows, n_cols // 32, generator=generator).half().float() / 50
    m = -torch.rand(n_rows, n_cols // 32, generator=generator).half().float() / 5
    return codes, d, m


@pytest.mark.parametrize("rows", [1, 3, 4, 8])
def test_int4_product_computes_the_blocks_weights(rows):
    codes, d, m = q4_blocks()
    hidden = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    expected = hidden @ dequantised(codes, d, m).T
    exact = int4_product(hidden, *pack(codes, d, m, torch.float32))  # float32 scales: the blocks exactly
    torch.testing.assert_close(exact, expected, rtol=1e-5, atol=1e-4)
    in_bf16 = int4_product(hidden.bfloat16(), *pack(codes, d, m, torch.bfloat16))
    torch.testing.assert_close(in_bf16.float(), expected, rtol=0.02, atol=0.05)


def tiny_int4_model(tmp_path, qtype="Q4_1"):
    path = tmp_path / f"tiny-{qtype}.gguf"
    model = tiny_q4_model(path, qtype=qtype).to(torch.bfloat16)
    use_grouped_attention(model)  # as a pair runs it
    return model, path


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_the_gguf_blocks_replace_exactly_the_models_projections(tmp_path, qtype):
    model, path = tiny_int4_model(tmp_path, qtype)
    keys = model.state_dict().keys()
    assert use_gguf_int4(model, path, AmxKernel()) == 14  # 7 projections in each of 2 layers
    assert all(type(m) is GgufLinear for name, m in model.named_modules() if name.endswith("_proj"))
    assert model.state_dict().keys() == keys
    assert len(list((tmp_path / "cache").glob("*-int4-*.safetensors"))) == 1  # built once, then read
    again, _ = tiny_int4_model(tmp_path, qtype)
    assert use_gguf_int4(again, path, AmxKernel()) == 14
    for name, module in model.named_modules():
        if isinstance(module, GgufLinear):
            assert all(torch.equal(a, b) for a, b in zip(module.operands, again.get_submodule(name).operands))


def test_a_gguf_that_is_not_the_models_is_refused(tmp_path):
    model, path = tiny_int4_model(tmp_path)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5
    assert use_gguf_int4(model, path, AmxKernel()) == 0
    assert not any(isinstance(m, GgufLinear) for m in model.modules())


def test_float32_models_and_machines_where_it_does_not_pay_keep_their_layers(tmp_path, monkeypatch):
    model, path = tiny_int4_model(tmp_path)
    assert use_gguf_int4(model.float(), path, AmxKernel()) == 0  # float32 keeps transformers' exact numerics
    monkeypatch.setattr(gguf_int4, "int4_pays", lambda dtype: False)
    assert use_gguf_int4(model.bfloat16(), path, AmxKernel()) == 0


def test_a_loaded_model_moves_to_a_kernel_that_became_available(tmp_path, monkeypatch, kernel):
    """A first start runs on PyTorch's kernel until the AMX one is built, then moves its operands over."""
    if kernel != "amx":
        pytest.skip("moves to the AMX kernel")
    model, path = tiny_int4_model(tmp_path)
    monkeypatch.setattr(gguf_int4, "int4_kernel", lambda dtype, amx: "aten")
    fast_target(model, path, AmxKernel())
    ids = torch.arange(4, 20)[None]
    with torch.inference_mode():
        before = model(ids[:, :-3], use_cache=True)
        on_aten = model(ids[:, -3:], past_key_values=before.past_key_values).logits.float()
    monkeypatch.setattr(gguf_int4, "int4_kernel", lambda dtype, amx: "amx")
    fast_target(model, model.gguf_path, AmxKernel())  # the GGUF it was loaded from
    layer = model.model.layers[0]
    assert type(layer) is LeanLlamaLayer and len(layer.qkv) == 1 and len(layer.self_attn.o_proj.operands) == 1
    with torch.inference_mode():
        before = model(ids[:, :-3], use_cache=True)
        on_amx = model(ids[:, -3:], past_key_values=before.past_key_values).logits.float()
    torch.testing.assert_close(on_amx, on_aten, rtol=0.02, atol=0.02)


def test_a_q8_lm_head_is_multiplied_as_stored_on_the_amx_kernel(tmp_path, kernel):
    path = tmp_path / "tiny-q8-head.gguf"
    model = tiny_q4_model(path, q8_head=True).to(torch.bfloat16)
    dense_bytes = weight_bytes(model)
    assert use_gguf_int4(model, path, AmxKernel()) == (15 if kernel == "amx" else 14)  # and the head, on AMX
    head = model.get_output_embeddings()
    assert (type(head) is GgufLinear) == (kernel == "amx")
    assert head.weight is model.get_input_embeddings().weight  # still tied, for prompts and the draft
    ids = torch.arange(4, 20)[None]
    with torch.inference_mode():
        logits = model(ids).logits[0, -1:].float()  # one row's head: the 8-bit product on AMX
        dense = (model.model(ids).last_hidden_state[0, -1:] @ head.weight.T).float()
    torch.testing.assert_close(logits, dense, rtol=0.02, atol=0.02)
    if kernel == "amx":  # the head streams its 8.5-bit blocks instead of its bf16 copy
        assert weight_bytes(model) < dense_bytes - head.weight.numel()


def test_a_prompts_products_take_the_blocks_on_amx_and_the_dense_weight_on_pytorchs_kernel(tmp_path, kernel):
    """The AMX kernel converts a block once for any number of rows, so a prompt's products run on the 4-bit
    blocks too (AVX-512 VNNI's as well); PyTorch's kernel would pay again for every 4 rows, so there they
    take the dense weight."""
    model, path = tiny_int4_model(tmp_path)
    use_gguf_int4(model, path, AmxKernel())
    projection = model.model.layers[0].mlp.down_proj
    rows = torch.randn(40, projection.in_features, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.inference_mode():
        out = projection(rows)
        on_blocks = int4_product(rows, *projection.operands)
        dense = torch.nn.functional.linear(rows, projection.weight)
    assert torch.equal(out, on_blocks if kernel == "amx" else dense)
    rows.requires_grad_(True)  # the kernels have no gradient: such products take the dense weight
    projection(rows).float().sum().backward()
    expected = (torch.ones(1, projection.out_features).bfloat16() @ projection.weight).expand_as(rows)
    torch.testing.assert_close(rows.grad, expected.detach())
    projection.weight.requires_grad_(True)  # and so do those whose weight is being trained
    projection(rows.detach()).float().sum().backward()
    assert projection.weight.grad is not None


def passes(model, ids, sizes):
    """Logits and aux hidden states of a prompt pass and then passes of `sizes` tokens, each rolled back."""
    lm = CachedLM(model, model.config.vocab_size, aux_layer_ids=[0, 1])
    prompt = len(ids) - max(sizes)
    out = [lm.forward(torch.tensor(ids[:prompt]), keep=1)]
    for k in sizes:
        out.append(lm.forward(torch.tensor(ids[prompt : prompt + k]), keep=k))
        lm.rollback(prompt)
    return [(logits.float(), aux.float()) for logits, _, aux in out]


def test_lean_layers_on_int4_weights_compute_what_transformers_does(tmp_path, kernel):
    """One-token, verification-sized and longer passes (on PyTorch's kernel the dense path, on AMX the 4-bit
    blocks too) through the lean layers and 4-bit products give transformers' logits and features to bf16's
    precision, and the lean layer the 4-bit projections' own results."""
    model, path = tiny_int4_model(tmp_path)
    assert model.config._attn_implementation == GROUPED_SDPA  # one-query passes take its float32 path
    use_gguf_int4(model, path, AmxKernel())
    assert use_lean_layers(model) == 2
    ids = list(range(4, 40))
    sizes = [1, 2, 4, 5, 8, 12]
    with torch.inference_mode():
        ours = passes(model, ids, sizes)
        for layer in model.model.layers:
            layer.__class__ = LlamaDecoderLayer  # the int4 projections in transformers' layer
        projections_only = passes(model, ids, sizes)
        with stock_layers(model):
            assert not any(isinstance(m, (GgufLinear, LeanLlamaLayer)) for m in model.modules())
            stock = passes(model, ids, sizes)
    # twice as far where the kernel multiplies the rows as 8-bit codes (AVX-512 VNNI, AVX2): a last bit of
    # an input that another layer rounds otherwise may move its code by one
    codes = 2 if kernel == "amx" and amx_gguf.codes_rows() else 1
    for (a, a_aux), (b, b_aux), (c, c_aux) in zip(ours, projections_only, stock, strict=True):
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.02 * codes)
        torch.testing.assert_close(a_aux, b_aux, rtol=0.02, atol=0.04 * codes)
        torch.testing.assert_close(a, c, rtol=0.02, atol=0.02 * codes)
        torch.testing.assert_close(a_aux, c_aux, rtol=0.02, atol=0.04 * codes)  # 2 bf16 steps at ~3


def test_lean_layers_read_the_cache_under_its_name_before_transformers_5_24(tmp_path, monkeypatch):
    """transformers before 5.24 (the GPU image has 5.17) hands a layer its cache as past_key_values: the lean
    layers must decode over it as they do over `cache`, not as if the context were empty."""
    model, path = tiny_int4_model(tmp_path)
    use_gguf_int4(model, path, AmxKernel())
    use_lean_layers(model)
    ids, sizes = list(range(4, 40)), [1, 2, 4, 5]
    forward = LeanLlamaLayer.forward

    def as_before_5_24(self, *args, **kwargs):
        if "cache" in kwargs:  # (a transformers before 5.24 passes past_key_values already)
            kwargs["past_key_values"] = kwargs.pop("cache")
        return forward(self, *args, **kwargs)

    with torch.inference_mode():
        expected = passes(model, ids, sizes)
        monkeypatch.setattr(LeanLlamaLayer, "forward", as_before_5_24)
        renamed = passes(model, ids, sizes)
    for (a, a_aux), (b, b_aux) in zip(expected, renamed, strict=True):
        assert torch.equal(a, b) and torch.equal(a_aux, b_aux)


def test_lean_layers_decode_a_batch_of_rows_with_holes(tmp_path):
    """Rows of a batch (a rolled-back row's holes masked out) decode through the lean layers as they do
    through transformers' layers."""
    model, path = tiny_int4_model(tmp_path)
    use_gguf_int4(model, path, AmxKernel())
    use_lean_layers(model)
    first, second = [[1, 5, 9, 7], [1, 6]], [[8, 4], [9, 10]]
    feeds = [[torch.tensor(f) for f in first], [torch.tensor(f) for f in second]]

    def run():
        lm = CachedLM(model, model.config.vocab_size, rows=2)
        first = lm.forward_rows(feeds[0], [4, 2])
        lm.rollback(3, 0)
        return [out[0].float() for out in first + lm.forward_rows(feeds[1], [2, 2])]

    with torch.inference_mode():
        ours = run()
        with stock_layers(model):
            stock = run()
    for a, b in zip(ours, stock, strict=True):
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.02)


def test_weight_bytes_count_the_4bit_weights_a_pass_streams(tmp_path):
    model, path = tiny_int4_model(tmp_path)
    dense = weight_bytes(model)
    use_gguf_int4(model, path, AmxKernel())
    projections = sum(m.weight.numel() for m in model.modules() if isinstance(m, GgufLinear))
    # 16-bit weights become 4 bits plus a 16-bit scale and zero per 32
    assert weight_bytes(model) == dense - projections * 2 + projections // 2 + projections // 32 * 4


def test_the_pair_and_its_transformers_baseline(tmp_path):
    """A pair keeps its int4 layers; transformers' generate (the bench's baseline) runs the stock ones."""
    from diversed_demo.core.config import DecodeConfig
    from diversed_demo.eval.hf_baseline import hf_generate

    model, path = tiny_int4_model(tmp_path)
    use_gguf_int4(model, path, AmxKernel())
    use_lean_layers(model)
    pair = ModelPair(model, model, tiny_tokenizer(), "tiny-int4", "tiny-int4", torch.device("cpu"))
    seen = []
    hook = model.model.layers[0].register_forward_hook(lambda m, *_: seen.append(type(m)))
    tokens, _ = hf_generate(pair, [1, 5, 9], DecodeConfig(mode="ar", n_draft=2, max_new_tokens=3))
    hook.remove()
    assert len(tokens) == 3 and set(seen) == {LlamaDecoderLayer}
    assert type(model.model.layers[0]) is LeanLlamaLayer
