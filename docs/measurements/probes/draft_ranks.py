"""The rank of the target's greedy token in the draft's q at each verified position
(docs/measurements/speed.md, "Would a tree pay here?"): exact SD, N = 2, greedy, 64 tokens, 26 Spec-Bench
first turns.

    python docs/measurements/probes/draft_ranks.py
"""

import collections
from types import SimpleNamespace

import torch

from diversed_demo.cli import pair_from_args
from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.decode import decode_rows
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import load_spec_bench

pair = pair_from_args(SimpleNamespace(target=None, draft=None, device="cpu", dtype="auto"), compiled="wait")
ranks = [collections.Counter(), collections.Counter()]  # depth 1, depth 2
with torch.inference_mode():
    for example in load_spec_bench(per_category=2):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        exact = DecodeConfig(mode="exact", n_draft=2, max_new_tokens=64, temperature=0)
        for _, step in decode_rows(pair, [prompt_ids], [exact]):
            verdict = step.verdict
            for j in range(min(len(verdict.draft_tokens), verdict.n_accepted + 1)):  # the verified drafts
                wanted = verdict.target_probs[j].argmax()
                rank = int((verdict.draft_probs[j] > verdict.draft_probs[j, wanted]).sum())
                ranks[j][min(rank, 9)] += 1
for depth, counts in enumerate(ranks, 1):
    total = sum(counts.values())
    shares = " ".join(f"{rank + 1}:{counts[rank] / total:.3f}" for rank in range(9))
    print(f"depth {depth}: {total} verified; share by rank {shares} beyond 9:{counts[9] / total:.3f}")
