"""The Results tab: the headline per task (acceptance from exact SD to DIVERSED, quality held, speed-up),
the frontier of each task, and the raw tables folded away; every figure drawn from a file the project
ships, or a line naming the command that writes it."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ...eval.tasks import TASKS
from ..cards import FRONTIER_COMMAND
from ..frontiers import RULE_COMMAND, RULE_REPORTS, RULE_REPORTS_GREEDY, rule_frontiers, shipped_frontiers
from ..render import quality_figure
from ..result_tables import BENCH_REPORTS, bench_markdown, frontier_table, verifier_table
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


VERIFIER_INTRO = (
    "### The per-token verifiers against static w\n"
    "On the same held-out prompts and seeds: static w as the frontier, the **per-token rule** (no training: "
    "relax where the draft's token costs the target little, one point per λ) and the heads, a **cost head** "
    "as a curve of its own (the rule's cost plus a learned correction, one point per λ). Every verifier lies "
    "on one line in acceptance against distance from the target, so they are judged on what can differ: the "
    "task's score and **fidelity** (the target's log-probability of the text). Intervals are 95% bootstrap "
    "intervals over prompts; a cost head is also compared, prompt by prompt, with the rule at its λ. "
    "The 135M target's own scores sit near their floor at T = 1 (ROUGE-2 about 0.01–0.06, exact match "
    "0–0.1, pass@1 0–0.03): there no setting can be told from another (*floor* or *unresolved*), and "
    "fidelity is what separates them."
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


def build_verifier_section() -> None:
    """The per-token rule and the heads (a cost head as a curve) against static w on the same prompts, at
    T = 1 and greedy: each task's three curves in fidelity, and every point's verdicts in the task's score
    and in fidelity, with the cost heads against the rule they started as."""
    gr.Markdown(VERIFIER_INTRO)
    with gr.Tabs():
        for decoding, reports, command in (
            ("sampled (T = 1)", RULE_REPORTS, f"bash {RULE_COMMAND}"),
            ("greedy", RULE_REPORTS_GREEDY, f"T=0 bash {RULE_COMMAND}"),
        ):
            with gr.Tab(decoding):
                drawn = rule_frontiers(reports, command)
                if not drawn:
                    gr.Markdown(f"*Not measured yet: `{command}` writes these.*")
                tasks = [task for task in TASKS if task in drawn]
                for first in range(0, len(tasks), 2):
                    with gr.Row():
                        for task in tasks[first : first + 2]:
                            # fidelity: where the claims are; the table below has the task's scores
                            points = drawn[task].points.assign(quality=drawn[task].points["fidelity"])
                            title, y_title = f"{task} · {decoding} · fidelity", "fidelity (nats per token)"
                            figure = quality_figure(points, title, y_title)
                            gr.Plot(figure, show_label=False, min_width=320)
    table = verifier_table({"T = 1": RULE_REPORTS, "greedy": RULE_REPORTS_GREEDY})
    if not table.empty:
        with gr.Accordion("The per-token verifiers, point by point (table)", open=False):
            gr.Dataframe(table, interactive=False, elem_id="results-verifiers", wrap=True)


def build_results_tab(heads: dict[str, Path]) -> None:
    with gr.Tab("Results", id="results"):
        gr.Markdown(INTRO)
        build_headline(heads)
        build_frontier_figures(heads)
        build_verifier_section()
        with gr.Accordion("Every frontier point (table)", open=False):
            rows = frontier_table(heads)
            if rows.empty:
                gr.Markdown(f"*No frontier card: `{FRONTIER_COMMAND}` writes one.*")
            else:
                gr.Dataframe(rows, interactive=False, elem_id="results-frontier", wrap=True)
        for name in BENCH_REPORTS:
            with gr.Accordion(f"Bench report: {name}", open=False):
                gr.Markdown(bench_markdown(name), elem_classes="dd-results")
