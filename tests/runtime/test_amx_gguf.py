"""The project's GGUF kernel (runtime/amx_gguf.py, on AMX, AVX-512 VNNI or AVX2): the product of the weights
and rows it multiplies (the dense bf16 model's weights on AMX, the GGUF's own elsewhere; the rows' blocks as
8-bit codes on AVX-512 VNNI), a row's result independent of the rows beside it, and PyTorch's kernel wherever
it cannot serve."""

from __future__ import annotations

import subprocess

import pytest
import torch

from diversed_demo.runtime import amx_gguf, gguf_int4
from diversed_demo.runtime.gguf_int4 import dequantised, int4_kernel

needs_amx = pytest.mark.skipif(
    not amx_gguf.AmxKernel().available(wait=True),
    reason="this CPU has neither AMX nor AVX2 (or the kernel did not build)",
)


def q4_blocks(n_rows=96, n_cols=192, seed=0):
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n_rows, n_cols), dtype=torch.int32, generator=generator)
    d = (torch.rand(n_rows, n_cols // 32, generator=generator) / 50).half().float()  # a GGUF's fp16 d and m
    m = (-torch.rand(n_rows, n_cols // 32, generator=generator) / 5).half().float()
    return codes, d, m


@needs_amx
@pytest.mark.parametrize("rows", [1, 3, 8, 16, 17, 48, 83])  # beyond 16: chunks of 16, an odd last one
def test_the_4bit_product_is_the_product_of_the_ggufs_weights(rows):
    codes, d, m = q4_blocks()
    weights = amx_gguf.as_multiplied(dequantised(codes, d, m))  # on AMX what the dense bf16 model holds
    hidden = torch.randn(rows, codes.shape[1], generator=torch.Generator().manual_seed(rows)).bfloat16()
    expected = amx_gguf.rows_as_multiplied(hidden).double() @ weights.double().T
    out = amx_gguf.amx_product(hidden, amx_gguf.pack_q4(codes, d, m))
    assert out.dtype == torch.bfloat16 and out.shape == (rows, codes.shape[0])
    # float32 accumulation, then one rounding to bf16 (half a unit in the last place: 2⁻⁹ relative)
    torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-4)


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_the_8bit_product_is_the_product_of_the_ggufs_weights(rows):
    """A Q8_0 LM head: 32 signed codes and one fp16 scale a block."""
    generator = torch.Generator().manual_seed(rows)
    codes = torch.randint(-128, 128, (96, 192), generator=generator)
    d = (torch.rand(96, 6, generator=generator) / 100).half().float()
    weights = amx_gguf.as_multiplied(dequantised(codes, d, 0 * d))
    hidden = torch.randn(rows, 192, generator=generator).bfloat16()
    out = amx_gguf.amx_product(hidden, amx_gguf.pack_q8(codes, d))
    expected = amx_gguf.rows_as_multiplied(hidden).double() @ weights.double().T
    torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-4)


@needs_amx
@pytest.mark.parametrize("bits", [4, 8])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(bits):
    """Greedy speculative decoding repeats target-only exactly only if a verification pass computes each
    token as a one-token pass does (and a prompt's pass, beyond 16 rows, as those do)."""
    codes, d, m = q4_blocks(seed=1)
    records = amx_gguf.pack_q4(codes, d, m) if bits == 4 else amx_gguf.pack_q8(codes * 16 - 128, d)
    hidden = torch.randn(50, codes.shape[1], generator=torch.Generator().manual_seed(2)).bfloat16()
    alone = torch.cat([amx_gguf.amx_product(row[None], records) for row in hidden])
    for rows in (2, 5, 8, 16, 17, 33, 50):
        assert torch.equal(amx_gguf.amx_product(hidden[:rows], records), alone[:rows])


@needs_amx
def test_a_sum_halfway_between_two_bf16_values_rounds_to_the_even_one():
    """The float32 sum becomes bf16 as PyTorch rounds (to nearest, ties to even), not by truncation: a
    product of 259/256, halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶, gives 1 + 2⁻⁶; its negative the negative."""
    codes = torch.zeros(32, 64, dtype=torch.int64)
    codes[:, 0], codes[:, 1] = 1, 66  # 127·1 + 2·66 = 259
    d = torch.full((32, 2), 2.0**-8)
    hidden = torch.zeros(2, 64)
    hidden[0, :2] = torch.tensor([127.0, 2.0])  # the block's largest magnitude 127: codes 127 and 2, scale 1
    hidden[1] = -hidden[0]
    out = amx_gguf.amx_product(hidden.bfloat16(), amx_gguf.pack_q8(codes, d))
    assert torch.equal(out[0], torch.full((32,), 1 + 2.0**-6, dtype=torch.bfloat16))
    assert torch.equal(out[1], -out[0])


@pytest.fixture
def fresh_choice(monkeypatch, tmp_path):
    """A new pair's kernel, deciding on a machine whose process has not loaded the library."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    monkeypatch.setattr(amx_gguf, "loaded", lambda: False)
    return amx_gguf.AmxKernel()


def test_packing_refuses_scales_that_are_not_a_ggufs_fp16():
    codes, d, m = q4_blocks()
    with pytest.raises(ValueError, match="fp16"):
        amx_gguf.pack_q4(codes, d / 3, m)


def test_switched_off_the_pytorch_kernel_serves(fresh_choice, monkeypatch):
    monkeypatch.setenv(amx_gguf.SWITCH, "0")
    assert not fresh_choice.available()
    assert int4_kernel(torch.bfloat16, fresh_choice) == "aten"


def test_a_cpu_without_amx_or_avx2_gets_the_pytorch_kernel(fresh_choice, monkeypatch):
    monkeypatch.setattr(amx_gguf, "cpu_flags", lambda: {"avx512f", "avx512bw"})
    assert not fresh_choice.available()
    assert int4_kernel(torch.bfloat16, fresh_choice) == "aten"


def test_a_failed_build_says_why_and_the_pytorch_kernel_serves(fresh_choice, monkeypatch, capsys):
    def no_compiler(path):
        raise subprocess.CalledProcessError(1, ["g++"], stderr="g++: fatal error: no input files")

    monkeypatch.setattr(amx_gguf, "cpu_flags", lambda: amx_gguf.CPU_FLAGS)
    monkeypatch.setattr(amx_gguf, "build", no_compiler)
    assert not fresh_choice.available(wait=True)
    assert "no input files" in capsys.readouterr().err


def test_a_first_start_goes_on_without_it_and_builds_it_in_the_background(fresh_choice, monkeypatch):
    builds = []
    monkeypatch.setattr(amx_gguf, "cpu_flags", lambda: amx_gguf.CPU_FLAGS)
    monkeypatch.setattr(amx_gguf, "build", lambda path, background=False: builds.append(background))
    kernel = fresh_choice
    assert not kernel.available() and kernel.pending and not builds  # nothing built at the start
    assert not kernel.upgrade()  # this fake build made no library: it says so and stays without
    assert builds[0] is True and not kernel.pending
    assert not amx_gguf.AmxKernel().pending  # another pair's kernel decides for itself


def test_float32_models_never_take_it(monkeypatch):
    kernel = amx_gguf.AmxKernel()
    monkeypatch.setattr(kernel, "available", lambda: True)
    monkeypatch.setattr(gguf_int4, "amx_pays", lambda: True)
    assert int4_kernel(torch.float32, kernel) == "aten" and int4_kernel(torch.bfloat16, kernel) == "amx"
