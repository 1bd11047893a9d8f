"""The project's own weight-only products against a maintained library's (torchao) on this CPU, one thread,
in bf16, at decoding's row counts: the draft's 8-bit products (runtime/int8_draft.py) against torchao's
Int8WeightOnlyConfig, and the target's 4-bit GGUF products (runtime/gguf_int4.py) against torchao's
Int4WeightOnlyConfig, on weights of the embedded pair's shapes larger than the caches (as decoding streams
them). torchao is not a dependency: `pip install --no-deps --target DIR torchao` and run with PYTHONPATH=DIR.

    PYTHONPATH=/tmp/tao .venv/bin/python docs/measurements/probes/library_kernels.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

from diversed_demo.runtime.gguf_int4 import Q4_BLOCK, int4_product, pack
from diversed_demo.runtime.int8_draft import int8_product, quantise_rows

ROUNDS, CALLS = 7, 20
SHAPES = {
    "draft (32768×576, a stack of its projections)": (32768, 576),
    "target MLP (1536×576) ×30": (46080, 576),
}


def best_ms(call) -> float:
    call()
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def turns(candidates: dict) -> dict[str, float]:
    """Each candidate's median time over ROUNDS rounds, the candidates taking turns within each round."""
    seen = {name: [] for name in candidates}
    for _ in range(ROUNDS):
        for name, call in candidates.items():
            seen[name].append(best_ms(call))
    return {name: statistics.median(ms) for name, ms in seen.items()}


def int8_candidates(out_features: int, in_features: int, rows: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=generator) / 24).bfloat16()
    hidden = torch.randn(rows, in_features, generator=generator).bfloat16()
    codes, scales = quantise_rows(weight)
    library = torch.nn.Linear(in_features, out_features, bias=False).bfloat16()
    library.weight.data.copy_(weight)
    quantize_(library, Int8WeightOnlyConfig())
    return {
        "dense bf16": lambda: torch.nn.functional.linear(hidden, weight),
        "ours (int8_product)": lambda: int8_product(hidden, codes, scales),
        "torchao Int8WeightOnly": lambda: library(hidden),
    }


def int4_candidates(out_features: int, in_features: int, rows: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=generator).int()
    scales = torch.rand(out_features, in_features // Q4_BLOCK, generator=generator) / 100
    ours = pack(codes, scales, -8 * scales, torch.bfloat16)
    dense = ((codes - 8).float() * scales.repeat_interleave(Q4_BLOCK, 1)).bfloat16()
    hidden = torch.randn(rows, in_features, generator=generator).bfloat16()
    library = torch.nn.Linear(in_features, out_features, bias=False).bfloat16()
    library.weight.data.copy_(dense)
    quantize_(library, Int4WeightOnlyConfig(group_size=Q4_BLOCK, int4_packing_format="plain"))
    return {
        "dense bf16": lambda: torch.nn.functional.linear(hidden, dense),
        "ours (int4_product)": lambda: int4_product(hidden, *ours),
        "torchao Int4WeightOnly": lambda: library(hidden),
    }


def main() -> None:
    torch.set_num_threads(1)
    with torch.inference_mode():
        for rows in (1, 3):
            out, inp = SHAPES["draft (32768×576, a stack of its projections)"]
            print(f"8-bit, {rows} row(s), {out}×{inp}: {turns(int8_candidates(out, inp, rows))}")
            out, inp = SHAPES["target MLP (1536×576) ×30"]
            try:
                print(f"4-bit, {rows} row(s), {out}×{inp}: {turns(int4_candidates(out, inp, rows))}")
            except Exception as err:  # a layout this CPU or torchao version does not serve
                print(f"4-bit, {rows} row(s): torchao's int4 did not run here ({type(err).__name__}: {err})")


if __name__ == "__main__":
    main()
