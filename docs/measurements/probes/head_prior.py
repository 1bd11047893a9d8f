"""A per-token rule's or head's draft length before it has verified anything (core/draft_length.py,
UNSEEN_W): the README bench's prompts, greedy, 64 tokens, N step by step, decoded by target-only and by a
head with the running mean of w_t started at exact SD's 1 and at UNSEEN_W, alternating prompt by prompt,
under the pair's own timed costs and under whole steps as a slow host timed them (c 0.076, r 0.123,
v_1 1.44: exact SD's first draft does not pay, ᾱ 0.5 < 0.64). Prints tokens/s against target-only, τ and
drafts a step; run alone on the CPU.

    python docs/measurements/probes/head_prior.py [head] [per_category]
"""

import copy
import sys
import time

from diversed_demo.core import draft_length
from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.generate import generate
from diversed_demo.eval.tasks import load_spec_bench
from diversed_demo.models.heads import load_head
from diversed_demo.runtime.plan import load_pair

SLOW_STEPS = {
    "c": 0.0757,
    "r": 0.1233,
    "v": {1: 1.444, 2: 1.603, 3: 1.778, 4: 1.947, 5: 2.194, 6: 2.441},
}


def main() -> None:
    head_name = sys.argv[1] if len(sys.argv) > 1 else "general-greedy"
    per_category = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    pair = load_pair(compiled="wait")
    head = load_head(head_name, pair)
    prompts = [e.prompt for e in load_spec_bench(per_category=per_category)]
    timed = copy.deepcopy(pair.costs)
    slow = {**copy.deepcopy(pair.costs), "steps": SLOW_STEPS}
    for name, costs in (("timed", timed), ("slow host's steps", slow)):
        pair.costs = costs
        totals = {k: [0.0, 0, 0, 0] for k in ("ar", "w 1", "w unseen")}  # s, tokens, passes, drafted
        for prompt in prompts:
            for label in totals:
                draft_length.UNSEEN_W = 1.0 if label == "w 1" else 0.5
                mode = "ar" if label == "ar" else "dynamic"
                config = DecodeConfig(mode=mode, head=head, n_draft="auto", max_new_tokens=64, temperature=0)
                start = time.perf_counter()
                summary, _ = generate(pair, prompt, config)
                total = totals[label]
                total[0] += time.perf_counter() - start
                total[1] += summary.new_tokens
                total[2] += summary.target_passes
                total[3] += summary.drafted
        ar = totals["ar"][1] / totals["ar"][0]
        for label, (s, tokens, passes, drafted) in totals.items():
            print(
                f"{name}: {label}: {tokens / s / ar:.2f}× target-only, τ {tokens / passes:.2f}, "
                f"{drafted / passes:.2f} drafted a step"
            )


if __name__ == "__main__":
    main()
