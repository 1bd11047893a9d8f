"""How much the whole steps' costs the draft length weighs (runtime/costs.step_costs) move from one timing
to the next on this host: `compiled_costs`' timing repeated in one process, each round's decodes kept, and
the steps' r + c + v_1 − 1 (what exact SD's first draft must beat: ᾱ = 0.5) priced from the rounds'
medians (as shipped) and from their minima (the host's noise only adds time). Run alone on the CPU.

    python docs/measurements/probes/step_costs_spread.py [repeats]
"""

import statistics
import sys

from diversed_demo.core.prompt import encode_prompt
from diversed_demo.runtime.costs import DRAFT_LENGTHS, decode_steps, pass_ms, priced, step_costs
from diversed_demo.runtime.dtype_choice import TIMING_CALLS, calibration_prompt
from diversed_demo.runtime.plan import load_pair

ROUNDS, SIZES = 3, [1, 2]


def threshold(rounds: list, passes: list, pick) -> float:
    """r + c + v_1 − 1 of whole steps, each decode's figures and pass size taken by `pick` over rounds."""
    decodes = {n: {k: pick([r[n][k] for r in rounds]) for k in rounds[0][n]} for n in rounds[0]}
    t = pick([p[1] for p in passes])
    d, r = priced(*(decodes[n] for n in DRAFT_LENGTHS), "draft_ms")
    costs = step_costs(decodes, {1: pick([p[2] for p in passes])}, t, (d, r))
    return costs["r"] + costs["c"] + costs["v"][1] - 1


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    pair = load_pair(compiled="wait")
    prompt_ids = encode_prompt(pair.tokenizer, calibration_prompt())
    for _ in range(repeats):
        rounds, passes = [], []
        for _ in range(ROUNDS):
            passes.append(pass_ms(pair.target, prompt_ids, SIZES, TIMING_CALLS, runner=pair.target_pass))
            rounds.append({n: decode_steps(pair, prompt_ids, n, 32) for n in (0, *DRAFT_LENGTHS)})
        medians, minima = threshold(rounds, passes, statistics.median), threshold(rounds, passes, min)
        unit = [round(r[0]["ms"], 2) for r in rounds]
        print(f"median {medians:.3f} · min {minima:.3f} · target-only step ms by round {unit}", flush=True)


if __name__ == "__main__":
    main()
