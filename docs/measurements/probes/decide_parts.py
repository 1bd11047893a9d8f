"""The decision after the target's pass, part by part, timed inside decodes (docs/measurements/speed.md,
"Where a step's time goes"): the softmax, the weight rule (a head's p/q terms and its MLP apart) and greedy
verification, ms a step, on the embedded pair's compiled passes; then the head alone in a loop of its own.

    python docs/measurements/probes/decide_parts.py
"""

import collections
import time

import torch

from diversed_demo.core import cost_rule, decode, verify
from diversed_demo.core.generate import generate
from diversed_demo.core.head import pq_terms
from diversed_demo.models.heads import load_head
from diversed_demo.runtime.plan import load_pair

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle, by the sea."
totals, steps, captured = collections.defaultdict(float), collections.Counter(), {}


def timed_verify_step(scored, fed, draft_tokens, draft_probs, draft_hidden, weigh, sampler):
    """decode.verify_step (greedy), its parts timed into `totals` under the running mode."""
    logits, target_hidden, aux = scored
    n = len(draft_tokens)
    t0 = time.perf_counter()
    target_probs = sampler.probs(logits)
    t1 = time.perf_counter()
    w = target_probs.new_ones(0)
    if n:
        w = weigh(target_probs[:n], draft_probs, draft_tokens, target_hidden[:n], draft_hidden).float()
        captured.setdefault(n, (target_probs[:n], draft_probs, target_hidden[:n], draft_hidden))
    t2 = time.perf_counter()
    verdict = verify.verify_block_greedy(draft_tokens, draft_probs, target_probs, w)
    t3 = time.perf_counter()
    for part, seconds in (("softmax", t1 - t0), ("rule", t2 - t1), ("verify", t3 - t2)):
        totals[mode, part] += seconds
    steps[mode] += 1
    verified = None if aux is None else aux[: fed + verdict[0]]
    return decode.Verdict(
        draft_tokens, draft_probs, target_probs, w, *verdict, target_hidden, draft_hidden, verified
    )


def head_parts(head):
    """A weight rule that is the head's, its terms and MLP timed apart."""

    def weigh(p, q, x, target_hidden, draft_hidden):
        t0 = time.perf_counter()
        terms = pq_terms(*cost_rule.greedy_position_costs(p, q))
        t1 = time.perf_counter()
        w = head.ensemble_weight(target_hidden, draft_hidden, terms)
        totals[mode, "head terms"] += t1 - t0
        totals[mode, "head MLP"] += time.perf_counter() - t1
        return w

    return weigh


pair = load_pair(compiled="wait")
head = load_head("summarization-greedy", pair)
decode.verify_step = timed_verify_step
modes = {
    "target only": dict(mode="ar"),
    "exact": dict(mode="exact"),
    "static 0.5": dict(mode="static", ensemble_weight=0.5),
    "head": dict(mode="dynamic", head=head),
}
rule = decode.weight_rule
for round_ in ("warm", "timed"):
    for mode, settings in modes.items():
        totals.clear()
        steps.clear()
        decode.weight_rule = (lambda config, greedy: head_parts(head)) if mode == "head" else rule
        generate(pair, PROMPT, max_new_tokens=128, temperature=0, **settings)
        if round_ == "timed":
            parts = sorted({part for m, part in totals if m == mode})
            figures = " · ".join(f"{p} {totals[mode, p] / steps[mode] * 1e3:.3f}" for p in parts)
            print(f"{mode}: {figures} ms a step")
p, q, target_hidden, draft_hidden = captured[max(captured)]
weigh = head_parts(head)
mode = "alone"
with torch.inference_mode():
    for _ in range(50):
        weigh(p, q, None, target_hidden, draft_hidden)
    start = time.perf_counter()
    for _ in range(500):
        weigh(p, q, None, target_hidden, draft_hidden)
print(f"the head's rule alone, {len(p)} rows: {(time.perf_counter() - start) / 500 * 1e3:.3f} ms a call")
