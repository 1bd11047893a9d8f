"""Draft trees against the chain on the embedded pair (docs/measurements/speed.md, "Draft trees"): Spec-Bench
first turns, 64 tokens, the modes and tree settings alternating per prompt; prints τ, tokens/s and the
speed-up over target-only for each.

    python docs/measurements/probes/tree_vs_chain.py [PER_CATEGORY] [TEMPERATURE] [TREES]
    e.g. python docs/measurements/probes/tree_vs_chain.py 1 0 off,auto,3,3,4,7
"""

import sys
import time
from collections import defaultdict
from types import SimpleNamespace

from diversed_demo.cli import pair_from_args
from diversed_demo.core.generate import generate
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import load_spec_bench

per_category = int(sys.argv[1]) if len(sys.argv) > 1 else 1
temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
trees = sys.argv[3].split(";") if len(sys.argv) > 3 else ["off", "auto"]
pair = pair_from_args(SimpleNamespace(target=None, draft=None, device="cpu", dtype="auto"), compiled="wait")
prompts = [encode_prompt(pair.tokenizer, e.prompt) for e in load_spec_bench(per_category=per_category)]
runs = [("ar", "off")] + [(mode, tree) for mode in ("exact", "static") for tree in trees]
totals = defaultdict(lambda: [0, 0, 0.0])  # tokens, passes, seconds
options = dict(max_new_tokens=64, temperature=temperature, n_draft="auto", ensemble_weight=0.5)
for ids in prompts[:2]:  # warm: the compiled passes' first calls
    for mode, tree in runs:
        generate(pair, ids, mode=mode, tree=tree, **options)
for ids in prompts:
    for mode, tree in runs:
        start = time.perf_counter()
        summary, _ = generate(pair, ids, mode=mode, tree=tree, **options)
        seconds = time.perf_counter() - start
        total = totals[mode, tree]
        total[0] += summary.new_tokens
        total[1] += summary.target_passes
        total[2] += seconds
base = totals["ar", "off"][0] / totals["ar", "off"][2]
print(f"{len(prompts)} prompts, T = {temperature}, {pair.runtime}")
for (mode, tree), (tokens, passes, seconds) in totals.items():
    speed = tokens / seconds
    print(f"{mode:7s} tree {tree:9s} τ {tokens / passes:5.2f}  {speed:6.1f} tokens/s  {speed / base:5.2f}×")
