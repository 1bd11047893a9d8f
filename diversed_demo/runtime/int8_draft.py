"""The draft's projections as 8-bit weight-only products on the CPU (one scale per output row).

Against a 4-bit target a bf16 draft is no longer cheap: it streams its weights for every drafted token,
mostly from memory since the target's pass evicted them. At 8 bits it streams half. Any draft keeps decoding
exact (verification decides), so the rounding only moves the acceptance rate, which the bench reports.
Passes over more rows (the draft's prompt) keep the dense weight.
"""

from __future__ import annotations

import functools

import torch

from ..common.timing import runs_faster
from .class_swap import swap_class

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


def int8_product(rows: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """rows [M, K] · (codes · scales)ᵀ -> [M, N]."""
    return torch._weight_int8pack_mm(rows.contiguous(), codes, scales)


class Int8Linear(torch.nn.Linear):
    """nn.Linear whose products of at most INT8_ROWS rows in the scales' dtype use `int8` (codes, scales)."""

    int8: tuple[torch.Tensor, torch.Tensor]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features)
        if len(rows) > INT8_ROWS or input.dtype != self.int8[1].dtype:
            return torch.nn.functional.linear(input, self.weight, self.bias)
        return int8_product(rows, *self.int8).view(*input.shape[:-1], self.out_features)


def use_int8_draft(draft: torch.nn.Module, when_faster: bool = True) -> int:
    """Switch a draft's bias-free linear layers to Int8Linear where it runs in bf16 or fp16 on the CPU and
    the 8-bit product is the faster here (`int8_pays`, unless told not to measure); returns how many were
    switched."""
    weight = next(draft.parameters())
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float16):
        return 0
    if when_faster and not int8_pays(weight.dtype):
        return 0
    linears = [m for m in draft.modules() if type(m) is torch.nn.Linear and m.bias is None]
    for module in linears:
        swap_class(module, Int8Linear, int8=quantise_rows(module.weight.detach()))
    return len(linears)


@functools.cache
def int8_pays(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the 8-bit product beats the dense one at one row on this machine, timed once per process
    through a weight larger than the CPU's caches (32768×576), as a draft's weights are read after a target
    pass: it depends on the CPU."""
    generator = torch.Generator().manual_seed(0)
    dense = (torch.randn(32768, 576, generator=generator) / 24).to(dtype)
    codes, scales = quantise_rows(dense)
    hidden = torch.randn(1, 576, generator=generator).to(dtype)
    linear = torch.nn.functional.linear
    return runs_faster(lambda: int8_product(hidden, codes, scales), lambda: linear(hidden, dense), 6, 2)
