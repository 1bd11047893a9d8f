"""Probe (docs/measurements/speed.md, "Attention"): the compiled target pass on the fused attention kernel
against attention in blocks: a pass over k tokens after 300 cached ones, in ms and in single passes, and
greedy decodes of target-only and exact SD (tokens/s, and whether their tokens agree).

    DIVERSED_FUSED_ATTENTION=0 python docs/measurements/probes/pass_attention.py   # blocks
    python docs/measurements/probes/pass_attention.py                               # fused, where it serves
"""

import time

from diversed_demo import generate, load_pair
from diversed_demo.runtime.costs import pass_ms

PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about the sea.",
    "What is the capital of France, and what is it known for?",
    "Give three tips for learning a new language.",
]
pair = load_pair(compiled="wait")
print(pair.runtime)
prompt = [1 + i % 1000 for i in range(300)]
times = pass_ms(pair.target, prompt, [1, 2, 3, 4, 6, 8], calls=30, runner=pair.target_pass)
print("pass ms:", " ".join(f"{k}:{t:.2f}" for k, t in times.items()))
print("of one:", " ".join(f"{k}:{t / times[1]:.2f}" for k, t in times.items()))
same, speeds = 0, {"ar": [], "exact": []}
for text in PROMPTS * 2:
    outputs = {}
    for mode in ("ar", "exact"):
        start = time.perf_counter()
        summary, _ = generate(pair, text, mode=mode, max_new_tokens=96, temperature=0)
        speeds[mode].append(summary.tokens_per_second)
        outputs[mode] = summary.text
    same += outputs["ar"] == outputs["exact"]
print("greedy exact SD = target-only:", same, "of", 2 * len(PROMPTS))
print("tokens/s:", {mode: round(sorted(v)[len(v) // 2], 1) for mode, v in speeds.items()})
