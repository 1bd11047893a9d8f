"""The target's pass over 5 tokens inside greedy exact decodes (N = 4, no lookup) against the same pass
timed back to back, as runtime/costs.py times the v[N] of the bound, at the prompt's length and 32 tokens
past it; paired, one Spec-Bench first turn at a time (docs/measurements/speed.md, "Where a step's time
goes").

    python docs/measurements/probes/pass_in_decode.py
"""

import statistics
import time

from diversed_demo.core.generate import generate
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import load_spec_bench
from diversed_demo.runtime import compiled_pass, costs
from diversed_demo.runtime.plan import load_pair

pair = load_pair(compiled="wait")
in_decode, timing = [], [False]
forward = compiled_pass.CompiledPass.forward


def timed_forward(self, tokens, length, *inputs, rows=None):
    start = time.perf_counter()
    out = forward(self, tokens, length, *inputs, rows=rows)
    if timing[0] and self is pair.target_pass and tokens.numel() == 5:
        in_decode.append(time.perf_counter() - start)
    return out


compiled_pass.CompiledPass.forward = timed_forward
prompts = [example.prompt for example in load_spec_bench(per_category=1)][:8]
generate(pair, prompts[0], mode="exact", max_new_tokens=64, temperature=0)  # warm
rows = []
for prompt in prompts:
    in_decode.clear()
    timing[0] = True
    generate(pair, prompt, mode="exact", n_draft=4, max_new_tokens=64, temperature=0, prompt_lookup=False)
    timing[0] = False
    ids = encode_prompt(pair.tokenizer, prompt)
    alone = costs.pass_ms(pair.target, ids, [5], runner=pair.target_pass)[5]
    later = costs.pass_ms(pair.target, ids + ids[:32], [5], runner=pair.target_pass)[5]
    rows.append((statistics.median(in_decode) * 1e3, alone, later))
    print(f"prompt {len(ids)}: in decodes {rows[-1][0]:.2f} ms, back to back {alone:.2f}, 32 on {later:.2f}")
means = [statistics.mean(column) for column in zip(*rows)]
print("mean: in decodes {:.2f} ms, back to back {:.2f}, 32 tokens on {:.2f}".format(*means))
