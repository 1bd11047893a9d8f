"""A few-row linear product for fp32 on CPU, and switching a pair's models to it where it pays.

On some CPUs (and PyTorch/MKL builds) a weight times a few rows is far faster as W·Xᵀ than as X·Wᵀ (see
`linear_product`); decoding is mostly such products. On others the stock product is the faster one, so
the switch is decided by a measurement on the machine itself (`fast_product_pays`), not assumed.
"""

from __future__ import annotations

import functools
import time

import torch

from .class_swap import swap_class

FEW_ROWS = 64  # decoding-sized products; prompts and training batches keep the usual product


def linear_product(
    weight: torch.Tensor, hidden: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """hidden [..., in] · weightᵀ (+ bias) -> [..., out]: the product of every linear layer of a pair.

    In fp32 on some CPUs MKL multiplies a weight by a few rows faster as W·Xᵀ than as X·Wᵀ, and fastest
    with 2 or 4 columns: one row (its matrix–vector path) or three cost more than the padded product.
    Figures: docs/measurements/core.md.
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


@functools.cache
def fast_product_pays() -> bool:
    """Whether `linear_product` beats the stock product on this machine for decoding-sized blocks (1 and 4
    rows through a 1536×576 weight, a SmolLM2 MLP's shape), timed once per process (about 50 ms): which
    product wins differs between CPUs."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1536, 576, generator=generator)

    def best_of(product, rows, repeats=40):
        hidden = torch.randn(rows, 576, generator=generator)
        product(weight, hidden)  # warm-up
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeats):
                product(weight, hidden)
            times.append(time.perf_counter() - start)
        return min(times)

    stock = lambda w, h: torch.nn.functional.linear(h, w)  # noqa: E731
    return all(best_of(linear_product, rows) < best_of(stock, rows) for rows in (1, 4))


def use_fast_linear(model: torch.nn.Module) -> int:
    """Switch the model's plain nn.Linear layers to FastLinear in place (weights, ties and hooks kept),
    if the model is fp32 on the CPU and the fast product pays on this machine; returns how many."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return 0
    if not fast_product_pays():
        return 0
    linears = [module for module in model.modules() if type(module) is torch.nn.Linear]
    for module in linears:
        swap_class(module, FastLinear)
    return len(linears)
