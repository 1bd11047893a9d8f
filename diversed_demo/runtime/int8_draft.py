"""The draft's projections as 8-bit weight-only products on the CPU: on the project's GGUF kernel where it
serves (amx_gguf.py: Q8_0 blocks, one fp16 scale per 32 weights, products of any number of rows), else on
PyTorch's int8 kernel (one scale per output row; passes over more than INT8_ROWS rows, the draft's prompt,
keep the dense weight).

Against a 4-bit target a bf16 draft is no longer cheap: it streams its weights for every drafted token,
mostly from memory since the target's pass evicted them. At 8 bits it streams half; on a CPU without bf16
instructions (AVX2) the dense bf16 product is slower still (docs/measurements/speed.md). Any draft keeps
decoding exact (verification decides), so the rounding only moves the acceptance rate, which the bench
reports.
"""

from __future__ import annotations

import functools

import torch

from ..common.timing import runs_faster
from . import amx_gguf
from .class_swap import swap_class
from .row_buckets import linear_in_buckets

# At most this many rows use the 8-bit product (a drafting step's one, a restart's few): beyond, the dense
# product is as fast or faster (docs/measurements/speed.md).
INT8_ROWS = 4


def quantise_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 codes [N, K], per-row scales [N] in the weight's dtype), symmetric."""
    largest = weight.float().abs().amax(1).clamp_min(1e-12)
    scales = (largest / 127).to(weight.dtype)
    # Rounded to the weight's dtype, a scale must not shrink, or the largest weight would not fit in ±127.
    shrunk = scales.float() * 127 < largest
    scales = torch.where(shrunk, torch.nextafter(scales, scales.new_tensor(1.0)), scales)
    codes = (weight.float() / scales.float()[:, None]).round().clamp(-127, 127).to(torch.int8)
    return codes, scales


def quantise_blocks(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> the GGUF kernel's Q8_0 records: per block of 32 weights an fp16 scale d and codes
    round(w / d) in ±127, symmetric."""
    blocks = weight.float().unflatten(1, (-1, 32))
    d = (blocks.abs().amax(-1) / 127).clamp_min(2**-24).half().float()  # the smallest fp16 above 0
    codes = (blocks / d[..., None]).round().clamp(-127, 127).flatten(1)
    return amx_gguf.pack_q8(codes, d)


def int8_product(rows: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
    """rows [M, K] · (the 8-bit weight [N, K])ᵀ -> [M, N], on the kernel its operands are for: the GGUF
    kernel's records, or PyTorch's codes and per-row scales."""
    if len(operands) == 1:
        return amx_gguf.amx_product(rows, *operands)
    codes, scales = operands
    return torch._weight_int8pack_mm(rows.contiguous(), codes, scales)


class Int8Linear(torch.nn.Linear):
    """nn.Linear whose products in the draft's dtype use `int8`: the GGUF kernel's records (any number of
    rows), or PyTorch's (codes, scales) for at most INT8_ROWS rows."""

    int8: tuple[torch.Tensor, ...]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features)
        on_rows = len(self.int8) == 2
        if (on_rows and len(rows) > INT8_ROWS) or input.dtype != self.weight.dtype:
            return linear_in_buckets(input, self.weight, self.bias)
        return int8_product(rows, *self.int8).view(*input.shape[:-1], self.out_features)


def use_int8_draft(draft: torch.nn.Module, when_faster: bool = True, kernel: bool = False) -> int:
    """Switch a draft's bias-free linear layers to Int8Linear where it runs in bf16 or fp16 on the CPU and
    the 8-bit product is the faster here (`int8_pays`, unless told not to measure); on the GGUF kernel with
    `kernel` (loaded: `AmxKernel.available`) where the draft is bf16 and every layer fits its records.
    Returns how many were switched."""
    weight = next(draft.parameters())
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float16):
        return 0
    linears = [m for m in draft.modules() if type(m) is torch.nn.Linear and m.bias is None]
    blocks = kernel and fit_blocks(linears, weight) and (not when_faster or blocks_pay())
    if not blocks and when_faster and not int8_pays(weight.dtype):
        return 0
    for module in linears:
        dense = module.weight.detach()
        swap_class(module, Int8Linear, int8=(quantise_blocks(dense),) if blocks else quantise_rows(dense))
    return len(linears)


def fit_blocks(linears: list, weight: torch.Tensor) -> bool:
    """Whether these layers of a draft whose weights are like `weight` can take the kernel's Q8_0 records:
    bf16, and every row and input count a multiple of a record's 32."""
    fits = all(m.out_features % 32 == 0 and m.in_features % 32 == 0 for m in linears)
    return fits and weight.dtype == torch.bfloat16


def blocks_aside(draft: torch.nn.Module) -> dict:
    """{layer: its weights as the GGUF kernel's records} for a CPU draft not on them yet (PyTorch's per-row
    8-bit products, or dense where those did not pay) where the kernel, loaded since the draft was made
    fast, is timed the faster (`blocks_pay`): built without touching the draft, for `use_blocks` between
    decodes (`plan.upgrade_target`). Empty otherwise."""
    weight = next(draft.parameters())
    if products(draft) == "blocks" or weight.device.type != "cpu":
        return {}
    kinds = (Int8Linear,) if products(draft) == "rows" else (torch.nn.Linear,)
    linears = [m for m in draft.modules() if type(m) in kinds and m.bias is None]
    if not linears or not fit_blocks(linears, weight) or not blocks_pay():
        return {}
    return {m: (quantise_blocks(m.weight.detach()),) for m in linears}


def use_blocks(aside: dict) -> None:
    """Put `blocks_aside`'s records in their layers (a dense layer becomes an Int8Linear)."""
    for layer, records in aside.items():
        if type(layer) is Int8Linear:
            layer.int8 = records
        else:
            swap_class(layer, Int8Linear, int8=records)


def products(draft: torch.nn.Module) -> str:
    """What a draft's products run on, as `use_int8_draft` left them: "blocks" (the GGUF kernel), "rows"
    (PyTorch's int8 kernel) or "dense"."""
    operands = getattr(draft.lm_head, "int8", None)
    return "dense" if operands is None else "blocks" if len(operands) == 1 else "rows"


@functools.cache
def int8_pays(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the 8-bit product beats the dense one at one row on this machine, timed once per process
    through a weight larger than the CPU's caches (32768×576), as a draft's weights are read after a target
    pass: it depends on the CPU."""
    return beats_dense(dtype, quantise_rows)


@functools.cache
def blocks_pay() -> bool:
    """`int8_pays` for the GGUF kernel's 8-bit blocks (loaded), against the dense bf16 product."""
    return beats_dense(torch.bfloat16, lambda dense: (quantise_blocks(dense),))


def beats_dense(dtype: torch.dtype, quantise) -> bool:
    """Whether one row's product on `quantise(weight)`'s operands beats the dense weight's (a fraction of a
    second)."""
    generator = torch.Generator().manual_seed(0)
    dense = (torch.randn(32768, 576, generator=generator) / 24).to(dtype)
    operands = quantise(dense)
    hidden = torch.randn(1, 576, generator=generator).to(dtype)
    linear = torch.nn.functional.linear
    return runs_faster(lambda: int8_product(hidden, *operands), lambda: linear(hidden, dense), 6, 2)
