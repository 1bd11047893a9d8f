"""A tree step's parts outside the passes, timed in place (docs/results.md, "Draft trees against the
chain"): growing the tree, the target's pass, verifying it and building its figure for the Decode tab, ms a
step, greedy exact SD, 96 tokens, the default tree and the largest, two decodes each.

    python docs/measurements/probes/tree_step_parts.py
"""

import collections
import time

from diversed_demo.core import decode, events
from diversed_demo.core.generate import generate
from diversed_demo.runtime.plan import load_pair

totals, calls = collections.defaultdict(float), collections.Counter()


def timed(owner, name: str) -> None:
    function = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = function(*args, **kwargs)
        totals[name] += time.perf_counter() - start
        calls[name] += 1
        return out

    setattr(owner, name, wrapper)


for owner, name in ((decode, "propose_tree"), (decode, "score_rows"), (decode, "verify_tree_step")):
    timed(owner, name)
timed(events, "tree_figure")
pair = load_pair(compiled="wait")
prompt = "Write a long story about a lighthouse keeper who finds a message in a bottle, by the sea."
for tree in ("on", "4,4,4,15"):
    for _ in range(2):
        totals.clear()
        calls.clear()
        start = time.perf_counter()
        summary, _ = generate(pair, prompt, max_new_tokens=96, temperature=0, mode="exact", tree=tree)
        speed = summary.new_tokens / (time.perf_counter() - start)
        parts = " · ".join(f"{name} {totals[name] / calls[name] * 1e3:.2f}" for name in sorted(totals))
        print(f"tree {tree}: {speed:.1f} tokens/s, {calls['verify_tree_step']} steps; ms a step: {parts}")
