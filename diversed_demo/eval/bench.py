"""Spec-Bench: speed and quality of every mode on one pair, in one process, modes interleaved.

For each first-turn question the modes run back to back in a rotating order, so machine drift hits
them alike. Speedup is tokens/s over target-only in the same category. The analytic bound of
speculative decoding, (1 − α^{N+1}) / ((1 − α)(N·c + v)), uses the measured acceptance α, the draft's
cost per token c and the verify pass's cost v, both relative to one target token.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from ..core.decode import Row, decode_rows, decode_steps
from ..core.draft import is_feature_draft
from ..core.generate import generate
from ..core.prompt import encode_prompt
from ..core.stats import Counts
from ..models.heads import load_head, resolve_head_path
from .bench_report import goals
from .costs import choose_n_draft, measure_costs
from .hf_baseline import hf_generate, transformers_kwargs
from .rewards import fidelity, quality
from .tasks import REFERENCE_TASKS, builtin_examples
from .theory import alpha_from_acceptance, analytic_speedup

DEFAULT_MODES = "ar,exact,static:0.5,dynamic:general"


def parse_modes(spec: str, pair=None) -> dict[str, dict]:
    """'ar,exact,static:0.5,dynamic:general' -> {name: generate kwargs}. Without a pair it only checks the
    spec (weights in [0, 1], heads that exist), which needs no model, and leaves each head as its path."""
    modes = {}
    for name in [m.strip() for m in spec.split(",") if m.strip()]:
        kind, _, arg = name.partition(":")
        if kind in ("ar", "exact") and not arg:
            modes[name] = {"mode": kind}
        elif kind == "static" and arg:
            try:
                w = float(arg)
            except ValueError:
                raise ValueError(f"mode {name!r}: the weight must be a number") from None
            if not 0 <= w <= 1:
                raise ValueError(f"mode {name!r}: the weight must be in [0, 1]")
            modes[name] = {"mode": "static", "ensemble_weight": w}
        elif kind == "dynamic" and arg:
            modes[name] = {
                "mode": "dynamic",
                "head": load_head(arg, pair) if pair is not None else resolve_head_path(arg),
            }
        else:
            raise ValueError(f"unknown mode {name!r}: use ar, exact, static:<w> or dynamic:<head>")
    if "ar" not in modes:
        raise ValueError("the modes must include ar: speedups are measured against it")
    return modes


def run_bench(
    pair,
    examples,
    modes: dict,
    n_draft: int | str = 4,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    vs_transformers: bool = False,
    progress=None,
    candidates=range(1, 7),
) -> dict:
    """n_draft: one draft length for every mode, or "auto" to choose each mode's by measurement."""
    timing_prompt = encode_prompt(pair.tokenizer, examples[0].prompt)
    if n_draft == "auto":
        costs = measure_costs(
            pair, timing_prompt, list(candidates)
        )  # once: the choice and the report share it
        calibration = [e.prompt for e in builtin_examples("general", "train")[:2]]
        choice = choose_n_draft(pair, modes, costs, calibration, max_new_tokens, temperature, seed)
        n_of = {name: choice[name]["n_draft"] if name in choice else 0 for name in modes}
    elif isinstance(n_draft, int) and n_draft >= 1:
        n_of, choice = {name: 0 if kw["mode"] == "ar" else n_draft for name, kw in modes.items()}, {}
        costs = measure_costs(pair, timing_prompt, n_draft)
    else:
        raise ValueError(f"n_draft must be a positive integer or 'auto', not {n_draft!r}")
    # transformers has no EAGLE path: with a feature draft only target-only decoding is compared
    comparable = {
        name: transformers_kwargs(kw) is not None and (kw["mode"] == "ar" or not is_feature_draft(pair.draft))
        for name, kw in modes.items()
    }
    counts = defaultdict(lambda: defaultdict(Counts))  # category -> mode -> summed over its questions
    totals = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))  # category -> mode -> quality sums
    theirs, ours = (
        defaultdict(Counts),
        defaultdict(Counts),
    )  # mode -> transformers' runs and ours, where compared
    greedy_identical = defaultdict(list)
    scores_of = defaultdict(lambda: defaultdict(list))  # category -> mode -> quality per question, in order
    names = list(modes)
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate: no mode always runs first
        for name in order:
            summary, _ = generate(
                pair,
                prompt_ids,
                n_draft=n_of[name] or 1,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed + i,
                **modes[name],
            )
            output_ids = summary.token_ids or [pair.tokenizer.eos_token_id]
            scores = quality(example.task, example, summary.text) if example.task in REFERENCE_TASKS else {}
            fields = {
                "events_s": summary.events_s,
                "fidelity": fidelity(pair, prompt_ids, output_ids),
                "examples": 1,
            }
            if scores:
                fields["quality"] = scores.get("rouge2", scores.get("exact_match"))
                fields["quality_examples"] = 1
                scores_of[example.category][name].append(fields["quality"])
            for category in (example.category, "overall"):
                counts[category][name] += summary.counts
                for key, value in fields.items():
                    totals[category][name][key] += value
            if vs_transformers and comparable[name] and temperature == 0:
                their_ids, seconds = hf_generate(
                    pair, prompt_ids, modes[name], n_of[name] or 1, max_new_tokens
                )
                theirs[name] += Counts(new_tokens=len(their_ids), wall_time_s=seconds)
                ours[name] += summary.counts
                greedy_identical[name].append(their_ids[: len(summary.token_ids)] == summary.token_ids)
            if progress is not None:
                progress()
    report = {
        "settings": {
            "examples": len(examples),
            "n_draft": {k: v for k, v in n_of.items() if v},
            "n_draft_choice": choice,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "threads": torch.get_num_threads(),
            "target": pair.target_name,
            "draft": pair.draft_name,
            "device": str(pair.target.device),
            "dtype": str(pair.target.dtype).removeprefix("torch."),
        },
        "costs": costs,
        "per_category": {},
        "overall": {},
    }
    for category, by_mode in totals.items():
        ar_speed = counts[category]["ar"].tokens_per_second
        table = {}
        for name, t in by_mode.items():
            c = counts[category][name]
            table[name] = {
                "speedup": c.tokens_per_second / ar_speed,
                "tau": c.tau,
                "acceptance_rate": c.acceptance_rate,
                "tokens_per_second": c.tokens_per_second,
                "quality": t["quality"] / t["quality_examples"] if t.get("quality_examples") else None,
                "fidelity": t["fidelity"] / t["examples"],
            }
            if scores_of[category][name]:
                table[name]["quality_scores"] = scores_of[category][name]
        if category == "overall":
            report["overall"] = table
        else:
            report["per_category"][category] = table
    report["bound_efficiency"] = {}
    for name, row in report["overall"].items():
        if row["acceptance_rate"] is not None:
            # accepted/drafted counts drafts after a rejection too: the bound needs per-token α.
            n = n_of[name]
            alpha = alpha_from_acceptance(row["acceptance_rate"], n)
            bound = analytic_speedup(alpha, n, costs["c"], costs["v"][n])
            report["bound_efficiency"][name] = row["speedup"] / bound
            row["analytic_bound"] = bound
    report["vs_transformers"] = {
        name: ours[name].tokens_per_second / theirs[name].tokens_per_second for name in theirs
    }
    report["greedy_text_identical_to_transformers"] = {k: all(v) for k, v in greedy_identical.items()}
    # Streaming's price: the time the loop spent building and yielding token events, over all runs, against
    # the rest of the loop (the bare loop). Timed inside the loop: an A/B of whole runs drowns a fraction of
    # a percent in this machine's ±10% run-to-run noise.
    events_s = sum(t["events_s"] for t in totals["overall"].values())
    seconds = sum(c.wall_time_s for c in counts["overall"].values())
    report["streaming_overhead"] = events_s / (seconds - events_s)
    report["goals"] = goals(report)
    return report


@torch.inference_mode()
def run_batch_bench(
    pair,
    examples,
    modes: dict,
    rows: int,
    n_draft: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    progress=None,
) -> dict:
    """Throughput of `rows` decodes of each question as one batch (how head training decodes a prompt's
    rollouts) against the same decodes one after another, per mode, in one process; which goes first
    alternates between questions. Both run the bare loop (no events)."""
    if not (isinstance(rows, int) and rows >= 2):
        raise ValueError(f"the batch needs at least 2 rows, not {rows!r}")
    sequential, batched = defaultdict(Counts), defaultdict(Counts)
    identical = defaultdict(list)
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        seeds = [seed + i * rows + r for r in range(rows)]
        for name, kwargs in modes.items():
            settings = {"n_draft": n_draft, "max_new_tokens": max_new_tokens, "temperature": temperature}
            outputs = {}
            for how in ("alone", "batch") if i % 2 == 0 else ("batch", "alone"):
                ids = defaultdict(list)
                start = time.perf_counter()
                if how == "batch":
                    for r, step in decode_rows(
                        pair, [Row(prompt_ids, row_seed, **kwargs) for row_seed in seeds], **settings
                    ):
                        ids[r] += step.new_ids
                else:
                    for r in range(rows):
                        for step in decode_steps(pair, prompt_ids, seed=seeds[r], **kwargs, **settings):
                            ids[r] += step.new_ids
                seconds = time.perf_counter() - start
                tokens = sum(len(v) for v in ids.values())
                (batched if how == "batch" else sequential)[name] += Counts(
                    new_tokens=tokens, wall_time_s=seconds
                )
                outputs[how] = [ids[r] for r in range(rows)]
            identical[name] += [a == b for a, b in zip(outputs["alone"], outputs["batch"])]
            if progress is not None:
                progress()
    return {
        "settings": {
            "examples": len(examples),
            "rows": rows,
            "n_draft": n_draft,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "threads": torch.get_num_threads(),
            "target": pair.target_name,
            "draft": pair.draft_name,
            "device": str(pair.target.device),
            "dtype": str(pair.target.dtype).removeprefix("torch."),
        },
        "modes": {
            name: {
                "tokens_per_second_alone": sequential[name].tokens_per_second,
                "tokens_per_second_batch": batched[name].tokens_per_second,
                "batch_over_alone": batched[name].tokens_per_second / sequential[name].tokens_per_second,
                "identical_outputs": sum(identical[name]) / len(identical[name]),
            }
            for name in modes
        },
    }
