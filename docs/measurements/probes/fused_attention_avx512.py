"""Probe (docs/measurements/speed.md, "Attention"): runtime/fused_attention.cpp against `attend_in_blocks`
(eager and compiled), one layer's attention of the embedded target's shape (9 query heads, 3 kv heads,
D = 64) over W cached slots at 1–9 query rows; whether a row's bits depend on the rows beside it or on
masked slots between its own (a tree's node against the chain over its path); error against float64.

    python docs/measurements/probes/fused_attention_avx512.py [W]
"""

import sys
import time

import torch
from torch.utils.cpp_extension import load_inline

from diversed_demo.runtime.block_attention import attend_in_blocks, feed_rows, mask_bias, padded_mask

torch.set_num_threads(2)
SOURCE = "diversed_demo/runtime/fused_attention.cpp"
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"]
wrapper = (
    open(SOURCE).read()
    + "\n#include <torch/extension.h>\n"
    + 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("attend", &fused_attention); }\n'
)
mod = load_inline("fused_attention_probe", cpp_sources=wrapper, extra_cflags=FLAGS, verbose=False)
W = int(sys.argv[1]) if len(sys.argv) > 1 else 320
generator = torch.Generator().manual_seed(0)
keys = torch.randn(3, 2048, 64, generator=generator).bfloat16()
values = torch.randn(3, 2048, 64, generator=generator).bfloat16()


def timed(f, *a, calls=300):
    for _ in range(20):
        f(*a)
    start = time.perf_counter()
    for _ in range(calls):
        f(*a)
    return (time.perf_counter() - start) / calls * 1e6


def reference(q, mask):
    """float64 attention over what each row sees."""
    k, width = q.shape[0], mask.shape[1]
    s = q.double().view(k, 3, 3, 64).transpose(0, 1) @ keys[:, :width].double().transpose(-1, -2)[:, None]
    s = (s / 8).masked_fill(~mask[None, :, None], float("-inf"))
    out = torch.softmax(s, -1) @ values[:, :width].double()[:, None]
    return out.transpose(0, 1).reshape(k, 576)


compiled_blocks = torch.compile(attend_in_blocks, dynamic=False)
print(f"W = {W} slots; µs a layer (median-free mean of 300 calls)")
for k in (1, 2, 4, 6, 8, 9):
    q = torch.randn(k, 9, 64, generator=generator).bfloat16()
    _, mask = feed_rows(W - k, W)
    bias = mask_bias(mask, 3)
    eager = timed(attend_in_blocks, q, keys, values, bias)
    comp = timed(compiled_blocks, q, keys, values, bias)
    fused = timed(mod.attend, q, keys, values, mask)
    print(f"{k} rows: blocks eager {eager:.1f}, blocks compiled {comp:.1f}, fused {fused:.1f}")

# Rows: a chain of 8 against each row alone (a one-token pass over its own sequence).
q = torch.randn(8, 9, 64, generator=generator).bfloat16()
_, mask = feed_rows(W - 8, W)
chain = mod.attend(q, keys, values, mask)
alone = [mod.attend(q[j : j + 1], keys, values, feed_rows(W - 8 + j, W - 7 + j)[1]) for j in range(8)]
same = all(torch.equal(a, chain[j : j + 1]) for j, a in enumerate(alone))
print("a chain's rows = one-token passes:", same)
# Trees: a node whose ancestors sit at slots W, W+2 (siblings at W+1, W+3) against the chain W, W+1, W+2.
tree_keys, tree_values = keys.clone(), values.clone()
path = [W, W + 2, W + 4]
for depth, slot in enumerate(path):
    tree_keys[:, W + depth], tree_values[:, W + depth] = keys[:, slot], values[:, slot]
sees = torch.zeros(1, W + 5, dtype=torch.bool)
sees[0, :W] = True
sees[0, path] = True
node = mod.attend(q[:1], keys, values, padded_mask(sees))
in_chain = mod.attend(q[:1], tree_keys, tree_values, feed_rows(W + 2, W + 3)[1])
print("a tree node = the chain over its path:", torch.equal(node, in_chain))
expected = reference(q, mask)
blocks = attend_in_blocks(q, keys, values, mask_bias(padded_mask(mask), 3))
fused_error, blocks_error = ((out.double() - expected).abs().max().item() for out in (chain, blocks))
print(f"max error against float64: fused {fused_error:.5f}, blocks {blocks_error:.5f}")
