"""The Results tab: the heads against the static frontier (from their cards) and the bench reports, each
drawn from the file the project ships or naming the command that writes it."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ..cards import FRONTIER_COMMAND
from ..result_tables import BENCH_REPORTS, bench_markdown, frontier_table

INTRO = (
    "Measured results, drawn from the files the project ships (each says which command "
    "wrote it). **Heads against the static frontier** (from `heads/<name>.json`): held-out "
    "Spec-Bench first turns, the same seed per prompt for every setting; the margin is the "
    "head's quality minus the static frontier's at the head's acceptance, ± a bootstrap "
    "standard error over prompts."
)


def build_results_tab(heads: dict[str, Path]) -> None:
    with gr.Tab("Results", id="results"):
        gr.Markdown(INTRO)
        rows = frontier_table(heads)
        if rows.empty:
            gr.Markdown(f"*No head of this pair has a frontier card. Written by* `{FRONTIER_COMMAND}`.")
        else:
            gr.Dataframe(rows, interactive=False, elem_id="results-frontier", wrap=True)
        for name in BENCH_REPORTS:
            gr.Markdown(f"### {name}\n\n{bench_markdown(name)}", elem_classes="dd-results")
