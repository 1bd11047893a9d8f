"""The paper-style results table: per task and temperature, exact speculative decoding against DIVERSED
with the task's head, and both against target-only decoding, on one held-out set in one run.

Per held-out example the three modes run back to back in a rotating order with the same seed, so
machine drift hits them alike and quality differences are paired: the standard error of DIVERSED − exact
comes from the per-example differences. Quality is the task's own reward (`rewards.task_reward`).
"""

from __future__ import annotations

import statistics

import torch

from ..common.formatting import fmt
from ..core.config import DecodeConfig
from ..core.generate import generate
from ..core.prompt import encode_prompt
from ..core.stats import Counts
from .held_out import HELD_OUT, held_out_examples, held_out_set
from .margins import mean_and_se
from .rewards import QUALITY_LABEL, task_reward


def parse_sets(spec: str) -> list[tuple[str, str]]:
    """'summarization,math:arithmetic,code' -> [(task, held-out set)], each checked against HELD_OUT."""
    sets = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        task, _, set_name = item.partition(":")
        sets.append((task, held_out_set(task, set_name or None)))
    if not sets:
        raise ValueError(f"no held-out sets in {spec!r}; e.g. summarization,math:arithmetic,code,general")
    return sets


def parse_temperatures(spec: str) -> list[float]:
    try:
        temperatures = [float(t) for t in spec.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, not {spec!r}") from None
    if not temperatures or any(t < 0 for t in temperatures):
        raise ValueError(f"--temperatures must be numbers ≥ 0 (0 = greedy), not {spec!r}")
    return temperatures


def table_row(
    pair,
    task: str,
    set_name: str,
    examples,
    head_name: str,
    head,
    decoding: DecodeConfig,
    progress=None,
) -> dict:
    """One row: the three modes on every example, by `decoding` (N, length, temperature, first seed), with
    acceptance, paired quality and speedup."""
    temperature = decoding.temperature
    modes = {
        "ar": decoding.replace(mode="ar"),
        "exact": decoding.replace(mode="exact"),
        "diversed": decoding.replace(mode="dynamic", head=head),
    }
    counts, scores, mean_w = decode_modes(pair, task, examples, modes, progress)
    quality = {name: mean_and_se(values) for name, values in scores.items()}
    difference = mean_and_se([d - e for d, e in zip(scores["diversed"], scores["exact"])])
    ar_speed = counts["ar"].tokens_per_second
    return {
        "task": task,
        "set": set_name,
        "held_out": HELD_OUT[task][set_name],
        "temperature": temperature,
        "examples": len(examples),
        "head": head_name,
        "quality_metric": QUALITY_LABEL[task],
        "acceptance": {name: counts[name].acceptance_rate for name in ("exact", "diversed")},
        "tau": {name: counts[name].tau for name in ("exact", "diversed")},
        "quality": {name: {"mean": m, "se": se} for name, (m, se) in quality.items()},
        "quality_difference": {"mean": difference[0], "se": difference[1]},
        "speedup": {name: counts[name].tokens_per_second / ar_speed for name in ("exact", "diversed")},
        "target_only_tokens_per_second": ar_speed,
        "mean_w": statistics.fmean(mean_w) if mean_w else None,
    }


def decode_modes(pair, task, examples, modes: dict[str, DecodeConfig], progress):
    """({mode: Counts}, {mode: reward per example}, the diversed decodes' mean w) over every example, the
    i-th at seed + i."""
    names = list(modes)
    counts = {name: Counts() for name in modes}
    scores = {name: [] for name in modes}
    mean_w = []
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        for name in names[i % 3 :] + names[: i % 3]:  # rotate: no mode always runs first
            summary, _ = generate(pair, prompt_ids, modes[name].replace(seed=modes[name].seed + i))
            counts[name] += summary.counts
            output_ids = summary.token_ids or [pair.tokenizer.eos_token_id]
            scores[name].append(
                task_reward(
                    task, example, summary.text, pair=pair, prompt_ids=prompt_ids, output_ids=output_ids
                )
            )
            if name == "diversed" and summary.mean_w is not None:
                mean_w.append(summary.mean_w)
            if progress is not None:
                progress()
    return counts, scores, mean_w


def results_table(
    pair,
    sets: list[tuple[str, str]],
    heads: dict,
    temperatures: list[float],
    limit: int | None,
    n_draft: int = 4,
    max_new_tokens: int = 64,
    seed: int = 0,
    data: dict | None = None,
    progress=None,
    greedy_heads: dict | None = None,
) -> dict:
    """Every (task, set) at every temperature; heads maps each task to (its head's name, the loaded head),
    greedy_heads those tasks that have a head trained for greedy decoding, used at T = 0."""
    rows = []
    for task, set_name in sets:
        examples = held_out_examples(task, limit, (data or {}).get(set_name), set_name)
        for temperature in temperatures:
            name, head = (greedy_heads or {}).get(task, heads[task]) if temperature == 0 else heads[task]
            decoding = DecodeConfig(
                n_draft=n_draft, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
            )
            rows.append(table_row(pair, task, set_name, examples, name, head, decoding, progress))
    return {
        "settings": {
            "n_draft": n_draft,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "limit": limit,
            "target": pair.target_name,
            "draft": pair.draft_name,
            "device": str(pair.target.device),
            "dtype": str(pair.target.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
        },
        "rows": rows,
    }


def markdown(report: dict) -> str:
    """The table as Markdown, with a line of settings under it."""
    lines = [
        "| task (held-out set) | T | n | acceptance exact → DIVERSED | quality exact | quality DIVERSED | "
        "DIVERSED − exact | speedup exact | speedup DIVERSED | mean w_t |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def with_se(q, spec=".3f"):
        return fmt(q["mean"], spec) + (f" ± {fmt(q['se'], '.3f')}" if q["se"] is not None else "")

    for r in report["rows"]:
        temperature = "greedy" if r["temperature"] == 0 else fmt(r["temperature"], "g")
        lines.append(
            f"| {r['task']} ({r['set']}; {r['quality_metric']}) | {temperature} "
            f"| {r['examples']} | {fmt(r['acceptance']['exact'])} → {fmt(r['acceptance']['diversed'])} "
            f"| {with_se(r['quality']['exact'])} | {with_se(r['quality']['diversed'])} "
            f"| {with_se(r['quality_difference'], '+.3f')} | {fmt(r['speedup']['exact'])}× "
            f"| {fmt(r['speedup']['diversed'])}× | {fmt(r['mean_w'])} |"
        )
    s = report["settings"]
    lines += [
        "",
        f"Quality ± standard error over examples; DIVERSED − exact is paired (same examples and seeds). "
        "Speedup: tokens/s over target-only decoding of the same examples in the same run. "
        f"N = {s['n_draft']}, ≤{s['max_new_tokens']} new tokens, {s['dtype']}, {s['threads']} threads "
        f"on {s['device']}.",
    ]
    return "\n".join(lines)
