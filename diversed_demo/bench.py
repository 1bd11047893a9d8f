"""Spec-Bench: speed and quality of every mode on one pair, in one process, modes interleaved.

For each first-turn question the modes run back to back in a rotating order, so machine drift hits
them alike. Speedup is tokens/s over target-only in the same category. The analytic bound of
speculative decoding, (1 − α^{N+1}) / ((1 − α)(N·c + v)), uses the measured acceptance α, the draft's
cost per token c and the verify pass's cost v, both relative to one target token.
"""
from __future__ import annotations

import copy
import statistics
import time
from collections import defaultdict

import torch

from .attention import stock_attention
from .decode import Counts, Row, decode_rows, decode_steps, encode_prompt, generate
from .draft import CachedLM
from .eagle import Eagle3Draft
from .formatting import fmt
from .head import load_head, resolve_head_path
from .linear import stock_linear
from .rewards import fidelity, quality
from .tasks import REFERENCE_TASKS, builtin_examples
from .theory import alpha_from_acceptance, analytic_speedup, fastest_n_draft

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
            modes[name] = {"mode": "dynamic", "head": load_head(arg, pair) if pair is not None else resolve_head_path(arg)}
        else:
            raise ValueError(f"unknown mode {name!r}: use ar, exact, static:<w> or dynamic:<head>")
    if "ar" not in modes:
        raise ValueError("the modes must include ar: speedups are measured against it")
    return modes


@torch.inference_mode()
def pass_ms(model, prompt_ids: list[int], sizes, calls: int = 16) -> dict[int, float]:
    """{k: median time of a cached forward of k new tokens (with the LM head on all of them)} after one
    prefill of the prompt. The sizes take turns within each call, so a burst of load on a shared machine
    slows them alike instead of one size; the first turn, after the prefill, runs cold and is not timed."""
    lm = CachedLM(model, model.config.get_text_config().vocab_size)
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
    return {k: statistics.median(t) * 1e3 for k, t in times.items()}


def draft_token_ms(pair, prompt_ids: list[int], n_draft: int = 4, max_new_tokens: int = 48) -> float:
    """Drafting time per drafted token inside real (greedy exact) decoding, for either kind of draft:
    it includes what a step's drafting costs besides the draft's forwards (a feature draft's restart from
    the target's features, sampling), which is what the analytic bound's N·c must price."""
    _, events = generate(pair, prompt_ids, mode="exact", n_draft=n_draft, max_new_tokens=max_new_tokens,
                         temperature=0)
    steps = {e.step: (e.draft_ms, e.drafted) for e in events if e.drafted}
    return sum(ms for ms, _ in steps.values()) / max(sum(n for _, n in steps.values()), 1)


def measure_costs(pair, prompt_ids: list[int], n_drafts, rounds: int = 3, calls: int = 16,
                  draft_tokens: int = 48) -> dict:
    """c = draft token ÷ target token; v[N] = target pass over N + 1 tokens ÷ target token (interleaved;
    each a median of `calls` passes, the draft's over a greedy decode of `draft_tokens`)."""
    n_drafts = sorted(set([n_drafts] if isinstance(n_drafts, int) else n_drafts))
    passes, draft = [], []
    for _ in range(rounds):
        passes.append(pass_ms(pair.target, prompt_ids, [1] + [n + 1 for n in n_drafts], calls))
        draft.append(draft_token_ms(pair, prompt_ids, max_new_tokens=draft_tokens))
    t, d = statistics.median(p[1] for p in passes), statistics.median(draft)
    verify_ms = {n: statistics.median(p[n + 1] for p in passes) for n in n_drafts}
    return {"target_ms": t, "draft_ms": d, "c": d / t, "verify_ms": verify_ms,
            "v": {n: ms / t for n, ms in verify_ms.items()}}


def choose_n_draft(pair, modes: dict, costs: dict, prompts: list, max_new_tokens: int, temperature: float,
                   seed: int = 0, probe_n_draft: int = 4) -> dict[str, dict]:
    """Per mode, the draft length that maximises the analytic bound at the acceptance measured on a few
    calibration prompts (the project's own, not the benchmark's) with the measured c and v[N]."""
    chosen = {}
    for name, kwargs in modes.items():
        if kwargs["mode"] == "ar":
            continue
        counts = Counts()
        for i, prompt in enumerate(prompts):
            summary, _ = generate(pair, prompt, n_draft=probe_n_draft, max_new_tokens=max_new_tokens,
                                  temperature=temperature, seed=seed + i, **kwargs)
            counts += summary.counts
        alpha = alpha_from_acceptance(counts.acceptance_rate or 0.0, probe_n_draft)
        bounds = {n: analytic_speedup(alpha, n, costs["c"], v) for n, v in costs["v"].items()}
        chosen[name] = {"n_draft": fastest_n_draft(alpha, costs["c"], costs["v"]), "calibration_alpha": alpha,
                        "bounds": bounds}
    return chosen


def transformers_kwargs(mode_kwargs: dict) -> dict | None:
    """generate() arguments for transformers' equivalent of a mode, or None where it has none: it accepts
    only 0 < w < 1 as an ensemble weight (w = 1 is its plain assisted generation, w = 0 has no
    equivalent), and has no EAGLE path."""
    if mode_kwargs["mode"] == "ar":
        return {}
    if mode_kwargs["mode"] == "exact":
        return {"assisted": True}
    if mode_kwargs["mode"] == "static":
        w = mode_kwargs["ensemble_weight"]
        return {"assisted": True} if w == 1 else {"assisted": True, "assistant_ensemble_weight": w} if 0 < w < 1 else None
    return None


def hf_generate(pair, prompt_ids, mode_kwargs, n_draft, max_new_tokens):
    """transformers' own generate on the same prompt: plain, assisted, or assisted with an ensemble weight,
    on the pair's models with their stock nn.Linear layers and attention (as a transformers user runs them).
    The draft's generation config is set for the call and restored after it."""
    extra = dict(transformers_kwargs(mode_kwargs))
    ids = torch.tensor([prompt_ids], device=pair.target.device)
    kwargs = {"do_sample": False, "max_new_tokens": max_new_tokens, "attention_mask": torch.ones_like(ids)}
    assisted = extra.pop("assisted", False)
    saved_config = pair.draft.generation_config if assisted else None
    if assisted:
        config = copy.deepcopy(saved_config)
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = n_draft, "constant"
        config.assistant_confidence_threshold = 0.0
        pair.draft.generation_config = config
        kwargs["assistant_model"] = pair.draft
        kwargs.update(extra)
    try:
        with stock_linear(pair.target, pair.draft), stock_attention(pair.target, pair.draft):
            start = time.perf_counter()
            out = pair.target.generate(ids, **kwargs)
            seconds = time.perf_counter() - start
    finally:
        if assisted:
            pair.draft.generation_config = saved_config
    return out[0, len(prompt_ids):].tolist(), seconds


def run_bench(pair, examples, modes: dict, n_draft: int | str = 4, max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0, vs_transformers: bool = False, progress=None, candidates=range(1, 7)) -> dict:
    """n_draft: one draft length for every mode, or "auto" to choose each mode's by measurement."""
    timing_prompt = encode_prompt(pair.tokenizer, examples[0].prompt)
    if n_draft == "auto":
        costs = measure_costs(pair, timing_prompt, list(candidates))  # once: the choice and the report share it
        calibration = [e.prompt for e in builtin_examples("general", "train")[:2]]
        choice = choose_n_draft(pair, modes, costs, calibration, max_new_tokens, temperature, seed)
        n_of = {name: choice[name]["n_draft"] if name in choice else 0 for name in modes}
    elif isinstance(n_draft, int) and n_draft >= 1:
        n_of, choice = {name: 0 if kw["mode"] == "ar" else n_draft for name, kw in modes.items()}, {}
        costs = measure_costs(pair, timing_prompt, n_draft)
    else:
        raise ValueError(f"n_draft must be a positive integer or 'auto', not {n_draft!r}")
    # transformers has no EAGLE path: with a feature draft only target-only decoding is compared
    comparable = {name: transformers_kwargs(kw) is not None and (kw["mode"] == "ar" or not isinstance(pair.draft, Eagle3Draft))
                  for name, kw in modes.items()}
    counts = defaultdict(lambda: defaultdict(Counts))  # category -> mode -> summed over its questions
    totals = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))  # category -> mode -> quality sums
    theirs, ours = defaultdict(Counts), defaultdict(Counts)  # mode -> transformers' runs and ours, where compared
    greedy_identical = defaultdict(list)
    scores_of = defaultdict(lambda: defaultdict(list))  # category -> mode -> quality per question, in order
    names = list(modes)
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        order = names[i % len(names):] + names[:i % len(names)]  # rotate: no mode always runs first
        for name in order:
            summary, _ = generate(pair, prompt_ids, n_draft=n_of[name] or 1, max_new_tokens=max_new_tokens,
                                  temperature=temperature, seed=seed + i, **modes[name])
            output_ids = summary.token_ids or [pair.tokenizer.eos_token_id]
            scores = quality(example.task, example, summary.text) if example.task in REFERENCE_TASKS else {}
            fields = {"events_s": summary.events_s, "fidelity": fidelity(pair, prompt_ids, output_ids), "examples": 1}
            if scores:
                fields["quality"] = scores.get("rouge2", scores.get("exact_match"))
                fields["quality_examples"] = 1
                scores_of[example.category][name].append(fields["quality"])
            for category in (example.category, "overall"):
                counts[category][name] += summary.counts
                for key, value in fields.items():
                    totals[category][name][key] += value
            if vs_transformers and comparable[name] and temperature == 0:
                their_ids, seconds = hf_generate(pair, prompt_ids, modes[name], n_of[name] or 1, max_new_tokens)
                theirs[name] += Counts(new_tokens=len(their_ids), wall_time_s=seconds)
                ours[name] += summary.counts
                greedy_identical[name].append(their_ids[:len(summary.token_ids)] == summary.token_ids)
            if progress is not None:
                progress()
    report = {"settings": {"examples": len(examples), "n_draft": {k: v for k, v in n_of.items() if v},
                           "n_draft_choice": choice, "max_new_tokens": max_new_tokens,
                           "temperature": temperature, "seed": seed, "threads": torch.get_num_threads(),
                           "target": pair.target_name, "draft": pair.draft_name, "device": str(pair.target.device),
                           "dtype": str(pair.target.dtype).removeprefix("torch.")},
              "costs": costs, "per_category": {}, "overall": {}}
    for category, by_mode in totals.items():
        ar_speed = counts[category]["ar"].tokens_per_second
        table = {}
        for name, t in by_mode.items():
            c = counts[category][name]
            table[name] = {"speedup": c.tokens_per_second / ar_speed, "tau": c.tau, "acceptance_rate": c.acceptance_rate,
                           "tokens_per_second": c.tokens_per_second,
                           "quality": t["quality"] / t["quality_examples"] if t.get("quality_examples") else None,
                           "fidelity": t["fidelity"] / t["examples"]}
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
    report["vs_transformers"] = {name: ours[name].tokens_per_second / theirs[name].tokens_per_second for name in theirs}
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
def run_batch_bench(pair, examples, modes: dict, rows: int, n_draft: int = 4, max_new_tokens: int = 64,
                    temperature: float = 1.0, seed: int = 0, progress=None) -> dict:
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
            for how in (("alone", "batch") if i % 2 == 0 else ("batch", "alone")):
                ids = defaultdict(list)
                start = time.perf_counter()
                if how == "batch":
                    for r, step in decode_rows(pair, [Row(prompt_ids, row_seed, **kwargs) for row_seed in seeds], **settings):
                        ids[r] += step.new_ids
                else:
                    for r in range(rows):
                        for step in decode_steps(pair, prompt_ids, seed=seeds[r], **kwargs, **settings):
                            ids[r] += step.new_ids
                seconds = time.perf_counter() - start
                tokens = sum(len(v) for v in ids.values())
                (batched if how == "batch" else sequential)[name] += Counts(new_tokens=tokens, wall_time_s=seconds)
                outputs[how] = [ids[r] for r in range(rows)]
            identical[name] += [a == b for a, b in zip(outputs["alone"], outputs["batch"])]
            if progress is not None:
                progress()
    return {"settings": {"examples": len(examples), "rows": rows, "n_draft": n_draft, "max_new_tokens": max_new_tokens,
                         "temperature": temperature, "seed": seed, "threads": torch.get_num_threads(),
                         "target": pair.target_name, "draft": pair.draft_name, "device": str(pair.target.device),
                         "dtype": str(pair.target.dtype).removeprefix("torch.")},
            "modes": {name: {"tokens_per_second_alone": sequential[name].tokens_per_second,
                             "tokens_per_second_batch": batched[name].tokens_per_second,
                             "batch_over_alone": batched[name].tokens_per_second / sequential[name].tokens_per_second,
                             "identical_outputs": sum(identical[name]) / len(identical[name])}
                      for name in modes}}


def batch_markdown(report: dict) -> str:
    s = report["settings"]
    lines = ["| mode | tokens/s, one after another | tokens/s, one batch | batch ÷ one after another | rows identical |",
             "|---|---|---|---|---|"]
    for name, row in report["modes"].items():
        lines.append(f"| {name} | {row['tokens_per_second_alone']:.1f} | {row['tokens_per_second_batch']:.1f} | "
                     f"{row['batch_over_alone']:.2f}× | {row['identical_outputs']:.0%} |")
    lines.append(f"\n{s['rows']} decodes of each of {s['examples']} questions, N = {s['n_draft']}, ≤{s['max_new_tokens']} "
                 f"new tokens, T = {s['temperature']:g}, {s['dtype']}, {s['threads']} threads on {s['device']}.")
    return "\n".join(lines)


def relative_change(value, reference):
    if value is None or reference is None or reference == 0:
        return None
    return (value - reference) / abs(reference)


def paired_change(scores, exact_scores):
    """Relative change of the mean quality against exact, and its standard error from the per-question
    differences (the same questions ran in both modes). (None, None) where exact scores 0 everywhere."""
    if scores == exact_scores:
        return 0.0, 0.0
    reference = sum(exact_scores) / len(exact_scores)
    if not reference:
        return None, None
    diffs = [a - b for a, b in zip(scores, exact_scores)]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    return sum(diffs) / len(diffs) / abs(reference), se and se / abs(reference)


def goals(report: dict) -> dict:
    """Where each performance goal of the bench stands, from this report's own figures.

    Quality is compared per referenced category (ROUGE-2 and exact match are different scales, so the
    overall mean that pools them is not a quality): the DIVERSED goal needs every one within 5% of exact.
    Each change comes with its standard error over questions, which says whether the run can tell.
    """
    overall, result = report["overall"], {"diversed": {}}
    exact = overall.get("exact")
    referenced = {category: table for category, table in report["per_category"].items()
                  if table.get("exact", {}).get("quality_scores")}
    for name, row in overall.items():
        if name.startswith(("static:", "dynamic:")):
            changes = {category: paired_change(table[name]["quality_scores"], table["exact"]["quality_scores"])
                       for category, table in referenced.items()}
            known = [change for change, _ in changes.values() if change is not None]
            result["diversed"][name] = {
                "speedup": row["speedup"],
                "quality_vs_exact": {category: change for category, (change, _) in changes.items()},
                "quality_vs_exact_se": {category: se for category, (_, se) in changes.items()},
                "fidelity_vs_exact": relative_change(row["fidelity"], exact and exact["fidelity"]),
                "met": row["speedup"] >= 1.5 and bool(known) and len(known) == len(changes) and min(known) >= -0.05}
    if "exact" in report["vs_transformers"]:
        result["exact_vs_transformers"] = {
            "ratio": report["vs_transformers"]["exact"],
            "met": report["vs_transformers"]["exact"] >= 1.3 and report["greedy_text_identical_to_transformers"]["exact"]}
    if report["bound_efficiency"]:
        result["bound_efficiency"] = {"min": min(report["bound_efficiency"].values()),
                                      "met": min(report["bound_efficiency"].values()) >= 0.8}
    if "streaming_overhead" in report:
        result["streaming"] = {"overhead": report["streaming_overhead"], "met": report["streaming_overhead"] <= 0.05}
    return result


def markdown_table(report: dict) -> str:
    def cell(value, spec=".2f"):
        return fmt(value, spec, missing="–")
    modes = list(report["overall"])
    lines = ["| category | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for category, table in [*sorted(report["per_category"].items()), ("**overall**", report["overall"])]:
        cells = []
        for m in modes:
            r = table.get(m)
            cells.append("–" if r is None else
                         f"{cell(r['speedup'])}× · τ {cell(r['tau'])} · α {cell(r['acceptance_rate'])}"
                         + (f" · q {cell(r['quality'], '.3f')}" if r["quality"] is not None else "")
                         + f" · fid {cell(r['fidelity'])}")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    s = report["settings"]
    c = report["costs"]
    lines += ["", "Cells: speedup over ar (tokens/s) · τ tokens per target pass · α acceptance · q quality "
              "(ROUGE-2 for summarization, exact match for math_reasoning) · fid mean target log-prob.",
              f"{s['examples']} questions, ≤{s['max_new_tokens']} new tokens, temperature {s['temperature']}, "
              f"{s['dtype']}, {s['threads']} threads on {s['device']}; n_draft "
              + ", ".join(f"{m} {n}" for m, n in s["n_draft"].items())
              + (" (chosen by measurement)" if s.get("n_draft_choice") else "")
              + f"; c = {c['c']:.3f}, v = " + ", ".join(f"{v:.3f} (N={n})" for n, v in c["v"].items()) + ".",
              "", "| mode | analytic bound | achieved ÷ bound | ours ÷ transformers | greedy text identical |",
              "|---|---|---|---|---|"]
    for m in modes:
        row = report["overall"][m]
        lines.append(f"| {m} | {cell(row.get('analytic_bound'))} | {cell(report['bound_efficiency'].get(m))} | "
                     f"{cell(report['vs_transformers'].get(m))} | "
                     f"{report['greedy_text_identical_to_transformers'].get(m, '–')} |")
    if "streaming_overhead" in report:
        lines.append(f"\nStreaming token events costs {100 * report['streaming_overhead']:+.2f}% against the bare loop "
                     "(time spent building and yielding events, over all runs).")
    g = report.get("goals", {})
    if g.get("diversed"):
        lines += ["", "| DIVERSED mode | speedup (goal ≥ 1.5×) | quality vs exact, per referenced category "
                  "(± standard error; goal ≥ −5% each) | fidelity vs exact | met |", "|---|---|---|---|---|"]
        for m, row in g["diversed"].items():
            quality = ", ".join(f"{c} {cell(v, '+.1%')}" + (f" ± {se:.0%}" if se else "")
                                for (c, v), se in zip(row["quality_vs_exact"].items(),
                                                      row["quality_vs_exact_se"].values())) or "–"
            lines.append(f"| {m} | {cell(row['speedup'])}× | {quality} | {cell(row['fidelity_vs_exact'], '+.1%')} | "
                         f"{row['met']} |")
    return "\n".join(lines)


def bench_figure(report: dict):
    import plotly.graph_objects as go
    categories = sorted(report["per_category"]) + ["overall"]
    fig = go.Figure()
    for mode in report["overall"]:
        if mode == "ar":
            continue
        fig.add_trace(go.Bar(name=mode, x=categories,
                             y=[(report["per_category"].get(c) or report["overall"]).get(mode, {}).get("speedup")
                                if c != "overall" else report["overall"][mode]["speedup"] for c in categories]))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="target only")
    fig.update_layout(barmode="group", title="Spec-Bench speedup over target-only", yaxis_title="speedup (×)",
                      template="plotly_white")
    return fig
