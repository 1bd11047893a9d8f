"""The Compare tab: one prompt through every mode with the same seed, side by side, with the acceptance and
time charts, a table, a one-line verdict and the comparison's trace."""

from __future__ import annotations

import html
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from ...common.formatting import fmt
from ...common.paths import shown_path
from ...core.config import MODES
from ...eval.schemas import BenchReport, read_model
from ...eval.tasks import Example
from ...runtime.model_thread import MODEL_THREAD
from ..examples import example_choices, find_example, opening_prompt
from ..handlers import DECODE_SLOTS, bind, example_prompt, user_errors
from ..opening import Defaults
from ..render import MODE_LABELS, RUN_LABELS, comparison_charts, legend_html, run_panel_html
from ..result_tables import BENCH_REPORTS
from ..results_summary import bench_here
from ..runs import APP_CONFIG, TREES, Comparison, speed_sentence, speedup, stream_comparison, throttled
from ..sidebar import Sidebar, settings_from
from ..space import on_gpu
from ..trace import trace_files
from .decode import CHART_INTERVAL_S, UI_INTERVAL_S

PANELS = (*MODES, TREES)  # a panel per mode, and one for exact SD on trees (shown where it runs)
TABLE_COLUMNS = ["mode", "speedup ×", "acceptance", "τ", "tokens/s", "tokens", "quality", "metric"]
CAVEAT = (
    "One prompt is too few to judge quality: the Results tab has the measured tables "
    "(many held-out prompts, with standard errors)."
)


def quality_against_exact(comparison: Comparison, mode: str) -> str | None:
    """How the run's quality compares with exact SD's, or None where either is missing."""
    value, metric = comparison.quality.get(mode, (None, "n/a"))
    exact_value, _ = comparison.quality.get("exact", (None, "n/a"))
    if value is None or exact_value is None:
        return None
    if metric == "fidelity":  # a mean log-probability: compare in nats, not in percent
        return f"fidelity {value:.2f} vs {exact_value:.2f} nats/token for exact SD"
    if not exact_value:
        return f"{metric} {value:.3f} vs {exact_value:.3f} for exact SD"
    change = (value - exact_value) / abs(exact_value)
    where = (
        f"within {abs(change):.0%} of"
        if abs(change) <= 0.05
        else f"{abs(change):.0%} " + ("above" if change > 0 else "below")
    )
    return f"{metric} {where} exact SD's ({value:.3f} vs {exact_value:.3f})"


def compare_verdict(comparison: Comparison, running: bool = False) -> str:
    """The measured speed-ups of the modes over target only, then each per-token verifier's (the rule's
    and DIVERSED's, else the static ensemble's) acceptance, quality against exact SD and departure, and
    that one prompt cannot judge quality (the Results tab can)."""
    judged = [mode for mode in ("cost", "dynamic") if mode in comparison.runs] or ["static"]
    runs = [comparison.runs.get(mode) for mode in judged]
    if running or any(run is None or not run.done for run in runs):
        return (
            '<div class="dd-verdict" data-state="running">The verdict appears when every mode has run.</div>'
        )
    sentences = [
        f"{html.escape(MODE_LABELS[mode])}: {html.escape('; '.join(verdict_parts(comparison, mode)))}."
        for mode in judged
    ]
    return (
        f'<div class="dd-verdict" data-state="done"><b>{html.escape(speed_sentence(comparison))}</b> '
        f"{' '.join(sentences)} "
        f'<span class="dd-caveat">{html.escape(CAVEAT)}</span></div>'
    )


def verdict_parts(comparison: Comparison, mode: str) -> list[str]:
    """One verifier's acceptance, its quality against exact SD's and where it departs from target only."""
    run = comparison.runs[mode]
    if run.acceptance_rate is None:  # the draft length chose no draft at any step
        parts = ["drafted nothing, as no draft was expected to pay for its cost on this machine"]
    else:
        parts = [f"kept {fmt(run.acceptance_rate, '.0%')} of the drafted tokens, τ {fmt(run.tau, '.2f')}"]
    quality = quality_against_exact(comparison, mode)
    if quality is not None:
        parts.append(quality)
    departs = comparison.departures().get(mode)
    parts.append(
        "same tokens as target only"
        if departs is None
        else f"departs from target only at token {departs + 1}"
    )
    return parts


def comparison_table(comparison: Comparison) -> pd.DataFrame:
    """Speedup over target-only, acceptance, τ, tokens/s and quality of each finished run."""
    baseline = comparison.runs.get("ar")
    rows = []
    for mode in PANELS:
        run = comparison.runs.get(mode)
        if run is None or not run.done:
            continue
        quality, metric = comparison.quality.get(mode, (None, "n/a"))
        ratio = speedup(run, baseline)
        rows.append(
            {
                "mode": RUN_LABELS[mode],
                "speedup ×": None if ratio is None else round(ratio, 2),
                "acceptance": None if run.acceptance_rate is None else round(run.acceptance_rate, 3),
                "τ": round(run.tau, 2),
                "tokens/s": round(run.tokens_per_second, 1),
                "tokens": run.new_tokens,
                "quality": fmt(quality),
                "metric": metric,
            }
        )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


@on_gpu
def on_compare(
    pair,
    examples,
    prompt,
    w,
    head_name,
    n_draft,
    max_new_tokens,
    temperature,
    seed,
    lam=APP_CONFIG.lam,
    auto_n=False,
    drafts="as the runtime chose",
    trees_beside=False,
    request: gr.Request = None,
):
    """Stream the comparison: (a panel per run, two charts, table, verdict, trace files). `trees_beside`:
    every mode on chains, and exact SD once more on draft trees."""
    example = find_example(prompt, examples)
    last_chart = time.perf_counter()  # the first chart a chart interval in, as in Decode
    with user_errors():
        settings = settings_from(
            "static", w, head_name, n_draft, max_new_tokens, temperature, seed, lam, auto_n, drafts
        )
        comparison = Comparison()
        with DECODE_SLOTS.hold(request):
            comparing = MODEL_THREAD.iterate(
                lambda: stream_comparison(pair, prompt, settings, example, bool(trees_beside))
            )
            shown, finished = {}, None  # what was last sent: only what changed is sent again
            for comparison in throttled(comparing, UI_INTERVAL_S):
                charts = (gr.skip(), gr.skip())
                if time.perf_counter() - last_chart >= CHART_INTERVAL_S:
                    charts, last_chart = comparison_charts(comparison), time.perf_counter()
                before, finished = finished, [mode for mode, run in comparison.runs.items() if run.done]
                yield (
                    *changed_panels(comparison, shown),
                    *charts,
                    gr.skip() if before == finished else comparison_table(comparison),
                    compare_verdict(comparison, running=True),
                    gr.skip(),
                )
        # The visitor's slot is free before the verdict shows: they may go again at once.
        # The last update always carries the final charts, the full table, the verdict and the trace.
        labelled = {RUN_LABELS[mode]: run for mode, run in comparison.runs.items()}
        yield (
            *[run_panel_html(mode, comparison) for mode in PANELS],
            *comparison_charts(comparison),
            comparison_table(comparison),
            compare_verdict(comparison),
            trace_files(labelled, pair, "compare"),
        )


def changed_panels(comparison: Comparison, shown: dict) -> list:
    """Each panel's HTML where its run changed since `shown` (updated here), gr.skip() where it did not: a
    finished run's tokens are not rendered, sent and laid out again at every update of the next run's."""
    panels = []
    for mode in PANELS:
        run = comparison.runs.get(mode)
        state = (len(run.events), run.done) if run is not None else comparison.skipped.get(mode)
        panels.append(gr.skip() if shown.get(mode, ...) == state else run_panel_html(mode, comparison))
        shown[mode] = state
    return panels


BENCH_PATHS = tuple(path for path, _command in BENCH_REPORTS.values())


def greedy_exactness(pair, report_paths: tuple[Path, ...] = BENCH_PATHS) -> str:
    """What exact SD does at temperature 0 in the pair's dtype: in fp32 it never departs from target-only;
    in bf16 it does not where every kernel is row-invariant (block_attention.py; a pass over several tokens
    could otherwise round differently from one over a single token and flip a near-tie): the shipped bench
    report measured in this dtype on this kind of device says how often it matched."""
    dtype = str(pair.target.dtype).removeprefix("torch.")
    if dtype == "float32":
        return "at temperature 0 exact SD never departs"
    for path in report_paths:
        report, _ = read_model(BenchReport, path)
        if report is None:
            continue
        share = (report.greedy_identical_to_target_only or {}).get("exact")
        examples = report.settings.examples
        measured_in = (report.settings.dtype, str(report.settings.device).split(":")[0])
        if measured_in == (dtype, pair.device.type) and share == 1 and examples:
            return (
                f"at temperature 0 exact SD in {dtype} matched target-only token for token on all {examples} "
                f"Spec-Bench prompts ({shown_path(path)}): a pass over several tokens gives each position "
                "the logits a one-token pass gives it"
            )
        if measured_in == (dtype, pair.device.type) and share is not None and examples:
            return (
                f"at temperature 0 exact SD in {dtype} matched target-only token for token on "
                f"{round(share * examples)} of {examples} Spec-Bench prompts ({shown_path(path)}): a pass "
                "over several tokens rounds differently from one over a single token, so near-ties can flip; "
                "in float32 it never departs"
            )
    return (
        f"at temperature 0 exact SD in {dtype} may depart where rounding flips a near-tie; "
        "in float32 it never departs"
    )


def build_compare_tab(
    pair, examples: list[Example], sidebar: Sidebar, start: Defaults, tabs: gr.Tabs
) -> None:
    """The Compare tab at the opening example (`start`); its link opens the Results tab."""
    with gr.Tab("Compare", id="compare"):
        gr.Markdown(
            "One prompt through each mode in turn, **all with the same seed**, so differences come "
            "from the verifier alone. Static uses the sidebar's w; the per-token rule its λ (it relaxes "
            "where the draft's token costs the target little); DIVERSED its head. ▶ marks the "
            "first token where an output departs from target-only decoding ("
            + greedy_exactness(pair, (bench_here(pair), *BENCH_PATHS))
            + "; above 0 it may, since its random draws differ while its law is the target's)."
        )
        with gr.Row():
            example = gr.Dropdown(
                example_choices(examples),
                value=start.example_index,
                label="example prompt",
                scale=3,
                min_width=240,
            )
            compare_button = gr.Button(
                "Run compare", variant="primary", scale=1, min_width=120, elem_id="compare"
            )
            stop_button = gr.Button("Stop", scale=0, min_width=80, elem_id="compare-stop")
        trees_beside = gr.Checkbox(
            False,
            label="exact SD on draft trees beside the chains",
            info="every mode drafts chains, and exact SD runs once more drafting trees (several guesses a "
            "position, one target pass): what a tree adds on this machine",
            elem_id="compare-trees",
        )
        prompt = gr.Textbox(
            opening_prompt(examples, start.example_index),
            label="prompt",
            lines=2,
            max_lines=8,
            elem_id="compare-prompt",
        )
        with gr.Row(elem_classes="dd-verdict-row"):
            verdict = gr.HTML(compare_verdict(Comparison()), elem_id="compare-verdict", min_width=260)
            results_link = gr.Button(
                "Measured results →", size="sm", scale=0, min_width=160, elem_id="results-link"
            )
        gr.HTML(legend_html())
        panels, plots, summary, trace = build_compare_outputs()

    example.change(bind(example_prompt, examples), example, prompt, api_visibility="private")
    trees_beside.change(
        lambda shown: gr.update(visible=shown), trees_beside, panels[-1], api_visibility="private"
    )
    comparing = compare_button.click(
        bind(on_compare, pair, examples),
        [prompt, *sidebar.inputs, trees_beside],
        [*panels, *plots, summary, verdict, trace],
        concurrency_id="decode",
        api_name="compare",
    )
    stop_button.click(None, cancels=[comparing])
    results_link.click(lambda: gr.Tabs(selected="results"), None, tabs, api_visibility="private")


def build_compare_outputs() -> tuple[list[gr.HTML], list[gr.Plot], gr.Dataframe, gr.File]:
    """The panels (one per mode), the two charts, the summary table and the trace box."""
    with gr.Row(equal_height=False, elem_classes="dd-panels"):
        panels = [
            gr.HTML(
                run_panel_html(mode, Comparison()),
                elem_classes="dd-panel-box",
                min_width=160,
                visible=mode != TREES,
                elem_id="compare-trees-panel" if mode == TREES else None,
            )
            for mode in PANELS
        ]
    with gr.Row():
        acceptance_plot = gr.Plot(show_label=False, elem_id="compare-acceptance", min_width=300)
        elapsed_plot = gr.Plot(show_label=False, elem_id="compare-elapsed", min_width=300)
    summary = gr.Dataframe(
        comparison_table(Comparison()), label="summary", interactive=False, elem_id="compare-table"
    )
    trace = gr.File(
        label="trace of the comparison (JSON to replay in Decode, CSV)",
        file_count="multiple",
        interactive=False,
        elem_id="compare-trace",
    )
    return panels, [acceptance_plot, elapsed_plot], summary, trace
