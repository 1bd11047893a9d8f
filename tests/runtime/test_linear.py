"""The fast linear product (runtime/linear.py) computes what torch's own does, and is used only where it
pays."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_pair

from diversed_demo.runtime import linear
from diversed_demo.runtime.linear import FastLinear, linear_product
from diversed_demo.runtime.stock import stock_layers


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 65, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_project_is_the_linear_product(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 24, generator=generator)
    bias = torch.randn(48, generator=generator) if with_bias else None
    hidden = torch.randn(1, rows, 24, generator=generator)
    expected = torch.nn.functional.linear(hidden, weight, bias)
    out = linear_product(weight, hidden, bias)
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out, expected)


def test_project_trains_like_linear():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(8, 6, generator=generator, requires_grad=True)
    hidden = torch.randn(3, 6, generator=generator)
    linear_product(weight, hidden).square().sum().backward()
    fast_grad, weight.grad = weight.grad, None
    torch.nn.functional.linear(hidden, weight).square().sum().backward()
    torch.testing.assert_close(fast_grad, weight.grad)


def test_pair_uses_the_stock_product_where_the_fast_one_does_not_pay(monkeypatch):
    monkeypatch.setattr(linear, "fast_product_pays", lambda: False)
    pair = tiny_pair()
    assert not any(type(m) is FastLinear for m in pair.target.modules())


def test_pair_uses_fast_linear_with_unchanged_weights_and_logits(monkeypatch):
    monkeypatch.setattr(linear, "fast_product_pays", lambda: True)
    pair = tiny_pair()
    linears = [m for m in pair.target.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is FastLinear for m in linears)
    keys = pair.target.state_dict().keys()
    ids = torch.tensor([[1, 5, 9, 7, 12]])
    with torch.inference_mode():
        for n in (1, 3, 5):  # decoding-sized blocks through the fast path
            fast = pair.target(ids[:, :n]).logits
            with stock_layers(pair.target):
                assert all(type(m) is torch.nn.Linear for m in linears)
                assert pair.target.state_dict().keys() == keys
                stock = pair.target(ids[:, :n]).logits
            torch.testing.assert_close(fast, stock)
    assert all(type(m) is FastLinear for m in linears)
