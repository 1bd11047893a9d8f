"""Does a pass over several tokens give each position what a one-token pass gives it? (docs/measurements/
speed.md, "Exact means exact"). First each operation of the target's static pass, run eagerly: its rows in a
pass of k tokens against the same rows alone; then the whole pass, compiled and eager, over a decode's tokens
fed in chunks of k against one at a time.

    python docs/measurements/probes/row_invariance.py            # the embedded pair, as load_pair runs it
"""

import collections

import torch

from diversed_demo.core.cache import CachedLM
from diversed_demo.runtime import static_pass
from diversed_demo.runtime.block_attention import padded_width
from diversed_demo.runtime.plan import load_pair

pair = load_pair(compiled="wait")
print(pair.runtime)
counts = collections.defaultdict(lambda: [0, 0])  # operation -> [calls, calls whose rows differ]


def spied(name, op, split):
    """`op` that also runs each row of its first argument alone (`split` gives the i-th call's arguments)
    and counts the calls where any row differs."""

    def run(*args):
        out = op(*args)
        if len(args[0]) > 1:
            alone = torch.cat([op(*split(args, i)) for i in range(len(args[0]))])
            counts[name][0] += 1
            counts[name][1] += not torch.equal(out, alone)
        return out

    return run


def attention_row(args, i):
    query, keys, values, bias = args
    group = len(bias) // len(query)
    width = padded_width(int((bias[(i + 1) * group - 1] == 0).nonzero().max()) + 1)
    return query[i : i + 1], keys, values, bias[i * group : (i + 1) * group, :width]


static_pass.int4_product = spied(
    "4-bit products", static_pass.int4_product, lambda a, i: (a[0][i : i + 1], *a[1:])
)
static_pass.rms_norm = spied("rms norm", static_pass.rms_norm, lambda a, i: (a[0][i : i + 1], *a[1:]))
static_pass.attend_in_blocks = spied("attention in blocks", static_pass.attend_in_blocks, attention_row)
static_pass.fused_attention.attend = spied(
    "fused attention",
    static_pass.fused_attention.attend,
    lambda a, i: (a[0][i : i + 1], *a[1:3], a[3][i : i + 1]),
)
lm = CachedLM(pair.target, pair.vocab_size, runner=pair.target_pass)
with torch.inference_mode():
    lm.forward(torch.arange(100, 400), 1)
    lm.compiled.runner = lm.compiled.module  # eager, so that the spies see each operation
    for k in (2, 3, 5, 8):
        for start in range(5):
            lm.forward(torch.arange(500 + start, 500 + start + k), k)
            lm.rollback(lm.length - k)
lm.close()
for name, (calls, differ) in counts.items():
    print(f"{name}: rows differ in {differ} of {calls} calls")

tokens = torch.randint(100, 20000, (64,), generator=torch.Generator().manual_seed(0))
for label in ("compiled", "eager"):
    by_chunk = {}
    for chunk in (1, 2, 3, 5, 8):
        lm = CachedLM(pair.target, pair.vocab_size, runner=pair.target_pass)
        with torch.inference_mode():
            lm.forward(torch.arange(100, 160), 1)
            if label == "eager" and lm.compiled is not None:
                lm.compiled.runner = lm.compiled.module
            out = [
                lm.forward(tokens[s : s + chunk], len(tokens[s : s + chunk]))[0] for s in range(0, 64, chunk)
            ]
        lm.close()
        by_chunk[chunk] = torch.cat(out).float()
    for chunk in (2, 3, 5, 8):
        differ = (by_chunk[chunk] != by_chunk[1]).any(-1).sum().item()
        print(f"{label} pass, chunks of {chunk}: {differ} of 64 positions differ from one-token passes")
