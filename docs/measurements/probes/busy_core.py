"""Decoding beside another process that keeps a core busy (docs/measurements/speed.md, "Another process on a
core"): the embedded pair's greedy decodes of 4 Spec-Bench first turns (64 tokens), tokens/s alone, then
beside `while True: pass` with the thread watch off and on (common/threads.py), then alone again.

    python docs/measurements/probes/busy_core.py
"""

import subprocess
import sys
import time
from types import SimpleNamespace

import torch

from diversed_demo.cli import pair_from_args
from diversed_demo.common.threads import THREADS
from diversed_demo.core.generate import generate
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import load_spec_bench

pair = pair_from_args(SimpleNamespace(target=None, draft=None, device="cpu", dtype="auto"), compiled="wait")
prompts = [encode_prompt(pair.tokenizer, example.prompt) for example in load_spec_bench(per_category=1)][:4]
full = THREADS.full


def speeds(watch: bool) -> tuple[dict, list]:
    """Tokens/s of target-only and exact SD over the prompts, and their texts."""
    THREADS.full = full if watch else 0
    if not watch:
        torch.set_num_threads(full)
    rates, texts = {}, []
    for mode in ("ar", "exact"):
        start, tokens = time.perf_counter(), 0
        for ids in prompts:
            summary = generate(pair, ids, mode=mode, max_new_tokens=64, temperature=0.0)[0]
            tokens, texts = tokens + summary.new_tokens, texts + [summary.text]
        rates[mode] = round(tokens / (time.perf_counter() - start), 1)
    return rates, texts


speeds(True)  # warm
alone, texts = speeds(True)
print(f"alone, {full} threads: {alone}")
busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
try:
    time.sleep(1.0)
    for watch in (False, True):
        rates, beside = speeds(watch)
        print(
            f"beside a busy process, watch {'on' if watch else 'off'}: {rates}; ended on "
            f"{torch.get_num_threads()} threads; texts as alone: {beside == texts}"
        )
finally:
    busy.kill()
time.sleep(1.0)
speeds(True)
print(f"alone again, watch on: {speeds(True)[0]}, ended on {torch.get_num_threads()} threads")
