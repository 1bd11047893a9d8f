"""The measured results at a glance: the header's key line (from the bench report), and the Results tab's
headline (from the heads' cards and the bench report): per task and kind of decoding, acceptance from
exact SD to DIVERSED, quality against exact SD's, and the speed-up over the target alone."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..common.formatting import fmt
from ..common.paths import shown_path
from ..eval.schemas import BenchReport, read_model
from ..runtime.amx_gguf import instruction_set
from .cards import card_task, frontier_at, head_cards
from .frontiers import cards_for_temperature, frontier_position
from .render import HEAD_COLOR, MODE_COLORS, THEORY_COLOR
from .result_tables import BENCH_BY_MACHINE, BENCH_REPORTS, quality_metric

BENCH_PATH, BENCH_COMMAND = BENCH_REPORTS["Spec-Bench, every category"]
HEADLINE_COLUMNS = [
    "task",
    "decoding",
    "head",
    "acceptance exact → DIVERSED",
    "quality exact",
    "Δ quality (± SE)",
    "vs static frontier",
    "speed-up",
    "n",
]


def machine_bench(device_type: str, kernel: str | None) -> Path:
    """README's bench as run on this kind of machine (a GPU, or the CPU kernel's instruction set `kernel`),
    where the project has run it; else the main report."""
    path = BENCH_BY_MACHINE.get("cuda" if device_type == "cuda" else kernel or "")
    return path if path is not None and path.exists() else BENCH_PATH


def bench_here(pair) -> Path:
    """The bench report run on the kind of machine this pair decodes on: its device, and on a CPU the
    instruction set the GGUF kernel takes there."""
    found = instruction_set() if pair.device.type == "cpu" else None
    return machine_bench(pair.device.type, found[0] if found else None)


def key_result(target_name: str, path: Path = BENCH_PATH) -> str:
    """One line of HTML: the bench's measured speed-ups of exact SD, a static w and the best head over the
    target alone, with their source; or which command measures them."""
    report, _ = read_model(BenchReport, path)
    if report is None or "exact" not in report.overall:
        return f"Measured speed-ups appear here once <code>{html.escape(BENCH_COMMAND)}</code> has run."
    overall, settings = report.overall, report.settings
    static = next((m for m in overall if m.startswith("static:")), None)
    heads = [m for m in overall if m.startswith("dynamic:") and overall[m].speedup is not None]
    best = max(heads, key=lambda m: overall[m].speedup, default=None)
    parts = [f"exact speculative decoding {overall['exact'].speedup:.2f}×"]
    if static:
        parts.append(f"a static w = {static.removeprefix('static:')} {overall[static].speedup:.2f}×")
    if best:
        parts.append(f"a DIVERSED head ({best.removeprefix('dynamic:')}) {overall[best].speedup:.2f}×")
    pair = "this pair" if settings.target == target_name else "the embedded pair"
    alone = overall["ar"].tokens_per_second if "ar" in overall else None
    versus = (report.vs_transformers or {}).get("ar")
    baseline = "the target alone"
    if alone is not None:  # how fast the baseline itself is, so a ratio means something
        baseline = f"the target alone, itself {alone:.0f} tokens/s" + (
            f", {versus:.1f}× transformers' <code>generate</code>" if versus is not None else ""
        )
    return (
        f"<b>Measured</b> on {settings.examples or '?'} Spec-Bench prompts with {pair} (greedy, "
        f"{settings.dtype or '?'}, {machine_words(settings)}): "
        + ", ".join(parts[:-1])
        + f" and {parts[-1]} the speed of {baseline} "
        f"(<code>{shown_path(path)}</code>)."
    )


def machine_words(settings) -> str:
    """The machine a bench report ran on, for a visitor whose own may differ: "2 threads on AMD EPYC", or
    on a CPU named by its instructions where the report has no name for it."""
    threads = f"{settings.threads or '?'} threads"
    if settings.device and not settings.device.startswith("cpu"):
        return f"on {html.escape(settings.device_name or settings.device)}"
    if settings.device_name:
        return f"{threads} on {html.escape(settings.device_name)}"
    instructions = (settings.dtype_choice or {}).get("cpu")
    return f"{threads} on a CPU with {html.escape(instructions)}" if instructions else f"{threads} on a CPU"


def headline_data(head_paths: dict[str, Path], path: Path = BENCH_PATH) -> list[dict]:
    """Per task and kind of decoding (greedy, sampled), the head trained for it on its card's primary set:
    acceptance and quality of exact SD and of the head, the paired difference, the verdict against the
    static frontier, and the bench's speed-up where the head was benched at that temperature."""
    report, _ = read_model(BenchReport, path)
    bench_greedy = report is not None and report.settings.temperature == 0
    cards, rows = head_cards(head_paths), []
    for greedy in (True, False):
        for name, card in cards_for_temperature(cards, 0.0 if greedy else 1.0).items():
            frontier = frontier_at(card, 0.0 if greedy else 1.0)
            versus = frontier.versus_exact if frontier else None
            if versus is None:
                continue
            exact = next((p.quality for p in frontier.static_points if p.w == 1), None)
            benched = report.overall.get(f"dynamic:{name}") if report and bench_greedy == greedy else None
            acceptance = versus.acceptance or {}
            rows.append(
                {
                    "task": card_task(card),
                    "greedy": greedy,
                    "head": name,
                    "acceptance_exact": acceptance.get("exact"),
                    "acceptance_head": acceptance.get("head"),
                    "quality_exact": exact,
                    "quality_difference": versus.quality_difference,
                    "quality_difference_se": versus.stderr,
                    "position": frontier_position(frontier.verdict),
                    "margin": frontier.quality_margin,
                    "speedup": benched.speedup if benched else None,
                    "examples": versus.examples,
                }
            )
    return rows


def headline_table(data: list[dict]) -> pd.DataFrame:
    """The headline as the page shows it: one row per task and kind of decoding."""
    rows = []
    for row in data:
        margin = row["margin"]
        estimate = fmt(margin.estimate if margin else None, "+.3f")
        stderr = fmt(margin.stderr if margin else None, ".3f")
        rows.append(
            [
                f"{row['task']} ({quality_metric(row['task']).split(' (')[0]})",  # its name, not its unit
                "greedy" if row["greedy"] else "T = 1",
                row["head"],
                f"{fmt(row['acceptance_exact'], '.2f')} → {fmt(row['acceptance_head'], '.2f')}",
                fmt(row["quality_exact"], ".3g"),
                f"{fmt(row['quality_difference'], '+.3f')} ± {fmt(row['quality_difference_se'], '.3f')}",
                f"{row['position']}: {estimate} ± {stderr}",
                f"{row['speedup']:.2f}×" if row["speedup"] else "not benched",
                row["examples"],
            ]
        )
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def headline_figure(data: list[dict]) -> go.Figure:
    """Left: acceptance of exact SD and of DIVERSED per task and decoding. Right: DIVERSED's quality against
    exact SD's as a relative change with a 95% interval (the tasks' scores have different scales)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=("acceptance: exact SD → DIVERSED", "quality: DIVERSED vs exact SD (95% interval)"),
    )
    labels = [f"{r['task']} · {'greedy' if r['greedy'] else 'T = 1'}" for r in data]
    add_acceptance(fig, data, labels)
    add_quality(fig, data, labels)
    fig.update_layout(
        height=120 + 36 * len(data),
        template="plotly_white",
        margin=dict(l=10, r=10, t=50, b=30),
        legend=dict(orientation="h", y=-0.12),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def add_acceptance(fig: go.Figure, data: list[dict], labels: list[str]) -> None:
    """The left panel: exact SD's and DIVERSED's acceptance per row, joined by a line."""
    for key, name, color in (
        ("acceptance_exact", "exact SD", MODE_COLORS["exact"]),
        ("acceptance_head", "DIVERSED", HEAD_COLOR),
    ):
        fig.add_trace(
            go.Scatter(
                x=[r[key] for r in data],
                y=labels,
                mode="markers",
                name=name,
                marker=dict(color=color, size=12),
            ),
            row=1,
            col=1,
        )
    for row, label in zip(data, labels):
        fig.add_trace(
            go.Scatter(
                x=[row["acceptance_exact"], row["acceptance_head"]],
                y=[label, label],
                mode="lines",
                line=dict(color=THEORY_COLOR),
                showlegend=False,
                hoverinfo="skip",
            ),
            row=1,
            col=1,
        )


def add_quality(fig: go.Figure, data: list[dict], labels: list[str]) -> None:
    """The right panel: DIVERSED's quality change against exact SD's, relative, with a 95% interval."""
    scales = [abs(r["quality_exact"] or 0) or 1 for r in data]  # relative to exact SD's quality
    errors = [1.96 * (r["quality_difference_se"] or 0) / scale for r, scale in zip(data, scales)]
    fig.add_trace(
        go.Scatter(
            x=[(r["quality_difference"] or 0) / scale for r, scale in zip(data, scales)],
            y=labels,
            mode="markers",
            error_x=dict(type="data", array=errors, color=HEAD_COLOR),
            marker=dict(color=HEAD_COLOR, size=10, symbol="diamond"),
            name="quality difference",
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    fig.add_vline(x=0, line_dash="dot", line_color=THEORY_COLOR, row=1, col=2)
    # A score near zero (pass@1 at T = 1) makes its relative interval huge: the axis stops at ±100%.
    fig.update_xaxes(tickformat="+.0%", range=[-1.05, 1.05], row=1, col=2)
