"""How often a prompt-lookup guess would be the target's greedy choice, against the draft's own guess, at
every verified position of exact SD (N = 2, greedy, 64 tokens), by the match it needs (docs/results.md,
"Prompt lookup"): on the project's own prompts (passages, GSM8K train, MBPP's prompt split) or on 26
Spec-Bench first turns.

    python docs/measurements/probes/lookup_rules.py own      # or: spec-bench
"""

import collections
import gzip
import json
import random
import sys
from types import SimpleNamespace

import torch

from diversed_demo.cli import pair_from_args
from diversed_demo.common.paths import ROOT
from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.decode import decode_rows
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import data_file, load_gsm8k, load_mbpp, load_spec_bench


def own_prompts() -> list:
    rows = [json.loads(line) for line in gzip.open(ROOT / "assets/prompts/passages.jsonl.gz", "rt")]
    random.Random(0).shuffle(rows)
    examples = []
    for category in ("summarization", "extraction", "rag", "translation"):
        examples += [SimpleNamespace(**row) for row in rows if row["category"] == category][:6]
    for example in load_gsm8k(data_file("gsm8k/train.jsonl"), limit=8):
        examples.append(SimpleNamespace(prompt=example.prompt, category="math"))
    for example in load_mbpp(limit=8):  # task ids 1-8: MBPP's prompt split
        examples.append(SimpleNamespace(prompt=example.prompt, category="coding"))
    return examples


def latest_follower(context: list[int], match: int) -> int | None:
    """The token after the latest earlier occurrence of the context's last `match` tokens."""
    tail = context[-match:]
    for start in range(len(context) - match - 1, -1, -1):
        if context[start : start + match] == tail:
            return context[start + match]
    return None


def guess(context: list[int], fewest: int, most: int = 4) -> int | None:
    """The longest match's follower, from `most` tokens down to `fewest`."""
    for match in range(most, fewest - 1, -1):
        if len(context) > match and (found := latest_follower(context, match)) is not None:
            return found
    return None


pair = pair_from_args(SimpleNamespace(target=None, draft=None, device="cpu", dtype="auto"), compiled="wait")
examples = own_prompts() if sys.argv[1] == "own" else load_spec_bench(per_category=2)
rules = {"draft": None, "match >= 1": 1, "match >= 2": 2, "match >= 3": 3}
right, total = collections.defaultdict(collections.Counter), collections.Counter()
with torch.inference_mode():
    for example in examples:
        prompt_ids, output = encode_prompt(pair.tokenizer, example.prompt), []
        exact = DecodeConfig(mode="exact", n_draft=2, max_new_tokens=64, temperature=0)
        for _, step in decode_rows(pair, [prompt_ids], [exact]):
            verdict = step.verdict
            for j in range(min(len(verdict.draft_tokens), verdict.n_accepted + 1)):  # the verified drafts
                wanted, drafted = int(verdict.target_probs[j].argmax()), int(verdict.draft_tokens[j])
                context = prompt_ids + output + verdict.draft_tokens[:j].tolist()
                for category in ("all", example.category):
                    total[category] += 1
                    for name, fewest in rules.items():
                        proposal = drafted if fewest is None else guess(context, fewest)
                        right[name][category] += (drafted if proposal is None else proposal) == wanted
            output += step.new_ids
categories = ["all", *sorted(set(total) - {"all"})]
print(f"{'proposal':12s}" + "".join(f"{category[:11]:>12s}" for category in categories))
print(f"{'positions':12s}" + "".join(f"{total[category]:12d}" for category in categories))
for name in rules:
    print(f"{name:12s}" + "".join(f"{right[name][c] / total[c]:12.3f}" for c in categories))
