"""A long prompt's pass on the embedded target, profiled (docs/measurements/speed.md, "The served app beside
its client", "That prompt's pass"): the first Spec-Bench summarization turn (769 tokens with the chat
template), its pass timed 5 times after 2, then one pass under torch.profiler; then PyTorch's attention for
one layer's shapes at that length against the alternatives measured.

    python docs/measurements/probes/prompt_pass.py
"""

import json
import time

import torch
import torch.nn.functional as F

from diversed_demo.core.cache import CachedLM
from diversed_demo.core.draft import make_draft
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import data_dir
from diversed_demo.runtime import fused_attention
from diversed_demo.runtime.block_attention import feed_rows
from diversed_demo.runtime.plan import load_pair


def best_ms(fn, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def attention(length: int) -> None:
    """One layer's attention over `length` rows (9 query heads, 3 key-value heads of 64)."""
    q = torch.randn(1, 9, length, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 3, length, 64, dtype=torch.bfloat16) for _ in range(2))
    kr, vr = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    _, mask = feed_rows(0, length)
    padded = [torch.zeros(3, mask.shape[1], 64, dtype=torch.bfloat16) for _ in range(2)]
    padded[0][:, :length], padded[1][:, :length] = k[0], v[0]
    query = q[0].transpose(0, 1).contiguous()
    causal = torch.full((length, length), float("-inf")).triu(1)

    def in_bf16():
        scores = torch.matmul(q, kr.transpose(-1, -2)).float() * 0.125 + causal
        return torch.matmul(scores.softmax(-1).to(torch.bfloat16), vr)

    sdpa = F.scaled_dot_product_attention
    figures = {
        "flash, enable_gqa": lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True),
        "flash, repeated": lambda: sdpa(q, kr, vr, is_causal=True),
        "flash float32 with conversions": lambda: sdpa(
            q.float(), kr.float(), vr.float(), is_causal=True
        ).bfloat16(),
        "matmuls in bf16": in_bf16,
    }
    if fused_attention.ensure():
        figures["fused kernel"] = lambda: fused_attention.attend(query, *padded, mask)
    for name, fn in figures.items():
        print(f"attention, {length} rows, {name}: {best_ms(fn):.1f} ms")


def main() -> None:
    pair = load_pair(compiled="wait")
    questions = [json.loads(line) for line in open(data_dir() / "spec_bench" / "question.jsonl")]
    article = next(q for q in questions if q["category"] == "summarization")["turns"][0]
    tokens = torch.tensor(encode_prompt(pair.tokenizer, article))
    aux = make_draft(pair, "exact").aux_layer_ids

    def one_pass():
        lm = CachedLM(pair.target, pair.vocab_size, aux, rows=1, runner=pair.target_pass)
        lm.forward(tokens, keep=1)
        lm.close()

    with torch.inference_mode():
        print(f"{len(tokens)} tokens: the prompt's pass {best_ms(one_pass):.0f} ms (best of 5)")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            one_pass()
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        attention(len(tokens))


if __name__ == "__main__":
    main()
