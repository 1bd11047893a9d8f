"""The app's first example decoded at N step by step against fixed N, per mode, in interleaved rounds
(docs/measurements/speed.md, "The served app beside its client"): the pair as the app runs it (compiled
passes, the opening's settings), greedy, three rounds with the lengths in turn forwards and backwards;
prints each mode and N's median tokens/s, its tokens and target passes.
`python docs/measurements/probes/example_fixed_n.py ar,cost,static,dynamic auto,2,4,6 [examples]`.
"""

import statistics
import sys
import time

import torch

from diversed_demo.core.decode import decode_rows
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.runtime.model_thread import MODEL_THREAD
from diversed_demo.runtime.plan import load_pair
from diversed_demo.ui.examples import load_examples
from diversed_demo.ui.opening import measured_opening
from diversed_demo.ui.runs import resolve_head

ROUNDS = 3


def decode(pair, ids, config) -> tuple[float, int, int]:
    """Seconds, tokens and target passes of one decode on the model thread."""

    def run():
        with torch.inference_mode():
            return [step for _, step in decode_rows(pair, [ids], [config])]

    start = time.perf_counter()
    steps = MODEL_THREAD.call(run)
    return time.perf_counter() - start, sum(len(s.new_ids) for s in steps), len(steps)


def main() -> None:
    modes = sys.argv[1].split(",")
    lengths = [n if n == "auto" else int(n) for n in sys.argv[2].split(",")]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    pair = MODEL_THREAD.call(load_pair, compiled="wait")
    examples = load_examples()
    start = MODEL_THREAD.call(measured_opening, pair, examples)
    prompts = [encode_prompt(pair.tokenizer, e.prompt, start.settings.chat) for e in examples[:count]]
    results = {}
    for round_ in range(ROUNDS):
        for mode in modes:
            for n in lengths if round_ % 2 == 0 else lengths[::-1]:
                config = start.settings.replace(mode=mode, n_draft=n)
                head = MODEL_THREAD.call(resolve_head, pair, config)
                config = config.replace(head=head) if head is not None else config
                runs = [decode(pair, ids, config) for ids in prompts]
                seconds, tokens, passes = (sum(column) for column in zip(*runs))
                results.setdefault((mode, n), []).append((tokens / seconds, tokens, passes))
    for (mode, n), rounds in results.items():
        speed = statistics.median(r[0] for r in rounds)
        print(f"{mode} N={n}: {speed:.0f} tokens/s, {rounds[0][1]} tokens, {rounds[0][2]} passes")


if __name__ == "__main__":
    main()
