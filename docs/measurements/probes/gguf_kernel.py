"""The GGUF kernel (runtime/amx_gguf.py: AMX, AVX-512 BF16 or AVX2, by this CPU) against PyTorch's int4
kernel on the same 4-bit blocks and the dense bf16 product, at the row counts a decode meets: one token,
verifications, a prompt. Prints ms (medians of 20, every thread); run alone on the CPU.
`python docs/measurements/probes/gguf_kernel.py`"""

from __future__ import annotations

import statistics
import time

import torch

from diversed_demo.runtime import amx_gguf
from diversed_demo.runtime.gguf_int4 import dequantised, int4_product, pack

ROWS = (1, 3, 5, 8, 9, 16, 64, 256)


def ms(fn, calls: int = 20) -> float:
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    assert amx_gguf.AmxKernel().available(wait=True), "the kernel does not serve here"
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8192, 1536), dtype=torch.uint8, generator=generator).int()
    scales = (torch.rand(8192, 1536 // 32, generator=generator) / 100).half().float()
    records = amx_gguf.pack_q4(codes, scales, -8 * scales)
    packed = pack(codes, scales, -8 * scales, torch.bfloat16)
    dense = dequantised(codes, scales, -8 * scales).bfloat16()
    head_codes = torch.randint(-128, 128, (49152, 576), generator=generator)
    head_d = (torch.rand(49152, 576 // 32, generator=generator) / 100).half().float()
    head = amx_gguf.pack_q8(head_codes, head_d)
    head_dense = dequantised(head_codes, head_d, 0 * head_d).bfloat16()
    print(f"kernel: {amx_gguf.name()}, {torch.get_num_threads()} threads")
    print("rows | 4-bit kernel | PyTorch int4 | dense bf16 | Q8_0 head kernel | head dense bf16")
    for rows in ROWS:
        x = torch.randn(rows, 1536, generator=generator).bfloat16()
        h = torch.randn(rows, 576, generator=generator).bfloat16()
        products = [
            lambda x=x: amx_gguf.amx_product(x, records),
            lambda x=x: int4_product(x, *packed),
            lambda x=x: torch.nn.functional.linear(x, dense),
            lambda h=h: amx_gguf.amx_product(h, head),
            lambda h=h: torch.nn.functional.linear(h, head_dense),
        ]
        figures = [ms(product) for product in products]
        print(f"{rows} | " + " | ".join(f"{f:.2f}" for f in figures))


if __name__ == "__main__":
    main()
