"""Dense products over a prompt's rows in row buckets (runtime/row_buckets.py) give F.linear's results, and a
process meets few row counts."""

from __future__ import annotations

import pytest
import torch

from diversed_demo.runtime.row_buckets import bucket, linear_in_buckets


@pytest.mark.parametrize("rows", [1, 16, 17, 100, 257, 700])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_product_in_buckets_is_the_linear_product(rows, dtype, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype) if with_bias else None
    hidden = torch.randn(1, rows, 64, generator=generator).to(dtype)
    with torch.inference_mode():
        out = linear_in_buckets(hidden, weight, bias)
        expected = torch.nn.functional.linear(hidden, weight, bias)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)


def test_a_product_that_trains_is_the_plain_one(monkeypatch):
    """Padding serves inference only: a product asked for its gradient runs unpadded (its rows as given),
    while the same product under inference is padded to its bucket."""
    from diversed_demo.runtime import row_buckets

    padded = []
    pad = row_buckets.F.pad
    monkeypatch.setattr(
        row_buckets.F, "pad", lambda rows, *args: padded.append(len(rows)) or pad(rows, *args)
    )
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(8, 6, generator=generator).bfloat16().requires_grad_()
    hidden = torch.randn(40, 6, generator=generator).bfloat16()
    linear_in_buckets(hidden, weight).float().square().sum().backward()
    assert padded == [] and weight.grad is not None
    with torch.inference_mode():
        linear_in_buckets(hidden, weight)
    assert padded == [40]


def test_buckets_hold_every_row_count_with_little_padding_and_are_few():
    counts = range(1, 2049)
    buckets = [bucket(n) for n in counts]
    assert all(b >= n for b, n in zip(buckets, counts))
    assert all(b == n for b, n in zip(buckets[:16], counts))  # decoding's products as they are
    # under 16 rows, or under a sixteenth of the power of two above
    assert all(b - n < 16 or (b - n) * 16 < 1 << (n - 1).bit_length() for b, n in zip(buckets, counts))
    assert len(set(buckets[16:])) <= 39
