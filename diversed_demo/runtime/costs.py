"""What decoding costs on this machine, in target-token units (a one-token pass; whole steps' costs in
target-only steps): the draft's cost per token c, a drafting step's own r and the verify pass's v[N]; and,
from them, the draft length each mode decodes fastest with."""

from __future__ import annotations

import math
import statistics
import time

import torch

from ..core.cache import CachedLM
from ..core.config import TREE_OFF, DecodeConfig
from ..core.generate import generate, speculative_generate
from ..core.stats import Counts, Summary
from .gguf_int4 import GgufLinear
from .theory import alpha_from_acceptance, analytic_speedup, fastest_n_draft


@torch.inference_mode()
def pass_ms(model, prompt_ids: list[int], sizes, calls: int = 16, runner=None) -> dict[int, float]:
    """{k: median time of a cached forward of k new tokens (with the LM head on all of them)} after one
    prefill of the prompt, on `runner` (the pair's compiled pass, which decodes then run on) where given.
    The sizes take turns within each call, so a burst of load on a shared machine slows them alike instead
    of one size; the first turn, after the prefill, runs cold and is not timed."""
    lm = CachedLM(model, model.config.get_text_config().vocab_size, runner=runner)
    lm.forward(torch.tensor(prompt_ids, device=model.device), keep=1)
    feeds = {k: torch.tensor(prompt_ids[-k:], device=model.device) for k in sorted(set(sizes))}
    times = {k: [] for k in feeds}
    for call in range(calls + 1):
        for k, feed in feeds.items():
            start = time.perf_counter()
            lm.forward(feed, keep=k)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            if call:
                times[k].append(time.perf_counter() - start)
            lm.rollback(len(prompt_ids))
    lm.close()
    return {k: statistics.median(t) * 1e3 for k, t in times.items()}


# Kept timings describe the host they were timed on. The same CPU model on another host (a VM moved, its
# neighbours busier) priced a one-token pass at 5.4 ms one day and 9.4 the next, a pass over 7 tokens at
# 1.27 and then 1.04–1.07 of it, and a draft length weighed on the old figures drafted too little (speed.md,
# "Kept timings and the host"). A quick look at the passes (`pass_check`) tells whether they still hold.
CHECK_ROWS = 7  # the widest chain's pass: six drafts and the unseen token
# Beyond these a kept timing is timed again: the one-token pass's relative change, and the wide pass's in
# one-token passes (four runs of ten checks on one host: 4–9% and 0.07–0.12 from lowest to highest).
HOST_DRIFT = 0.15
WIDE_DRIFT = 0.15


def pass_check(pair, prompt_ids: list[int]) -> dict[str, float]:
    """A quick look at what the target's passes cost on this host now (half a second on the embedded pair):
    the one-token pass's ms and a pass over CHECK_ROWS tokens in one-token passes."""
    ms = pass_ms(pair.target, prompt_ids, [1, CHECK_ROWS], calls=12, runner=pair.target_pass)
    return {"target_ms": ms[1], "wide": ms[CHECK_ROWS] / ms[1]}


def host_change(kept, now: dict[str, float]) -> str | None:
    """Why timings kept with the check `kept` (from JSON) do not describe the host whose check is `now`, in
    words; None where they do."""
    try:
        then_ms, then_wide = float(kept["target_ms"]), float(kept["wide"])
    except (KeyError, TypeError, ValueError):
        return "no check of the host was kept with them"
    if not (math.isfinite(then_ms) and then_ms > 0 and math.isfinite(then_wide)):
        return "no check of the host was kept with them"
    if abs(now["target_ms"] / then_ms - 1) > HOST_DRIFT:
        return f"a one-token pass takes {now['target_ms']:.1f} ms now, {then_ms:.1f} when they were timed"
    if abs(now["wide"] - then_wide) > WIDE_DRIFT:
        return (
            f"a pass over {CHECK_ROWS} tokens costs {now['wide']:.2f} one-token passes now, "
            f"{then_wide:.2f} when they were timed"
        )
    return None


DRAFT_LENGTHS = (1, 4)  # the fixed draft lengths whose steps give a drafted token's cost and a step's apart
# A timing decode's steps kept at least (after the two left out): one gives no interval to time, and a
# decode cut that short (an EOS) prices nothing.
MIN_TIMED_STEPS = 2


class CostError(ValueError):
    """A timing that cannot price a step: too few steps, or figures outside any machine's range."""


def decode_steps(pair, prompt_ids: list[int], n_draft: int, max_new_tokens: int) -> dict[str, float]:
    """A greedy decode's steps on average (exact SD on a chain at N = `n_draft`, target-only at 0): "ms" a
    whole step (its drafting, the target's pass, the decision, the events and the loop, timed from one step's
    end to the next's), "draft_ms" its drafting (with what it costs besides the draft's forwards: a feature
    draft's restart from the target's features, sampling), "drafted" tokens. The first two steps are left
    out: the prompt's pass, which every mode pays once a decode, and the step after it, where the draft reads
    the whole prompt. Raises CostError where fewer than MIN_TIMED_STEPS steps are left."""
    config = DecodeConfig(
        mode="exact" if n_draft else "ar",
        n_draft=max(n_draft, 1),
        tree=TREE_OFF,
        max_new_tokens=max_new_tokens,
        temperature=0,
    )
    firsts, ends = {}, {}  # per step: its first event, and when it came (the step's end)
    for event in speculative_generate(pair, prompt_ids, config):
        if isinstance(event, Summary):
            break
        if event.step not in firsts:
            firsts[event.step], ends[event.step] = event, time.perf_counter()
    steps = sorted(firsts)
    kept = [firsts[step] for step in steps[2:]]
    if len(kept) < MIN_TIMED_STEPS:
        raise CostError(f"a timing decode gave {len(kept)} steps to time, fewer than {MIN_TIMED_STEPS}")
    return {
        "ms": (ends[steps[-1]] - ends[steps[1]]) * 1e3 / len(kept),
        "draft_ms": sum(e.draft_ms for e in kept) / len(kept),
        "drafted": sum(e.drafted for e in kept) / len(kept),
    }


def priced(short: dict, long: dict, key: str) -> tuple[float, float]:
    """(per drafted token, per step) of `key` by a line through two decodes' steps at DRAFT_LENGTHS; where
    the host's noise tilts it (a step's own cost below 0), all of a step's `key` per token, as the longer
    length's average."""
    if long["drafted"] - short["drafted"] < 1:  # the longer drafted hardly more: no line through them
        raise CostError("the timing decodes at two draft lengths drafted alike")
    per_token = (long[key] - short[key]) / (long["drafted"] - short["drafted"])
    fixed = short[key] - per_token * short["drafted"]
    if fixed < 0 or per_token <= 0:
        return long[key] / long["drafted"], 0.0
    return per_token, fixed


def pass_ratio(v: dict[int, float], drafted: float) -> float:
    """v at a decode's mean number of drafts, between the measured v[N] (v[0] = 1; held beyond the last)."""
    points = sorted({0: 1.0, **v}.items())
    for (low, v_low), (high, v_high) in zip(points, points[1:]):
        if drafted <= high:
            return v_low + (max(drafted, low) - low) / (high - low) * (v_high - v_low)
    return points[-1][1]


def step_costs(steps: dict[int, dict], verify_ms: dict[int, float], target_ms: float, draft: tuple) -> dict:
    """c, r and v[N] as whole decoding steps price them, in target-only steps (what the draft length rule
    weighs): a step at N costs T(N) = S(N) ÷ S(0), fitted as r' + N·c' + v[N] (v[N] = 1 + the pass's
    growth over N drafts) through the decodes at DRAFT_LENGTHS. A step pays more than its drafting (`draft`:
    its ms a token and a step): the verification and events of its positions, and a target pass slowed by the
    draft's steps between passes. c and r stay the drafting's own, spent once drafted, and the rest goes to
    the positions: v[N] + (r' − r) + N·(c' − c), which a position not put to the target saves. T(N) is the
    fit's either way."""
    unit = steps[0]["ms"]
    if not unit > 0:
        raise CostError("target-only steps timed at no time: no unit to price a step in")
    v = {n: 1.0 + (ms - target_ms) / unit for n, ms in verify_ms.items()}
    short, long = (
        {"drafted": steps[n]["drafted"], "T": steps[n]["ms"] / unit - pass_ratio(v, steps[n]["drafted"])}
        for n in DRAFT_LENGTHS
    )
    c, r = draft[0] / unit, draft[1] / unit
    per_token, _ = priced(short, long, "T")
    c_fit = max(per_token, c)
    r_fit = max(short["T"] - c_fit * short["drafted"], r)
    costs = {"c": c, "r": r, "v": {n: v_n + (r_fit - r) + n * (c_fit - c) for n, v_n in v.items()}}
    if parsed_costs(costs) is None:
        raise CostError(f"whole steps priced as no machine runs them: {costs}")
    return costs | {"unit_ms": unit}  # the unit: a target-only step


def parsed_costs(costs) -> dict | None:
    """c, r and v[N] of a timing (from JSON, N a string) as numbers, or None where any is missing, not a
    finite number or below zero (v not above it: a damaged or older file, a run timed over no interval)."""
    try:
        c, r = float(costs["c"]), float(costs["r"])
        v = {int(n): float(v_n) for n, v_n in costs["v"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    numbers = [c, r, *v.values()]
    if not v or not all(math.isfinite(x) for x in numbers):
        return None
    if not (c >= 0 and r >= 0 and all(n >= 1 and v_n > 0 for n, v_n in v.items())):
        return None
    return {"c": c, "r": r, "v": v}


def median_costs(timings: list[dict]) -> dict:
    """Each figure of several timings' costs (as `plan.kept_costs` gives them: c, r, v[N] and the whole steps'
    "steps") as their median: a timing on one of the host's slower spells does not price every step alone.
    v[N] for the N every timing measured; each timing's v rises with N, and so do the medians."""

    def middle(costs: list[dict]) -> dict:
        lengths = set.intersection(*(set(c["v"]) for c in costs))
        return {
            "c": statistics.median(c["c"] for c in costs),
            "r": statistics.median(c["r"] for c in costs),
            "v": {n: statistics.median(c["v"][n] for c in costs) for n in sorted(lengths)},
        }

    return middle(timings) | {"steps": middle([timing["steps"] for timing in timings])}


def tree_speed(pair, prompts, rounds: int = 2, max_new_tokens: int = 48) -> float:
    """How fast greedy exact SD decodes `prompts` with draft trees, as a multiple of its speed with chains
    (the same texts either way: exact means exact): per prompt the best of `rounds` alternating decodes
    each, so that a burst of load slows both alike, after an untimed decode of each (a first tree decode
    after a start ran at half the speed of the next). Every cost a tree adds counts, not only its pass."""

    def seconds(prompt: str, tree: str) -> float:
        config = DecodeConfig(
            mode="exact", n_draft="auto", tree=tree, max_new_tokens=max_new_tokens, temperature=0
        )
        start = time.perf_counter()
        generate(pair, prompt, config)
        return time.perf_counter() - start

    total = {"off": 0.0, "on": 0.0}
    for tree in total:
        seconds(prompts[0], tree)
    for prompt in prompts:
        times = {tree: [] for tree in total}
        for _ in range(rounds):
            for tree in times:
                times[tree].append(seconds(prompt, tree))
        total = {tree: total[tree] + min(times[tree]) for tree in total}
    return total["off"] / total["on"]


def measure_costs(
    pair,
    prompt_ids: list[int],
    n_drafts,
    rounds: int = 3,
    calls: int = 16,
    draft_tokens: int = 48,
    steps: bool = False,
) -> dict:
    """c = draft token ÷ target token, r = a drafting step's own cost ÷ target token (its first draft pass
    reads the tokens verified since the last: DRAFT_LENGTHS apart); v[N] = target pass over N + 1 tokens ÷
    target token (interleaved; each a median of `calls` passes, on the passes decodes run on, the draft's
    over greedy decodes of `draft_tokens`). With `steps`, also "steps": `step_costs` (a target-only decode
    more a round), what whole steps cost, which the draft length rule weighs."""
    n_drafts = sorted(set([n_drafts] if isinstance(n_drafts, int) else n_drafts))
    passes, decodes = [], []
    for _ in range(rounds):
        sizes = [1] + [n + 1 for n in n_drafts]
        passes.append(pass_ms(pair.target, prompt_ids, sizes, calls, runner=pair.target_pass))
        lengths = ((0,) if steps else ()) + DRAFT_LENGTHS
        decodes.append({n: decode_steps(pair, prompt_ids, n, draft_tokens) for n in lengths})
    t = statistics.median(p[1] for p in passes)
    median = {
        n: {key: statistics.median(d[n][key] for d in decodes) for key in decodes[0][n]} for n in decodes[0]
    }
    d, r = priced(*(median[n] for n in DRAFT_LENGTHS), "draft_ms")
    verify_ms = {n: statistics.median(p[n + 1] for p in passes) for n in n_drafts}
    costs = {
        "target_ms": t,
        "draft_ms": d,
        "c": d / t,
        "r": r / t,
        "verify_ms": verify_ms,
        "v": {n: ms / t for n, ms in verify_ms.items()},
    }
    if steps:
        costs["steps"] = step_costs(median, verify_ms, t, (d, r))
    return costs


def calibration_alpha(pair, config: DecodeConfig, prompts: list) -> float:
    """Per-token acceptance α of one mode, from decodes of a few calibration prompts by `config` (its
    N the probe's), the i-th at seed config.seed + i."""
    counts = Counts()
    for i, prompt in enumerate(prompts):
        summary, _ = generate(pair, prompt, config.replace(seed=config.seed + i))
        counts += summary.counts
    return alpha_from_acceptance(counts.acceptance_rate or 0.0, config.n_draft)


def choose_n_draft(pair, modes: dict, costs: dict, prompts: list) -> dict[str, dict]:
    """Per mode (a DecodeConfig, its N the probe's), the draft length that maximises the analytic bound at
    the acceptance measured on a few calibration prompts (the project's own, not the benchmark's) with the
    measured c and v[N]."""
    chosen = {}
    for name, config in modes.items():
        if config.mode == "ar":
            continue
        alpha = calibration_alpha(pair, config, prompts)
        r = costs.get("r", 0.0)
        bounds = {n: analytic_speedup(alpha, n, costs["c"], v, r) for n, v in costs["v"].items()}
        chosen[name] = {
            "n_draft": fastest_n_draft(alpha, costs["c"], costs["v"], r),
            "calibration_alpha": alpha,
            "bounds": bounds,
        }
    return chosen


def weight_bytes(model) -> int:
    """The bytes of weights a one-token pass streams, each tensor once (tied embeddings are one tensor; a
    projection or LM head on its GGUF's quantised weights counts those, not the dense copy it keeps for
    prompts)."""
    tensors = {id(p): p for p in model.parameters()}
    for module in model.modules():
        if isinstance(module, GgufLinear):
            tensors.pop(id(module.weight), None)
            tensors.update({id(t): t for t in module.operands})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """The memory bandwidth a plain copy reaches here, in bytes per second (read plus written), best of
    `repeats`: what a pass streaming the weights can hope for at most."""
    source = torch.ones(megabytes << 18)  # float32: megabytes MiB
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best


def memory_limit(target) -> dict:
    """Target-only decoding's speed limit where each token streams every weight once: bandwidth ÷ bytes."""
    if target.device.type != "cpu":
        return {}
    bytes_per_token, bandwidth = weight_bytes(target), copy_bandwidth()
    return {
        "weight_bytes": bytes_per_token,
        "copy_bytes_per_second": bandwidth,
        "tokens_per_second": bandwidth / bytes_per_token,
    }
