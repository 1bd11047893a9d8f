"""The bench's report: speedups, analytic bounds and goals from what bench.py measured, and the report as
Markdown tables and a plotly figure."""

from __future__ import annotations

import statistics

from ..common.formatting import fmt
from ..runtime.dtype_choice import choice_note
from ..runtime.theory import alpha_from_acceptance, analytic_speedup, wall_bound

# The bench's goals: whether each is met goes in the --json report only, never in its Markdown or the app.
RELAXED_SPEEDUP_GOAL = 1.5  # a relaxed mode's speed-up over target-only
QUALITY_LOSS_GOAL = 0.05  # the most a relaxed mode's quality may lose, relative to exact SD's, in a category
EXACT_VS_TRANSFORMERS_GOAL = 1.3  # our exact SD over transformers' exact SD, with the same greedy text
BOUND_EFFICIENCY_GOAL = 0.8  # every mode's achieved speed-up over its analytic bound
STREAMING_OVERHEAD_GOAL = 0.05  # token events' share of the bare loop's time


def report(settings: dict, costs: dict, runs, n_of: dict, limit: dict | None = None) -> dict:
    """The --json report of a bench: per category (and overall) and mode, speed and quality; the bound and
    how much of it each mode reaches; the comparison with transformers; the memory-bandwidth limit;
    streaming's price; the goals. `runs` is a bench.BenchRuns, `n_of` each mode's draft length, `limit`
    the target-only speed limit (costs.memory_limit)."""
    result = {"settings": settings, "costs": costs, "per_category": {}, "overall": {}}
    for category, by_mode in runs.totals.items():
        table = mode_table(runs, category, by_mode)
        if category == "overall":
            result["overall"] = table
        else:
            result["per_category"][category] = table
    result["prompt_share"] = prompt_share(runs)
    lengths = length_ratios(runs)
    result["bound_efficiency"] = bound_efficiency(
        result["overall"], n_of, costs, result["prompt_share"], lengths
    )
    result["vs_transformers"] = {
        name: runs.ours[name].tokens_per_second / runs.theirs[name].tokens_per_second for name in runs.theirs
    }
    result["greedy_text_identical_to_transformers"] = {k: all(v) for k, v in runs.greedy_identical.items()}
    if "ar" in runs.theirs and "exact" in result["overall"]:
        theirs = runs.theirs["ar"].tokens_per_second
        result["exact_vs_transformers_target_only"] = result["overall"]["exact"]["tokens_per_second"] / theirs
    if runs.llama_cpp.new_tokens:
        result["llama_cpp"] = llama_cpp_figures(result["overall"], runs)
    if settings.get("temperature") == 0 and "ar" in runs.outputs:
        result["greedy_identical_to_target_only"] = identical_to_target_only(runs.outputs)
    if limit:
        achieved = result["overall"].get("ar", {}).get("tokens_per_second")
        result["memory_limit"] = {
            **limit,
            "target_only_share": achieved and achieved / limit["tokens_per_second"],
        }
    result["streaming_overhead"] = streaming_overhead(runs)
    result["step_breakdown"] = step_breakdown(runs)
    result["goals"] = goals(result)
    return result


def llama_cpp_figures(overall: dict, runs) -> dict:
    """llama.cpp's target-only tokens/s on the same GGUF and questions, ours ÷ it per mode, and how often its
    greedy text equals our target-only's."""
    theirs = runs.llama_cpp.tokens_per_second
    return {
        "tokens_per_second": theirs,
        "ours_vs_llama_cpp": {name: row["tokens_per_second"] / theirs for name, row in overall.items()},
        "greedy_identical_to_our_target_only": sum(runs.llama_cpp_identical) / len(runs.llama_cpp_identical),
    }


def identical_to_target_only(outputs: dict) -> dict:
    """{mode: share of questions whose greedy output equals target-only's, token for token}."""
    reference = outputs["ar"]
    return {
        name: sum(a == b for a, b in zip(ids, reference)) / len(reference)
        for name, ids in outputs.items()
        if name != "ar"
    }


def mode_table(runs, category: str, by_mode: dict) -> dict:
    """{mode: speedup over ar, τ, acceptance, tokens/s, mean quality, mean fidelity} of one category."""
    ar_speed = runs.counts[category]["ar"].tokens_per_second
    table = {}
    for name, t in by_mode.items():
        c = runs.counts[category][name]
        table[name] = {
            "speedup": c.tokens_per_second / ar_speed,
            "tau": c.tau,
            "acceptance_rate": c.acceptance_rate,
            "verified_acceptance": c.verified_acceptance,
            "drafted_per_step": c.drafted / c.target_passes if c.target_passes else None,
            "tokens_per_second": c.tokens_per_second,
            "new_tokens": c.new_tokens,
            "quality": t["quality"] / t["quality_examples"] if t.get("quality_examples") else None,
            "fidelity": t["fidelity"] / t["examples"],
        }
        if runs.scores[category][name]:
            table[name]["quality_scores"] = runs.scores[category][name]
        table[name]["fidelity_scores"] = runs.fidelities[category][name]
    return table


def bound_efficiency(
    overall: dict, n_of: dict, costs: dict, prompt_share: float = 0.0, lengths: dict | None = None
) -> dict:
    """{mode: achieved speedup ÷ analytic bound}. Each drafting mode's row gets its "step_bound",
    (1 − α^{N+1}) / ((1 − α)(r + N·c + v)) at the measured acceptance α, draft costs c and r and verify cost
    v[N] (for a length chosen step by step, "auto", the best fixed N's bound at the per-token acceptance
    verified), and its "analytic_bound", the wall-clock speed-up that allows where the prompts' passes,
    `prompt_share` of target-only's time, cost every mode the same (`theory.wall_bound`, at the mode's
    tokens ÷ target-only's, `lengths`: a mode whose texts end sooner spreads them over fewer tokens)."""
    efficiency, r, lengths = {}, costs.get("r", 0.0), lengths or {}
    for name, row in overall.items():
        if row["acceptance_rate"] is None:
            continue
        n = n_of[name]
        if n == "auto":
            alpha = row["verified_acceptance"] or 0.0
            bound = max(analytic_speedup(alpha, m, costs["c"], v, r) for m, v in costs["v"].items())
        else:  # accepted/drafted counts drafts after a rejection too: the bound needs per-token α
            alpha = alpha_from_acceptance(row["acceptance_rate"], n)
            bound = analytic_speedup(alpha, n, costs["c"], costs["v"][n], r)
        row["step_bound"] = bound
        row["analytic_bound"] = wall_bound(bound, prompt_share, lengths.get(name, 1.0))
        efficiency[name] = row["speedup"] / row["analytic_bound"]
    return efficiency


def prompt_share(runs) -> float:
    """The share of target-only's time spent in the prompts' passes (0 without a target-only run)."""
    if "ar" not in runs.totals["overall"]:
        return 0.0
    wall = runs.counts["overall"]["ar"].wall_time_s
    return runs.totals["overall"]["ar"]["prompt_s"] / wall if wall else 0.0


def length_ratios(runs) -> dict[str, float]:
    """{mode: its tokens ÷ target-only's over the bench} (empty without a target-only run)."""
    counts = runs.counts["overall"]
    if "ar" not in counts or not counts["ar"].new_tokens:
        return {}
    return {name: c.new_tokens / counts["ar"].new_tokens for name, c in counts.items()}


# What a step's time is spent on, as the loop times it: the prompt's pass is spread over the decode's steps.
STEP_PARTS = ("prompt", "draft", "pass", "decide", "events")


def step_breakdown(runs) -> dict:
    """{mode: ms per step of each part}: the prompt's pass, proposing (the draft's steps, sampling, the
    length rule), the target's pass over the step's tokens, the decision (probabilities, w_t,
    verification), the token events, and the rest of the loop (bookkeeping, cache rollback, Python), over
    every run."""
    breakdown = {}
    for name, totals in runs.totals["overall"].items():
        counts = runs.counts["overall"][name]
        steps = max(counts.target_passes, 1)
        parts = {part: totals[f"{part}_s"] * 1e3 / steps for part in STEP_PARTS}
        parts["loop"] = counts.wall_time_s * 1e3 / steps - sum(parts.values())
        breakdown[name] = parts
    return breakdown


def streaming_overhead(runs) -> float:
    """Streaming's price: the time the loop spent building and yielding token events, over all runs,
    against the rest of the loop (the bare loop)."""
    # Timed inside the loop: an A/B of whole runs drowns a fraction of a percent in run-to-run noise.
    events_s = sum(t["events_s"] for t in runs.totals["overall"].values())
    seconds = sum(c.wall_time_s for c in runs.counts["overall"].values())
    return events_s / (seconds - events_s)


def batch_report(settings: dict, modes: list, alone: dict, batched: dict, identical: dict) -> dict:
    """The --json report of a batch bench: per mode, tokens/s one after another and as one batch."""
    return {
        "settings": settings,
        "modes": {
            name: {
                "tokens_per_second_alone": alone[name].tokens_per_second,
                "tokens_per_second_batch": batched[name].tokens_per_second,
                "batch_over_alone": batched[name].tokens_per_second / alone[name].tokens_per_second,
                "identical_outputs": sum(identical[name]) / len(identical[name]),
            }
            for name in modes
        },
    }


def batch_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        "| mode | tokens/s, one after another | tokens/s, one batch | batch ÷ one after another "
        "| rows identical |",
        "|---|---|---|---|---|",
    ]
    for name, row in report["modes"].items():
        lines.append(
            f"| {name} | {row['tokens_per_second_alone']:.1f} | {row['tokens_per_second_batch']:.1f} | "
            f"{row['batch_over_alone']:.2f}× | {row['identical_outputs']:.0%} |"
        )
    lines.append(
        f"\n{s['rows']} decodes of each of {s['examples']} questions, N = {s['n_draft']}, "
        f"≤{s['max_new_tokens']} new tokens, T = {s['temperature']:g}, {s['dtype']}, {where(s)}."
    )
    return "\n".join(lines)


def bench_markdown(report: dict) -> str:
    """The Markdown table of either report: a batch bench's (`batch_report`) or a bench's (`report`)."""
    return batch_markdown(report) if "modes" in report else markdown_table(report)


def goals(report: dict) -> dict:
    """Where each performance goal of the bench stands, from this report's own figures.

    Quality is compared per referenced category (ROUGE-2 and exact match are different scales, so the
    overall mean that pools them is not a quality): the DIVERSED goal needs every one within
    QUALITY_LOSS_GOAL of exact. Each change comes with its standard error over questions, which says
    whether the run can tell.
    """
    result = {"diversed": diversed_goals(report)}
    if "exact" in report["vs_transformers"]:
        result["exact_vs_transformers"] = {
            "ratio": report["vs_transformers"]["exact"],
            "met": report["vs_transformers"]["exact"] >= EXACT_VS_TRANSFORMERS_GOAL
            and report["greedy_text_identical_to_transformers"]["exact"],
        }
    if report["bound_efficiency"]:
        result["bound_efficiency"] = {
            "min": min(report["bound_efficiency"].values()),
            "met": min(report["bound_efficiency"].values()) >= BOUND_EFFICIENCY_GOAL,
        }
    if "streaming_overhead" in report:
        result["streaming"] = {
            "overhead": report["streaming_overhead"],
            "met": report["streaming_overhead"] <= STREAMING_OVERHEAD_GOAL,
        }
    return result


def diversed_goals(report: dict) -> dict:
    """Per relaxed mode: speedup ≥ RELAXED_SPEEDUP_GOAL and quality within QUALITY_LOSS_GOAL of exact in every
    referenced category."""
    overall, result = report["overall"], {}
    exact = overall.get("exact")
    referenced = {
        category: table
        for category, table in report["per_category"].items()
        if table.get("exact", {}).get("quality_scores")
    }
    for name, row in overall.items():
        if name.startswith(("static:", "dynamic:")):
            changes = {
                category: paired_change(table[name]["quality_scores"], table["exact"]["quality_scores"])
                for category, table in referenced.items()
            }
            known = [change for change, _ in changes.values() if change is not None]
            result[name] = {
                "speedup": row["speedup"],
                "quality_vs_exact": {category: change for category, (change, _) in changes.items()},
                "quality_vs_exact_se": {category: se for category, (_, se) in changes.items()},
                "fidelity_vs_exact": relative_change(row["fidelity"], exact and exact["fidelity"]),
                "met": row["speedup"] >= RELAXED_SPEEDUP_GOAL
                and bool(known)
                and len(known) == len(changes)
                and min(known) >= -QUALITY_LOSS_GOAL,
            }
    return result


def cell(value, spec=".2f") -> str:
    return fmt(value, spec, missing="–")


def breakdown_lines(report: dict) -> list[str]:
    """Where a step's time goes, per mode (`step_breakdown`), in ms, with the drafts a step proposed."""
    parts = (*STEP_PARTS, "loop")
    lines = [
        "\n| mode | drafted a step | " + " | ".join(f"{part} ms" for part in parts) + " | step ms |",
        "|---|---" + "|---" * (len(parts) + 1) + "|",
    ]
    for name, times in report["step_breakdown"].items():
        drafted = report["overall"][name].get("drafted_per_step")
        cells = " | ".join(f"{times[part]:.2f}" for part in parts)
        shown = "–" if not drafted else f"{drafted:.2f}"
        lines.append(f"| {name} | {shown} | {cells} | {sum(times.values()):.2f} |")
    return lines


def markdown_table(report: dict) -> str:
    """The bench report as Markdown: a cell per category and mode, the settings, each mode against its
    analytic bound and transformers, streaming's price, and each relaxed mode against exact SD."""
    modes = list(report["overall"])
    lines = category_rows(report, modes) + ["", *settings_lines(report), "", *bound_rows(report, modes)]
    lines += ["", *limit_lines(report)]
    if report.get("step_breakdown"):
        lines += breakdown_lines(report)
    if "streaming_overhead" in report:
        lines.append(
            f"\nStreaming token events costs {100 * report['streaming_overhead']:+.2f}% against the bare "
            "loop (time spent building and yielding events, over all runs)."
        )
    diversed = report.get("goals", {}).get("diversed")
    if diversed:
        lines += ["", *versus_exact_rows(diversed)]
    return "\n".join(lines)


def limit_lines(report: dict) -> list[str]:
    """The memory-bandwidth limit, transformers' target-only speed, and greedy outputs against target-only."""
    lines = []
    limit = report.get("memory_limit")
    if limit:
        share = limit["target_only_share"]
        mb, gbs = limit["weight_bytes"] / 1e6, limit["copy_bytes_per_second"] / 1e9
        lines.append(
            f"Memory-bandwidth limit of target-only decoding: {limit['tokens_per_second']:.1f} tokens/s "
            f"({mb:.0f} MB of weights per token ÷ {gbs:.1f} GB/s by a copy); target-only reaches "
            f"{cell(share)} of it."
        )
    if "exact_vs_transformers_target_only" in report:
        lines.append(
            f"Our exact SD ÷ transformers' generate (target only, same model and dtype): "
            f"{report['exact_vs_transformers_target_only']:.2f}×."
        )
    peer = report.get("llama_cpp")
    if peer:
        ratios = ", ".join(f"{m} {ratio:.2f}×" for m, ratio in peer["ours_vs_llama_cpp"].items())
        lines.append(
            f"llama.cpp, target only on the same GGUF and questions: {peer['tokens_per_second']:.1f} "
            f"tokens/s; ours ÷ llama.cpp: {ratios} (its greedy text equals our target-only's on "
            f"{peer['greedy_identical_to_our_target_only']:.0%})."
        )
    identical = report.get("greedy_identical_to_target_only")
    if identical:
        lines.append(
            "Greedy outputs identical to target-only, token for token: "
            + ", ".join(f"{m} {share:.0%}" for m, share in identical.items())
            + "."
        )
    return lines


def category_rows(report: dict, modes: list) -> list[str]:
    lines = ["| category | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for category, table in [*sorted(report["per_category"].items()), ("**overall**", report["overall"])]:
        cells = []
        for m in modes:
            r = table.get(m)
            cells.append(
                "–"
                if r is None
                else f"{cell(r['speedup'])}× · τ {cell(r['tau'])} · α {cell(r['acceptance_rate'])}"
                + (f" · q {cell(r['quality'], '.3f')}" if r["quality"] is not None else "")
                + f" · fid {cell(r['fidelity'])}"
            )
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return lines


def where(settings: dict) -> str:
    """How a report names its machine: "2 threads on cpu (AMD EPYC)", or the accelerator (host threads only
    feed it)."""
    name = settings.get("device_name")
    named = f" ({name})" if name else ""
    if settings["device"].startswith("cpu"):
        return f"{settings['threads']} threads on {settings['device']}{named}"
    return f"on {settings['device']}{named}"


def settings_lines(report: dict) -> list[str]:
    s, c = report["settings"], report["costs"]
    dtype = [f"dtype {choice_note(s['dtype_choice'])}."] if s.get("dtype_choice") else []
    return (
        dtype
        + [
            "Cells: speedup over ar (tokens/s) · τ tokens per target pass · α acceptance · q quality "
            "(ROUGE-2 for summarization, exact match for math_reasoning) · fid mean target log-prob.",
            f"{s['examples']} questions, ≤{s['max_new_tokens']} new tokens, temperature {s['temperature']}, "
            f"{s['dtype']}, {where(s)}; n_draft "
            + ", ".join(f"{m} {n}" for m, n in s["n_draft"].items())
            + (" (auto: chosen step by step)" if "auto" in s["n_draft"].values() else "")
            + f"; c = {c['c']:.3f}, r = {c.get('r', 0.0):.3f}, v = "
            + ", ".join(f"{v:.3f} (N={n})" for n, v in c["v"].items())
            + (
                f"; the draft length weighs the pair's whole steps, in target-only steps: drafting "
                f"c = {c['steps']['c']:.3f}, r = {c['steps']['r']:.3f}, and with each position's share, v = "
                + ", ".join(f"{v:.3f} (N={n})" for n, v in c["steps"]["v"].items())
                if "steps" in c
                else ""
            )
            + ".",
        ]
        + busy_core_lines(s)
    )


def busy_core_lines(settings: dict) -> list[str]:
    """A warning where decodes ran on fewer threads than the pair's because another process kept a core busy
    (common/threads.py): those figures are not the machine's alone."""
    fewer = settings.get("fewer_threads_s") or 0.0
    if fewer <= 0:
        return []
    return [
        f"Another process kept a core busy for {fewer:.1f} s of the run, and decodes then ran on fewer "
        f"threads than {settings['threads']}: these figures are not this machine's alone."
    ]


def bound_rows(report: dict, modes: list) -> list[str]:
    share = report.get("prompt_share", 0.0)
    lines = [
        f"The bound a step allows, and with the prompts' passes ({share:.0%} of target-only's time) paid "
        "alike by every mode:\n",
        "| mode | bound a step | bound with the prompts | achieved ÷ bound | ours ÷ transformers "
        "| greedy text identical |",
        "|---|---|---|---|---|---|",
    ]
    for m in modes:
        row = report["overall"][m]
        lines.append(
            f"| {m} | {cell(row.get('step_bound'))} | {cell(row.get('analytic_bound'))} | "
            f"{cell(report['bound_efficiency'].get(m))} | "
            f"{cell(report['vs_transformers'].get(m))} | "
            f"{report['greedy_text_identical_to_transformers'].get(m, '–')} |"
        )
    return lines


def versus_exact_rows(diversed: dict) -> list[str]:
    """Each relaxed mode's speed-up, and its quality against exact SD's per referenced category."""
    lines = [
        "| relaxed mode | speed-up over target-only | quality vs exact SD, per referenced category "
        "(± standard error) | fidelity vs exact SD |",
        "|---|---|---|---|",
    ]
    for m, row in diversed.items():
        changes = zip(row["quality_vs_exact"].items(), row["quality_vs_exact_se"].values())
        quality = (
            ", ".join(f"{c} {cell(v, '+.1%')}" + (f" ± {se:.0%}" if se else "") for (c, v), se in changes)
            or "–"
        )
        lines.append(
            f"| {m} | {cell(row['speedup'])}× | {quality} | {cell(row['fidelity_vs_exact'], '+.1%')} |"
        )
    return lines


def bench_figure(report: dict):
    """Speedup over target-only per category and mode, as grouped bars."""
    import plotly.graph_objects as go

    categories = sorted(report["per_category"]) + ["overall"]
    fig = go.Figure()
    for mode in report["overall"]:
        if mode == "ar":
            continue
        fig.add_trace(
            go.Bar(
                name=mode,
                x=categories,
                y=[
                    (report["per_category"].get(c) or report["overall"]).get(mode, {}).get("speedup")
                    if c != "overall"
                    else report["overall"][mode]["speedup"]
                    for c in categories
                ],
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="target only")
    fig.update_layout(
        barmode="group",
        title="Spec-Bench speedup over target-only",
        yaxis_title="speedup (×)",
        template="plotly_white",
    )
    return fig


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
