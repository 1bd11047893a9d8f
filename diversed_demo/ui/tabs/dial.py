"""The Speed–quality dial tab: acceptance against quality for each static w with the trained heads as stars
(the shipped frontier cards, or a live sweep on this machine), the projected speedup at a chosen cost
ratio, and the transformers snippet for the sidebar's w."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from ...core.config import DecodeConfig
from ...eval.frontier import FRONTIER_DECODING, sweep_steps
from ...eval.tasks import TASKS, Example
from ...models.embedded import EMBEDDED
from ...models.heads import load_head
from ...runtime.model_thread import MODEL_THREAD
from ..cards import FRONTIER_COMMAND, is_greedy
from ..cost_presets import CostPreset, cost_presets
from ..frontiers import (
    RULE_COMMAND,
    RULE_REPORTS_GREEDY,
    expected_tv,
    points_frame,
    rule_frontiers,
    shipped_frontiers,
    verdict_markdown,
)
from ..handlers import DECODE_SLOTS, bind, user_errors
from ..opening import Defaults
from ..render import (
    DIAL_HEIGHT,
    DIAL_MAIN_HEIGHT,
    acceptance_figure,
    figure,
    projection_figure,
    quality_figure,
)
from ..sidebar import Sidebar, head_choices
from ..snippet import pair_snippet
from ..space import on_gpu, public_space

CHART_IDS = ("dial-quality", "dial-acceptance", "dial-projection")
INTRO = (
    "**The dial.** A lower w keeps more of the draft's guesses, so decoding is faster, and lets the text "
    "drift towards the draft's. Each orange point is one static w, measured on held-out prompts; the "
    "curve they trace is the **static frontier**. Teal diamonds are the **per-token rule** at a few λ: "
    "w token by token from the two models' distributions, with no training. A purple star is a trained "
    "**DIVERSED head**, which picks w token by token from the models' hidden states and distributions; "
    "a purple line of stars is a **cost head** at the same λ (the rule's cost, corrected by what it "
    "learned). A point above the curve means better quality at the same acceptance. "
    "Quality is the task's own score: ROUGE-2 for summaries, the right final number for math, tests "
    "passed for code, and for general chat how likely the target finds the text (fidelity)."
)
SWEEP_VERDICT = (
    "A live sweep of a few prompts places the heads but is too small to judge them: the verdicts come "
    "from the shipped cards (50–100 held-out prompts each)."
)

PUBLIC_SWEEP_PROMPTS, PUBLIC_SWEEP_TOKENS = 2, 64  # a public app's sweep: at most this much


def dial_figures(points: pd.DataFrame | None, n_draft, cost_ratio, source: str) -> tuple:
    """The dial's charts (quality vs acceptance, acceptance vs w, projected speed-up) of its points, or
    empty charts, the first saying what to do."""
    if points is None or points.empty:
        return (
            figure(source, DIAL_MAIN_HEIGHT, "", ""),
            *(figure("", DIAL_HEIGHT, "", "") for _ in range(len(CHART_IDS) - 1)),
        )
    return (
        quality_figure(points),
        acceptance_figure(points, expected_tv(points)),
        projection_figure(points, int(n_draft), float(cost_ratio)),
    )


def shipped_dial(frontiers: dict, task, n_draft, cost_ratio, temperature):
    """The shipped frontier of `task` (static points, theory line, heads as stars) as measured greedily when
    the sidebar's temperature is 0, else at T = 1 (`frontiers`: {greedy?: shipped_frontiers}): figures,
    note, verdict, points."""
    frontier = frontiers[is_greedy(temperature)].get(task)
    if frontier is None:
        note = (
            f"No shipped frontier card for **{task}** with this pair: run the live sweep below, or "
            f"`{FRONTIER_COMMAND}`."
        )
        empty = dial_figures(None, n_draft, cost_ratio, f"no shipped frontier for {task}")
        return (*empty, note, "", None)
    note = f"**Shipped frontier** ({task}): {frontier.note}."
    verdict = "#### Verdict\n" + verdict_markdown(frontier.verdicts)
    return (*dial_figures(frontier.points, n_draft, cost_ratio, ""), note, verdict, frontier.points)


def respeed(points, n_draft, cost_ratio):
    """Redraw the projection for a new N or c, from the points on show."""
    if points is None or len(points) == 0:
        return gr.skip()
    return projection_figure(points, int(n_draft), float(cost_ratio))


def preset_cost(presets: list[CostPreset], label):
    return next((p.cost_ratio for p in presets if p.label == label), gr.skip())


SWEEP_LAMS = (0.5, 2.0, 8.0)  # the per-token rule's λ in a live sweep: from near exact to most drafts kept


def sweep_rows(pair, chosen, task, weights, tokens, n_draft, temperature, progress, idle):
    """The frontier rows of static w (and w = 1), the per-token rule at each of SWEEP_LAMS and every head
    of the pair on the chosen examples: a generator that yields `idle` after each decode, where a Stop or a
    disconnect can end it, and returns the rows."""
    weights = sorted({float(w) for w in weights} | {1.0})  # w = 1 anchors the E[TV] estimate
    heads = {name: load_head(name, pair) for name in head_choices(pair)}
    total = (len(weights) + len(SWEEP_LAMS) + len(heads)) * len(chosen)
    decoding = FRONTIER_DECODING.replace(
        n_draft=int(n_draft), max_new_tokens=int(tokens), temperature=float(temperature)
    )
    steps = sweep_steps(pair, chosen, task, weights, heads, decoding=decoding, lams=SWEEP_LAMS)
    done = 0
    while True:
        try:
            label, _, _ = MODEL_THREAD.call(next, steps)
        except StopIteration as finished:
            return [point.row() for point in finished.value]
        done += 1
        progress(done / total, desc=f"{label}: {done}/{total} decodes")
        yield idle


@on_gpu
def on_sweep(
    pair,
    examples,
    task,
    n_prompts,
    weights,
    tokens,
    n_draft,
    temperature,
    cost_ratio,
    progress=gr.Progress(),
    request: gr.Request = None,
):
    """Re-measure the frontier on the task's example prompts, streamed so that Stop ends it between
    decodes: (points, figures, note, verdict, table)."""
    with user_errors(), DECODE_SLOTS.hold(request):
        if public_space():  # one visitor's sweep must not hold the shared CPU for long
            n_prompts, tokens = (
                min(int(n_prompts), PUBLIC_SWEEP_PROMPTS),
                min(int(tokens), PUBLIC_SWEEP_TOKENS),
            )
        chosen = [e for e in examples if e.task == task][: int(n_prompts)]
        if not chosen:
            raise ValueError(f"no example prompts for task {task!r} (assets/prompts/examples.json)")
        if not weights:
            raise ValueError("tick at least one static w to try")
        if task == "code" and public_space():
            raise ValueError(
                "the code task's sweep runs the generated programs, which a public app does not do; "
                "its frontier card is drawn above, and the sweep runs when you run the app yourself"
            )
        idle = (gr.skip(),) * (len(CHART_IDS) + 4)  # outputs left as they are while the sweep runs
        decoding = (tokens, n_draft, temperature)
        rows = yield from sweep_rows(pair, chosen, task, weights, *decoding, progress, idle)
    points = points_frame(rows, int(n_draft))
    note = (
        f"**Your sweep** ({task}): {len(chosen)} example prompt{'s' if len(chosen) > 1 else ''}, "
        f"N = {int(n_draft)}, T = {float(temperature):g}, ≤{int(tokens)} new tokens, "
        "measured on this machine."
    )
    yield (points, *dial_figures(points, n_draft, cost_ratio, ""), note, SWEEP_VERDICT, points.round(3))


def build_dial_controls(start_task: str, presets: list[CostPreset]) -> tuple:
    """The task, the cost preset and the cost ratio c."""
    with gr.Row():
        task = gr.Dropdown(
            list(TASKS),
            value=start_task,
            label="task",
            elem_id="dial-task",
            info="tasks with a shipped frontier card draw it at once",
            min_width=200,
        )
        preset = gr.Dropdown(
            [p.label for p in presets],
            value=presets[0].label,
            min_width=260,
            label="draft/target pair for the projection",
            elem_id="cost-preset",
        )
        cost_ratio = gr.Slider(
            0.005,
            1,
            value=presets[0].cost_ratio,
            step=0.005,
            min_width=200,
            label="draft/target cost ratio c",
            elem_id="cost-ratio",
            info="for the projected speedup only",
        )
    return task, preset, cost_ratio


def build_dial_charts(figures, verdict: str) -> tuple[list[gr.Plot], gr.Markdown]:
    """The main chart with the verdict beside it, then the other two side by side; rows that wrap stack
    them on a phone."""
    with gr.Row(equal_height=False):
        main = gr.Plot(figures[0], show_label=False, elem_id=CHART_IDS[0], min_width=320, scale=3)
        verdict_box = gr.Markdown(verdict, elem_id="dial-verdict", min_width=240)
    with gr.Row():
        others = [
            gr.Plot(figure, show_label=False, elem_id=chart_id, min_width=320)
            for figure, chart_id in zip(figures[1:], CHART_IDS[1:])
        ]
    return [main, *others], verdict_box


def build_snippet_box(pair, sidebar: Sidebar, start: DecodeConfig) -> None:
    """The transformers snippet, rewritten as the sidebar's w, temperature and new tokens move."""
    with gr.Accordion(
        "Take the dial to your own pair: transformers' assisted generation with the sidebar's w", open=True
    ):
        code = gr.Code(
            pair_snippet(pair, start.ensemble_weight, start.temperature, start.max_new_tokens),
            language="python",
            elem_id="dial-snippet",
            interactive=False,
        )
    gr.on(
        [sidebar.w.change, sidebar.temperature.change, sidebar.max_new_tokens.change],
        bind(pair_snippet, pair),
        [sidebar.w, sidebar.temperature, sidebar.max_new_tokens],
        code,
        api_visibility="private",
    )


def build_sweep_box(pair, examples, sidebar: Sidebar, task, cost_ratio, shown: list) -> gr.Button:
    """The live sweep: its settings, its button (redrawing what the dial `shown`: points, plots, note and
    verdict) and its table; the button that brings the shipped frontier back, to wire with the task."""
    with gr.Accordion("Live sweep: re-measure on your machine and the example prompts", open=False):
        with gr.Row():
            n_prompts = gr.Slider(1, 8, value=2, step=1, label="prompts", min_width=160)
            tokens = gr.Slider(8, 128, value=32, step=8, label="new tokens per prompt", min_width=160)
            weights = gr.CheckboxGroup(
                [0.0, 0.25, 0.5, 0.75, 1.0], value=[0.0, 0.5, 1.0], label="static w to try", min_width=200
            )
        with gr.Row():
            sweep_button = gr.Button("Run sweep", variant="primary", elem_id="sweep")
            stop_button = gr.Button("Stop", elem_id="sweep-stop")
            shipped_button = gr.Button("Show the shipped frontier again", elem_id="shipped")
        table = gr.Dataframe(label="sweep results", interactive=False)

    sweeping = sweep_button.click(
        bind(on_sweep, pair, examples),
        [task, n_prompts, weights, tokens, sidebar.n_draft, sidebar.temperature, cost_ratio],
        [*shown, table],
        concurrency_id="decode",
        api_name="sweep",
    )
    stop_button.click(None, cancels=[sweeping])
    return shipped_button


def build_dial_tab(
    pair, examples: list[Example], heads: dict[str, Path], sidebar: Sidebar, start: Defaults
) -> None:
    """The dial at the opening settings (`start`): the first task with a shipped frontier card,
    drawn at once, and the first cost preset."""
    frontiers = {greedy: shipped_frontiers(heads, 0.0 if greedy else 1.0) for greedy in (False, True)}
    if pair.target_name == EMBEDDED:  # the rule's shipped evaluations are of the embedded pair
        frontiers[False] |= rule_frontiers()
        frontiers[True] |= rule_frontiers(RULE_REPORTS_GREEDY, f"T=0 bash {RULE_COMMAND}")
    presets = cost_presets()
    start_task = next((t for t in TASKS if t in frontiers[False]), "general")
    *figures, start_note, start_verdict, start_points = shipped_dial(
        frontiers, start_task, start.settings.n_draft, presets[0].cost_ratio, start.settings.temperature
    )
    with gr.Tab("Speed–quality dial", id="dial"):
        gr.Markdown(INTRO)
        task, preset, cost_ratio = build_dial_controls(start_task, presets)
        note = gr.Markdown(start_note, elem_id="dial-note")
        points = gr.State(start_points)
        plots, verdict = build_dial_charts(figures, start_verdict)
        gr.Markdown(
            "*The projected speed-up is computed from the per-token acceptance α, N (sidebar) and the cost "
            "ratio c; it is a model, not a measurement. Measured speed-ups are in the Results tab.*"
        )
        build_snippet_box(pair, sidebar, start.settings)
        shown = [points, *plots, note, verdict]
        shipped_button = build_sweep_box(pair, examples, sidebar, task, cost_ratio, shown)

    shipped_inputs = [task, sidebar.n_draft, cost_ratio, sidebar.temperature]
    shipped_outputs = [*plots, note, verdict, points]
    gr.on(
        [task.change, shipped_button.click],
        bind(shipped_dial, frontiers),
        shipped_inputs,
        shipped_outputs,
        api_visibility="private",
    )
    preset.change(bind(preset_cost, presets), preset, cost_ratio, api_visibility="private")
    gr.on(
        [cost_ratio.change, sidebar.n_draft.release],
        respeed,
        [points, sidebar.n_draft, cost_ratio],
        plots[-1],
        api_visibility="private",
    )
