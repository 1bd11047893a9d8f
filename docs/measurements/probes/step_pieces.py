"""Where a decoding step's time goes, each piece timed in place (docs/measurements/speed.md, "What is left
outside the passes"): 13 Spec-Bench first turns, greedy, 64 tokens, after one warm round.

    python docs/measurements/probes/step_pieces.py exact 2     # or: ar 0, static auto 0.5, exact auto 1 auto
"""

import collections
import functools
import sys
import time
from types import SimpleNamespace

from diversed_demo.cli import pair_from_args
from diversed_demo.core import decode, draft, draft_tree, events, generate, sampling
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.eval.tasks import load_spec_bench
from diversed_demo.runtime import compiled_pass

totals = collections.defaultdict(lambda: [0, 0.0])


def timed(owner, name: str) -> None:
    """Replace owner.name by a wrapper that adds its calls and time to `totals`."""
    function, label = getattr(owner, name), f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        # A target pass over an empty cache is a prompt's pass: counted apart from the steps'.
        prompt = label.endswith("forward_rows") and not any(args[0].lengths)
        start = time.perf_counter()
        result = function(*args, **kwargs)
        key = label + " (prompt)" if prompt else label
        totals[key][0] += 1
        totals[key][1] += time.perf_counter() - start
        return result

    setattr(owner, name, wrapper)


pair = pair_from_args(SimpleNamespace(target=None, draft=None, device="cpu", dtype="auto"), compiled="wait")
mode, n_draft = sys.argv[1], sys.argv[2] if sys.argv[2] == "auto" else int(sys.argv[2])
w = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
tree = sys.argv[4] if len(sys.argv) > 4 else "off"
pieces = [(compiled_pass.CompiledPass, "forward"), (decode.CachedLM, "forward_rows"), (decode, "verify_step")]
pieces += [(draft.FeatureDraft, "propose"), (draft.FeatureDraft, "_step"), (type(pair.draft), "fuse")]
pieces += [(type(pair.draft), "full_probs"), (sampling.Sampler, "__call__"), (generate, "step_events")]
pieces += [(sampling.Sampler, "probs"), (decode, "verify_block_greedy"), (decode, "advance")]
pieces += [(decode, "propose"), (decode.CachedLM, "rollback"), (draft.FeatureDraft, "observe")]
pieces += [(decode, "propose_tree"), (decode, "verify_tree_step"), (draft.FeatureDraft, "_layer")]
pieces += [(draft, "tree_visible"), (draft_tree.Grower, "to_expand"), (draft_tree.Grower, "tree")]
pieces += [(events, "tree_figure"), (decode.CachedLM, "keep_path"), (draft_tree.Grower, "_draw")]
for owner, name in pieces:
    timed(owner, name)
prompts = [encode_prompt(pair.tokenizer, example.prompt) for example in load_spec_bench(per_category=1)]


def run() -> int:
    options = dict(
        mode=mode, n_draft=n_draft, max_new_tokens=64, temperature=0.0, ensemble_weight=w, tree=tree
    )
    options["prompt_lookup"] = mode != "ar"  # as the bench decodes
    return sum(generate.generate(pair, ids, **options)[0].new_tokens for ids in prompts)


run()
totals.clear()
start = time.perf_counter()
tokens = run()
wall = time.perf_counter() - start
steps = totals["decode.verify_step"][0]
print(f"{wall:.2f} s, {tokens} tokens, {steps} steps, {wall / steps * 1e3:.2f} ms a step")
for label, (calls, seconds) in sorted(totals.items(), key=lambda item: -item[1][1]):
    per_call, per_step = seconds / calls * 1e3, seconds / steps * 1e3
    print(f"{label:28s} {calls:6d} calls {per_call:7.3f} ms a call {per_step:7.3f} ms a step")
