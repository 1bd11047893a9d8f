"""The Speed–quality dial tab: acceptance against quality for each static w with the trained heads as stars
(the shipped frontier cards, or a live sweep on this machine), the projected speedup at a chosen cost
ratio, and the transformers snippet for the sidebar's w."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from ...eval.frontier import sweep_steps
from ...eval.tasks import TASKS, Example
from ...models.heads import load_head
from ..cards import FRONTIER_COMMAND, is_greedy
from ..cost_presets import CostPreset, cost_presets
from ..frontiers import expected_tv, points_frame, shipped_frontiers
from ..handlers import DECODE_SLOTS, bind, user_errors
from ..opening import Defaults
from ..render import DIAL_HEIGHT, acceptance_figure, figure, projection_figure, quality_figure, speed_figure
from ..runs import DecodeSettings
from ..sidebar import Sidebar, head_choices
from ..snippet import pair_snippet
from ..space import on_gpu, public_space

CHART_IDS = ("dial-acceptance", "dial-quality", "dial-speed", "dial-projection")
INTRO = (
    "Acceptance against quality for each static w, with the theory line 1 − w·E[TV] "
    "(E[TV] from the w = 1 point) and the trained heads as stars; the projected speedup at a "
    "draft/target cost ratio c you choose. Quality is the task's reward: ROUGE-2 "
    "(summarization), final-number match (math), pass@1 (code) or fidelity to the target "
    "(general)."
)

PUBLIC_SWEEP_PROMPTS, PUBLIC_SWEEP_TOKENS = 2, 64  # a public app's sweep: at most this much


def dial_figures(points: pd.DataFrame | None, n_draft, cost_ratio, source: str) -> tuple:
    """The dial's four charts (acceptance vs w, quality vs acceptance, measured speed, projected speedup) of
    its points, or empty charts, the first saying what to do."""
    if points is None or points.empty:
        return (figure(source, DIAL_HEIGHT, "", ""), *(figure("", DIAL_HEIGHT, "", "") for _ in range(3)))
    return (
        acceptance_figure(points, expected_tv(points)),
        quality_figure(points),
        speed_figure(points),
        projection_figure(points, int(n_draft), float(cost_ratio)),
    )


def shipped_dial(frontiers: dict, task, n_draft, cost_ratio, temperature):
    """The shipped frontier of `task` (static points, theory line, heads as stars) as measured greedily when
    the sidebar's temperature is 0, else at T = 1 (`frontiers`: {greedy?: shipped_frontiers}): figures,
    note, points."""
    frontier = frontiers[is_greedy(temperature)].get(task)
    if frontier is None:
        note = (
            f"No shipped frontier card for **{task}** with this pair: run the live sweep below, or "
            f"`{FRONTIER_COMMAND}`."
        )
        return (*dial_figures(None, n_draft, cost_ratio, f"no shipped frontier for {task}"), note, None)
    note = f"**Shipped frontier** ({task}): {frontier.note}."
    return (*dial_figures(frontier.points, n_draft, cost_ratio, ""), note, frontier.points)


def respeed(points, n_draft, cost_ratio):
    """Redraw the projection for a new N or c, from the points on show."""
    if points is None or len(points) == 0:
        return gr.skip()
    return projection_figure(points, int(n_draft), float(cost_ratio))


def preset_cost(presets: list[CostPreset], label):
    return next((p.cost_ratio for p in presets if p.label == label), gr.skip())


def sweep_rows(pair, chosen, task, weights, tokens, n_draft, temperature, progress, idle):
    """The frontier rows of static w (and w = 1) and every head of the pair on the chosen examples: a
    generator that yields `idle` after each decode, where a Stop or a disconnect can end it, and returns
    the rows."""
    weights = sorted({float(w) for w in weights} | {1.0})  # w = 1 anchors the E[TV] estimate
    heads = {name: load_head(name, pair) for name in head_choices(pair)}
    total = (len(weights) + len(heads)) * len(chosen)
    steps = sweep_steps(
        pair,
        chosen,
        task,
        weights=weights,
        heads=heads,
        n_draft=int(n_draft),
        max_new_tokens=int(tokens),
        temperature=float(temperature),
    )
    done = 0
    while True:
        try:
            label, _, _ = next(steps)
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
    decodes: (points, figures, note, table)."""
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
        idle = (gr.skip(),) * (len(CHART_IDS) + 3)  # outputs left as they are while the sweep runs
        decoding = (tokens, n_draft, temperature)
        rows = yield from sweep_rows(pair, chosen, task, weights, *decoding, progress, idle)
    points = points_frame(rows, int(n_draft))
    note = (
        f"**Your sweep** ({task}): {len(chosen)} example prompt{'s' if len(chosen) > 1 else ''}, "
        f"N = {int(n_draft)}, T = {float(temperature):g}, ≤{int(tokens)} new tokens, "
        "measured on this machine."
    )
    yield (points, *dial_figures(points, n_draft, cost_ratio, ""), note, points.round(3))


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


def build_dial_charts(figures) -> list[gr.Plot]:
    """The four charts, two to a row: a row that wraps stacks them on a phone."""
    plots = []
    for first in (0, 2):
        with gr.Row():
            plots += [
                gr.Plot(figures[i], show_label=False, elem_id=CHART_IDS[i], min_width=320)
                for i in (first, first + 1)
            ]
    return plots


def build_snippet_box(pair, sidebar: Sidebar, start: DecodeSettings) -> None:
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


def build_sweep_box(pair, examples, sidebar: Sidebar, task, cost_ratio, points, plots, note) -> gr.Button:
    """The live sweep: its settings, its button (redrawing `points`, `plots` and `note`) and its table; the
    button that brings the shipped frontier back, to wire with the task."""
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
        [points, *plots, note, table],
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
    presets = cost_presets()
    start_task = next((t for t in TASKS if t in frontiers[False]), "general")
    *figures, start_note, start_points = shipped_dial(
        frontiers, start_task, start.settings.n_draft, presets[0].cost_ratio, start.settings.temperature
    )
    with gr.Tab("Speed–quality dial", id="dial"):
        gr.Markdown(INTRO)
        task, preset, cost_ratio = build_dial_controls(start_task, presets)
        note = gr.Markdown(start_note, elem_id="dial-note")
        points = gr.State(start_points)
        plots = build_dial_charts(figures)
        gr.Markdown(
            "*The projected speedup is computed from the per-token acceptance α (N from the sidebar); "
            "it is not a measurement.*"
        )
        build_snippet_box(pair, sidebar, start.settings)
        shipped_button = build_sweep_box(pair, examples, sidebar, task, cost_ratio, points, plots, note)

    shipped_inputs = [task, sidebar.n_draft, cost_ratio, sidebar.temperature]
    shipped_outputs = [*plots, note, points]
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
        plots[3],
        api_visibility="private",
    )
