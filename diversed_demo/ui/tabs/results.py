"""The Results tab: the headline per task (acceptance from exact SD to DIVERSED, quality held, speed-up),
the frontier of each task, and the raw tables folded away; every figure drawn from a file the project
ships, or a line naming the command that writes it."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ...eval.tasks import TASKS
from ..cards import FRONTIER_COMMAND
from ..frontiers import shipped_frontiers
from ..render import quality_figure
from ..result_tables import BENCH_REPORTS, bench_markdown, frontier_table
from ..results_summary import BENCH_COMMAND, headline_data, headline_figure, headline_table

INTRO = (
    "What was measured, drawn from the files the project ships (each names the command that wrote it). "
    "**The headline**: for each task, how much more often DIVERSED keeps the draft's tokens than exact "
    "speculative decoding (acceptance), what that does to quality, and, where it was benched, how much "
    "faster decoding got than the target alone. Quality differences are paired over the same held-out "
    "prompts, ± a standard error; *vs the static frontier* compares the head with a static w of the same "
    "acceptance (beyond, on or below, ± a bootstrap standard error). Quality is ROUGE-2 for summaries, "
    "the right final number (match) for math, tests passed (pass@1) for code, and fidelity (the "
    "target's mean log-probability of the text, nats per token) for general chat; speed-ups are tokens "
    "per second over the target alone, greedy, from `results/bench.json`."
)


def build_headline(heads: dict[str, Path]) -> None:
    data = headline_data(heads)
    if not data:
        gr.Markdown(f"*No head of this pair has a frontier card: `{FRONTIER_COMMAND}` writes one.*")
        return
    # An HTML table wraps its cells to the page, where a Dataframe would clip its last columns.
    table = headline_table(data).to_html(index=False, border=0, classes="dd-table")
    gr.HTML(f'<div class="dd-table-scroll">{table}</div>', elem_id="results-headline")
    gr.Plot(headline_figure(data), show_label=False, elem_id="results-headline-figure")
    if not any(row["speedup"] for row in data):
        gr.Markdown(f"*Speed-ups: `{BENCH_COMMAND}` measures them.*")


def build_frontier_figures(heads: dict[str, Path]) -> None:
    """Each task's frontier (static w as a curve, its heads as stars), greedy and sampled, two to a row."""
    gr.Markdown("### The frontier of each task")
    with gr.Tabs():
        for greedy in (True, False):
            frontiers = shipped_frontiers(heads, 0.0 if greedy else 1.0)
            kind = "greedy" if greedy else "sampled (T = 1)"
            with gr.Tab(kind):
                drawn = [frontiers[task] for task in TASKS if task in frontiers]
                if not drawn:
                    gr.Markdown(f"*No frontier card: `{FRONTIER_COMMAND}` writes one.*")
                for first in range(0, len(drawn), 2):
                    with gr.Row():
                        for frontier in drawn[first : first + 2]:
                            title = f"{frontier.task} · {kind}"
                            gr.Plot(quality_figure(frontier.points, title), show_label=False, min_width=320)


def build_results_tab(heads: dict[str, Path]) -> None:
    with gr.Tab("Results", id="results"):
        gr.Markdown(INTRO)
        build_headline(heads)
        build_frontier_figures(heads)
        with gr.Accordion("Every frontier point (table)", open=False):
            rows = frontier_table(heads)
            if rows.empty:
                gr.Markdown(f"*No frontier card: `{FRONTIER_COMMAND}` writes one.*")
            else:
                gr.Dataframe(rows, interactive=False, elem_id="results-frontier", wrap=True)
        for name in BENCH_REPORTS:
            with gr.Accordion(f"Bench report: {name}", open=False):
                gr.Markdown(bench_markdown(name), elem_classes="dd-results")
