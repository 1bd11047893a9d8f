"""The one linear product of a pair's models on CPU, and switching models to it.

MKL on these CPUs multiplies a weight by a few rows far faster as W·Xᵀ than as X·Wᵀ (see
`linear_product`); decoding is mostly such products.
"""
from __future__ import annotations

import contextlib

import torch

FEW_ROWS = 64  # decoding-sized products; prompts and training batches keep the usual product


def linear_product(weight: torch.Tensor, hidden: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [..., in] · weightᵀ (+ bias) -> [..., out]: the product of every linear layer of a pair.

    In fp32 on CPU, MKL multiplies a weight by a few rows 2–3× faster as W·Xᵀ than as X·Wᵀ, and fastest
    with 2 or 4 columns: one row (its matrix–vector path) or three cost more than the padded product.
    Measured on these machines over all of the target's weights: one token 61 → 30 ms, 2 rows 103 → 30,
    3 rows 126 → 33 (padded to 4), 5 rows 79 → 54. In bf16 and on GPUs the usual product is as fast.
    """
    rows = hidden.reshape(-1, hidden.shape[-1])
    n_rows = len(rows)
    if rows.device.type != "cpu" or weight.dtype != torch.float32 or n_rows > FEW_ROWS:
        return torch.nn.functional.linear(hidden, weight, bias)
    width = {1: 2, 3: 4}.get(n_rows, n_rows)
    # Padded with copies of the rows; MKL's fast path wants the columns transposed in memory (row-major rows).
    columns = torch.cat([rows, rows[: width - n_rows]]) if width > n_rows else rows.contiguous()
    out = torch.mm(weight, columns.T)[:, :n_rows].T.contiguous()
    if bias is not None:
        out = out + bias
    return out.view(*hidden.shape[:-1], weight.shape[0])


class FastLinear(torch.nn.Linear):
    """nn.Linear computed by `linear_product`; same parameters and state dict."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear_product(self.weight, input, self.bias)


def use_fast_linear(model: torch.nn.Module) -> None:
    """Switch the model's plain nn.Linear layers to FastLinear in place (weights, ties and hooks kept)."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = FastLinear


@contextlib.contextmanager
def stock_linear(*models: torch.nn.Module):
    """Run the models with plain nn.Linear layers, as transformers runs them (for comparisons)."""
    switched = [m for model in models for m in model.modules() if type(m) is FastLinear]
    for module in switched:
        module.__class__ = torch.nn.Linear
    try:
        yield
    finally:
        for module in switched:
            module.__class__ = FastLinear
