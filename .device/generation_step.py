"""Where one step of the draft data's batched generation spends its time, on this machine's device: the
target's pass over one new token for `--rows` rows at a context of `--context` tokens (the prefill's
length), the sampling, and the host sync that reads the tokens back, each timed alone and then by
torch.profiler's table of operators. On the lent H200 a generator made 5.5k tokens/s at 768 rows with the
GPU 17–33% busy (docs/embedded-pair.md): this says where the rest went, before a lease spends minutes on
generation. `python .device/generation_step.py --device cpu --rows 8 --context 64` runs it here."""

from __future__ import annotations

import argparse
import time

import torch

from diversed_demo.core.cache import cache_keyword
from diversed_demo.core.sampling import sample
from diversed_demo.distill.batch_generation import prefill
from diversed_demo.models.embedded import EMBEDDED
from diversed_demo.runtime.plan import load_pair


def timed(device: torch.device, work, repeats: int) -> float:
    """Mean seconds of `work()` over `repeats` calls, after one warm-up, synchronised on the device."""
    work()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rows", type=int, default=768)
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    target = load_pair(EMBEDDED, None, args.device, "bfloat16", compiled="off").target
    device = target.device
    prompts = [[1 + (i * 7 + j) % 1000 for j in range(args.context)] for i in range(args.rows)]
    logits, cache, mask, positions = prefill(target, prompts, pad_id=0)
    token = logits.argmax(-1)
    generator = torch.Generator(device=device).manual_seed(0)
    mask, positions = torch.cat([mask, mask.new_ones(args.rows, 1)], dim=1), positions[:, -1:] + 1

    def forward():  # the cache grows by a token a call, as in generation
        return target(input_ids=token[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                      **{cache_keyword(target.forward): cache}).logits[:, -1]  # fmt: skip

    probs = torch.softmax(logits.float(), dim=-1)
    works = {
        "target pass (1 token a row)": forward,
        "softmax and sample": lambda: sample(torch.softmax(logits.float(), -1), generator),
        "sample and read the tokens back (.tolist())": lambda: sample(probs, generator).tolist(),
    }
    parts = {name: timed(device, work, args.repeats) for name, work in works.items()}
    for name, seconds in parts.items():
        print(f"{name}: {seconds * 1e3:.2f} ms")
    step = parts["target pass (1 token a row)"] + parts["sample and read the tokens back (.tolist())"]
    rate = args.rows / step
    print(f"a step (pass, sample, read back): {step * 1e3:.2f} ms, {rate:.0f} tokens/s at {args.rows} rows")
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(3):
            forward()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(profile.key_averages().table(sort_by=key, row_limit=20))


if __name__ == "__main__":
    main()
