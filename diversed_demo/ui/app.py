"""The Gradio app, built tab by tab: each tab's components, then its wiring right under them.

The handlers are module-level functions whose first arguments are what the app holds (the pair, the
examples, the training job), bound with `bind`; the tests call them directly. They only convert inputs,
call the plain functions of runs/render/results/trace and turn ValueErrors into gr.Error messages.
"""

from __future__ import annotations

import contextlib
import functools
import html
import importlib.util
import inspect
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from ..common.formatting import fmt
from ..common.paths import ASSETS
from ..core.draft import is_feature_draft
from ..core.prompt import encode_prompt
from ..core.settings import MAX_N_DRAFT, MAX_SEED
from ..eval.costs import choose_n_draft, measure_costs
from ..eval.tasks import TASKS, Example, app_examples
from ..models.heads import HeadError, list_heads, load_head
from ..training import config as train_config
from ..training import loop as train_loop
from . import results
from .render import (
    DIAL_HEIGHT,
    acceptance_figure,
    comparison_charts,
    figure,
    legend_html,
    projection_figure,
    quality_figure,
    render_tokens,
    run_panel_html,
    speed_figure,
    stats_html,
    training_figure,
    w_chart,
)
from .runs import (
    COMPARE_MODES,
    MODE_LABELS,
    MODE_NAMES,
    Comparison,
    DecodeRun,
    DecodeSettings,
    TrainingJob,
    resolve_head,
    speedup,
    stream_comparison,
    stream_decode,
    throttled,
    training_status,
)
from .trace import load_trace, read_trace, run_labels, trace_of, write_trace

CSS_PATH = ASSETS / "app.css"
PAPER_URL = "https://arxiv.org/abs/2604.07622"
CODE_URL = "https://github.com/comeusr/diversed"

UI_INTERVAL_S = 0.1  # streaming: push the text at most this often
CHART_INTERVAL_S = 0.5  # plotly figures are heavier to ship and redraw: push them less often
REPLAY_S = 3.0  # a replayed trace plays back in at most this long, however long the run took
DECODE_CONCURRENCY = 2  # decodes running at once (2 CPU cores on the free Spaces tier)
QUEUE_SIZE = 64  # past this many waiting requests, new ones are told the queue is full
PUBLIC_ENV = "DIVERSED_PUBLIC"  # set to 1 on a public Space: the Train tab is off


def public_space() -> bool:
    return os.environ.get(PUBLIC_ENV, "").strip().lower() not in ("", "0", "false", "no")


def zero_gpu_space() -> bool:
    """Whether this is a ZeroGPU Space (its `spaces` package is installed): a GPU is attached only inside a call."""
    return importlib.util.find_spec("spaces") is not None


def on_gpu(fn):
    """On ZeroGPU Spaces, run `fn` with a GPU attached; elsewhere fn runs as is."""
    if not zero_gpu_space():
        return fn
    import spaces

    return spaces.GPU(fn)


def bind(fn, *held):
    """`fn` with the app's objects as its first arguments, as a plain function Gradio can inspect: same name,
    the remaining parameters (so gr.Request and gr.Progress are still found), a generator if fn is one."""
    if inspect.isgeneratorfunction(fn):

        def bound(*args, **kwargs):
            yield from fn(*held, *args, **kwargs)
    else:

        def bound(*args, **kwargs):
            return fn(*held, *args, **kwargs)

    functools.update_wrapper(bound, fn)
    signature = inspect.signature(fn)
    bound.__signature__ = signature.replace(parameters=list(signature.parameters.values())[len(held) :])
    return bound


@contextlib.contextmanager
def user_errors():
    """Bad input surfaces as a readable gr.Error, never a stack trace."""
    try:
        yield
    except (ValueError, OSError) as err:  # PairError and the heads' errors are ValueErrors too
        raise gr.Error(str(err)) from None


def short_name(model: str) -> str:
    """A model's name for the header: a local directory by its last two parts, anything else as given."""
    path = Path(model)
    return "/".join(path.parts[-2:]) if path.is_absolute() else model


def pair_info(pair) -> dict:
    return {"target": pair.target_name, "draft": pair.draft_name, "device": str(pair.device)}


def settings_from(mode_label, w, head_name, n_draft, max_new_tokens, temperature, seed) -> DecodeSettings:
    if seed is None or not 0 <= float(seed) <= MAX_SEED or float(seed) != int(seed):
        raise ValueError(f"the seed must be an integer from 0 to {MAX_SEED}, not {seed!r}")
    return DecodeSettings(
        mode=MODE_LABELS.get(mode_label, "static"),
        ensemble_weight=float(w),
        head_name=head_name or None,
        n_draft=int(n_draft),
        max_new_tokens=int(max_new_tokens),
        temperature=float(temperature),
        seed=int(seed),
    )


def head_choices(pair) -> list[str]:
    return list(list_heads(pair))  # the user's newest first, then the shipped ones


def refresh_heads(pair, current):
    names = head_choices(pair)
    return gr.update(choices=names, value=current if current in names else (names[0] if names else None))


# ---------------------------------------------------------------- examples


def load_examples() -> list[Example]:
    """The app's example prompts (assets/prompts/examples.json), in the file's order; none if it is unreadable."""
    try:
        return [example for examples in app_examples().values() for example in examples]
    except (OSError, ValueError):
        return []


def example_choices(examples: list[Example]) -> list[tuple[str, int]]:
    """Dropdown choices: "[task] start of the prompt…" → index into `examples`."""

    def label(example):
        text = " ".join(example.prompt.split())
        return f"[{example.task}] {text[:70]}{'…' if len(text) > 70 else ''}"

    return [(label(example), i) for i, example in enumerate(examples)]


def find_example(prompt: str, examples: list[Example]) -> Example | None:
    """The example whose prompt this is (so its task and reference apply), or None for a typed prompt."""
    key = " ".join((prompt or "").split())
    return next((e for e in examples if " ".join(e.prompt.split()) == key), None)


def example_prompt(examples, index):
    return examples[index].prompt if index is not None else gr.skip()


# ---------------------------------------------------------------- Decode

TRACES_DIR = Path(tempfile.gettempdir()) / "diversed-traces"
TRACE_KEEP_S = 3600  # Gradio copies a served file into its own cache; our copy is only needed briefly


def trace_files(runs: dict, pair, view: str) -> list[str]:
    """The runs' trace written to a fresh folder under TRACES_DIR (Gradio serves it from there): [json, csv].
    Folders older than TRACE_KEEP_S go, so a long-running app does not fill the disk."""
    TRACES_DIR.mkdir(exist_ok=True)
    for old in TRACES_DIR.iterdir():
        try:
            expired = time.time() - old.stat().st_mtime > TRACE_KEEP_S
        except FileNotFoundError:  # a concurrent request removed it first
            continue
        if expired:
            shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(dir=TRACES_DIR))
    return list(write_trace(trace_of(runs, pair_info(pair), view), folder, f"diversed-{view}-trace"))


@on_gpu
def on_generate(pair, prompt, mode_label, w, head_name, n_draft, max_new_tokens, temperature, seed):
    """Stream one decode: (tokens HTML, stats HTML, w_t chart, trace files) after each batch of events."""
    last_chart = -math.inf
    with user_errors():
        settings = settings_from(mode_label, w, head_name, n_draft, max_new_tokens, temperature, seed)
        head = resolve_head(pair, settings)
        for run in throttled(stream_decode(pair, prompt, settings, head), UI_INTERVAL_S):
            chart = gr.skip()
            if run.done or time.perf_counter() - last_chart >= CHART_INTERVAL_S:
                chart, last_chart = w_chart(run), time.perf_counter()
            files = trace_files({MODE_NAMES[settings.mode]: run}, pair, "decode") if run.done else gr.skip()
            yield render_tokens(run.events), stats_html(run), chart, files


def read_trace_file(trace_path) -> str:
    if not trace_path:
        raise ValueError("choose a JSON trace file first (one downloaded from Decode or Compare)")
    if str(trace_path).lower().endswith(".csv"):
        raise ValueError("replay reads the JSON trace; the CSV is for spreadsheets")
    try:
        return Path(trace_path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError("not a JSON trace: the file is not text") from None


def on_trace_chosen(trace_path):
    """The runs of the chosen trace, for the replay's run picker (the last, DIVERSED in a comparison, first
    chosen). A bad file leaves the picker empty; Replay then says what is wrong with it."""
    try:
        labels = run_labels(read_trace(read_trace_file(trace_path)))
    except (ValueError, OSError):
        return gr.update(choices=[], value=None)
    return gr.update(choices=labels, value=labels[-1])


def on_replay(trace_path, label=None):
    """Play a JSON trace's run (`label`, else its first) back in the Decode view, without models, at its
    recorded pace compressed to at most REPLAY_S seconds: the same (tokens, stats, chart) as a live decode."""
    with user_errors():
        recorded = load_trace(read_trace_file(trace_path), label)
    shown = DecodeRun(recorded.settings, recorded.prompt)
    end = max(recorded.event_times[-1] if recorded.event_times else 0.0, 1e-9)
    pace = min(1.0, REPLAY_S / end)
    started, last_sent = time.perf_counter(), -math.inf
    for event, at in zip(recorded.events, recorded.event_times):
        time.sleep(max(0.0, at * pace - (time.perf_counter() - started)))
        shown.add(event, elapsed_s=at)
        if time.perf_counter() - last_sent >= CHART_INTERVAL_S:
            last_sent = time.perf_counter()
            yield render_tokens(shown.events), stats_html(shown, replayed=True), w_chart(shown)
    yield render_tokens(recorded.events), stats_html(recorded, replayed=True), w_chart(recorded)


# ---------------------------------------------------------------- Compare


def compare_verdict(comparison: Comparison, running: bool = False) -> str:
    """One line: how much faster DIVERSED (or the static ensemble) ran than target only, its quality against
    exact SD, and whether one prompt can tell (it cannot judge quality: the Results tab can)."""
    label = "DIVERSED" if "DIVERSED" in comparison.runs else "Static ensemble"
    run, base = comparison.runs.get(label), comparison.runs.get("Target only")
    if running or run is None or not run.done:
        return (
            '<div class="dd-verdict" data-state="running">The verdict appears when every mode has run.</div>'
        )
    parts = []
    ratio = speedup(run, base)
    if ratio is not None:
        parts.append(f"{ratio:.2f}× the speed of target only" + (" (slower)" if ratio < 1 else ""))
    parts.append(f"acceptance {fmt(run.acceptance_rate, '.0%')}, τ {fmt(run.tau, '.2f')}")
    value, metric = comparison.quality.get(label, (None, "n/a"))
    exact_value, _ = comparison.quality.get("Exact SD", (None, "n/a"))
    if value is not None and exact_value is not None:
        if metric == "fidelity":  # a mean log-probability: compare in nats, not in percent
            parts.append(f"fidelity {value:.2f} vs {exact_value:.2f} nats/token for exact SD")
        elif exact_value:
            change = (value - exact_value) / abs(exact_value)
            parts.append(
                f"{metric} {'within' if abs(change) <= 0.05 else 'off by'} {abs(change):.0%} "
                f"{'above' if change > 0.05 else 'below' if change < -0.05 else 'of'} exact SD's "
                f"({value:.3f} vs {exact_value:.3f})"
            )
        else:
            parts.append(f"{metric} {value:.3f} vs {exact_value:.3f} for exact SD")
    departs = comparison.departures().get(label)
    parts.append(
        "same tokens as target only"
        if departs is None
        else f"departs from target only at token {departs + 1}"
    )
    caveat = (
        "One prompt is too few to judge quality: the Results tab has the measured tables "
        "(many held-out prompts, with standard errors)."
    )
    return (
        f'<div class="dd-verdict" data-state="done"><b>{html.escape(label)}</b>: {html.escape("; ".join(parts))}.'
        f' <span class="dd-caveat">{html.escape(caveat)}</span></div>'
    )


def comparison_table(comparison: Comparison) -> pd.DataFrame:
    """Speedup over target-only, acceptance, τ, tokens/s and quality of each finished run."""
    baseline = comparison.runs.get("Target only")
    rows = []
    for label in COMPARE_MODES:
        run = comparison.runs.get(label)
        if run is None or not run.done:
            continue
        quality, metric = comparison.quality.get(label, (None, "n/a"))
        ratio = speedup(run, baseline)
        rows.append(
            {
                "mode": label,
                "speedup ×": None if ratio is None else round(ratio, 2),
                "acceptance": None if run.acceptance_rate is None else round(run.acceptance_rate, 3),
                "τ": round(run.tau, 2),
                "tokens/s": round(run.tokens_per_second, 1),
                "tokens": run.new_tokens,
                "quality": fmt(quality),
                "metric": metric,
            }
        )
    return pd.DataFrame(
        rows, columns=["mode", "speedup ×", "acceptance", "τ", "tokens/s", "tokens", "quality", "metric"]
    )


@on_gpu
def on_compare(pair, examples, prompt, w, head_name, n_draft, max_new_tokens, temperature, seed):
    """Stream the comparison: (four panels, two charts, table, verdict, trace files)."""
    example = find_example(prompt, examples)
    last_chart = -math.inf
    with user_errors():
        settings = settings_from("Static ensemble", w, head_name, n_draft, max_new_tokens, temperature, seed)
        comparison = Comparison()
        for comparison in throttled(stream_comparison(pair, prompt, settings, example), UI_INTERVAL_S):
            charts = (gr.skip(), gr.skip())
            if time.perf_counter() - last_chart >= CHART_INTERVAL_S:
                charts, last_chart = comparison_charts(comparison), time.perf_counter()
            yield (
                *[run_panel_html(label, comparison) for label in COMPARE_MODES],
                *charts,
                comparison_table(comparison),
                compare_verdict(comparison, running=True),
                gr.skip(),
            )
        # The last update always carries the final charts, the full table, the verdict and the trace.
        yield (
            *[run_panel_html(label, comparison) for label in COMPARE_MODES],
            *comparison_charts(comparison),
            comparison_table(comparison),
            compare_verdict(comparison),
            trace_files(comparison.runs, pair, "compare"),
        )


# ---------------------------------------------------------------- Speed–quality dial


def dial_figures(points: pd.DataFrame | None, n_draft, cost_ratio, source: str) -> tuple:
    """The dial's four charts (acceptance vs w, quality vs acceptance, measured speed, projected speedup) of
    its points, or empty charts, the first saying what to do."""
    if points is None or points.empty:
        return (figure(source, DIAL_HEIGHT, "", ""), *(figure("", DIAL_HEIGHT, "", "") for _ in range(3)))
    return (
        acceptance_figure(points, results.expected_tv(points)),
        quality_figure(points),
        speed_figure(points),
        projection_figure(points, int(n_draft), float(cost_ratio)),
    )


def head_for_temperature(cards: dict, head_name, temperature):
    choice = results.head_for_temperature(cards, head_name, temperature)
    return gr.skip() if choice is None else choice


def shipped_dial(frontiers: dict, task, n_draft, cost_ratio, temperature):
    """The shipped frontier of `task` (static points, theory line, heads as stars) as measured greedily when
    the sidebar's temperature is 0, else at T = 1 (`frontiers`: {greedy?: shipped_frontiers}): figures,
    note, points."""
    frontier = frontiers[results.is_greedy(temperature)].get(task)
    if frontier is None:
        note = (
            f"No shipped frontier card for **{task}** with this pair: run the live sweep below, or "
            f"`{results.FRONTIER_COMMAND}`."
        )
        return (*dial_figures(None, n_draft, cost_ratio, f"no shipped frontier for {task}"), note, None)
    note = f"**Shipped frontier** ({task}): {frontier.note}."
    return (*dial_figures(frontier.points, n_draft, cost_ratio, ""), note, frontier.points)


def respeed(points, n_draft, cost_ratio):
    """Redraw the projection for a new N or c, from the points on show."""
    if points is None or len(points) == 0:
        return gr.skip()
    return projection_figure(points, int(n_draft), float(cost_ratio))


def preset_cost(presets: list, label):
    return next((p.cost_ratio for p in presets if p.label == label), gr.skip())


@on_gpu
def on_sweep(
    pair, examples, task, n_prompts, weights, tokens, n_draft, temperature, cost_ratio, progress=gr.Progress()
):
    """Re-measure the frontier on the task's example prompts: (points, figures, note, table)."""
    from ..eval.frontier import sweep

    with user_errors():
        chosen = [e for e in examples if e.task == task][: int(n_prompts)]
        if not chosen:
            raise ValueError(f"no example prompts for task {task!r} (assets/prompts/examples.json)")
        if not weights:
            raise ValueError("tick at least one static w to try")
        weights = sorted({float(w) for w in weights} | {1.0})  # w = 1 anchors the E[TV] estimate
        heads = {name: load_head(name, pair) for name in head_choices(pair)}
        total, done = (len(weights) + len(heads)) * len(chosen), 0

        def report(label, _index, _count):
            nonlocal done
            done += 1
            progress(done / total, desc=f"{label}: {done}/{total} decodes")

        rows = [
            p.row()
            for p in sweep(
                pair,
                chosen,
                task,
                weights=weights,
                heads=heads,
                progress=report,
                n_draft=int(n_draft),
                max_new_tokens=int(tokens),
                temperature=float(temperature),
            )
        ]
    points = results.points_frame(rows, int(n_draft))
    note = (
        f"**Your sweep** ({task}): {len(chosen)} example prompt{'s' if len(chosen) > 1 else ''}, "
        f"N = {int(n_draft)}, T = {float(temperature):g}, ≤{int(tokens)} new tokens, measured on this machine."
    )
    return (points, *dial_figures(points, n_draft, cost_ratio, ""), note, points.round(3))


def snippet(pair, w, temperature, max_new_tokens) -> str:
    local = not all(
        isinstance(name, str) and "/" in name and not Path(name).expanduser().exists()
        for name in (pair.target_name, pair.draft_name)
    )
    return results.transformers_snippet(
        pair.target_name,
        pair.draft_name,
        float(w),
        float(temperature),
        int(max_new_tokens),
        feature_draft=is_feature_draft(pair.draft),
        local=local,
    )


# ---------------------------------------------------------------- Train


def on_start_training(pair, job, task, source, upload, steps, rollouts, lam, lr, request: gr.Request):
    with user_errors():
        if public_space():
            raise ValueError(
                f"training is off on this public Space ({PUBLIC_ENV} is set); "
                "run the app locally to train heads"
            )
        if source == "Uploaded JSONL" and not upload:
            raise ValueError("upload a .jsonl file of prompts first, or choose the built-in examples")
        config = train_config.HeadTrainConfig(
            task=task,
            prompts_path=upload if source == "Uploaded JSONL" else None,
            steps=int(steps),
            rollouts_per_prompt=int(rollouts),
            lam=float(lam),
            lr=float(lr),
        )
        # Check settings and prompts here, so that a bad upload is an error message, not a failed run.
        train_config.check_config(config)
        train_config.training_examples(config)
    started = job.start(
        lambda callback, should_stop: train_loop.train_head(
            pair, config, callback=callback, should_stop=should_stop, progress=False
        ),
        owner=request.session_hash if request else None,
    )
    if not started:
        gr.Warning("A training run is already in progress; wait for it to finish.")
        return
    while job.running:
        yield training_figure(job.history), training_status(job, int(steps)), gr.skip()
        time.sleep(0.5)
    if job.error:
        gr.Warning(f"Training failed: {job.error}")
    new_head = job.result.path.stem if job.result is not None and job.result.path else None
    yield training_figure(job.history), training_status(job, int(steps)), refresh_heads(pair, new_head)


def on_cancel_training(job, request: gr.Request):
    if not job.cancel(owner=request.session_hash if request else None):
        gr.Warning("No training run of yours is in progress.")
        return gr.skip()
    return training_status(job)


def task_defaults(task):
    config = train_config.HeadTrainConfig(task=task)
    return config.lam, config.lr


# ---------------------------------------------------------------- About

ABOUT_MD = f"""
## How it works
A small **draft** model proposes N tokens; the **target** model scores all of them in one forward pass.
Each drafted token x is kept with probability

$$\\min\\left(1, \\frac{{\\nu(x)}}{{q(x)}}\\right), \\qquad \\nu = w\\,p + (1 - w)\\,q$$

where p is the target's and q the draft's distribution. On a rejection a token is drawn from
norm(max(0, p − q)); when all N pass, a **bonus** token comes from the target.

* **Exact speculative decoding** is w = 1: the output follows the target's distribution exactly.
* **Static ensemble**: one w for every token. The acceptance rate is then 1 − w·TV(p, q): lower w
  accepts more drafts (faster) and moves the output towards the draft.
* **DIVERSED** learns a small head that predicts a per-token w_t from both models' hidden states,
  trained with sequence-level RL to keep quality where it matters and relax where it does not.

## Colours
{legend_html()}

Hover any token to see w_t, p(x), q(x) and its acceptance probability.

## Credits
* DIVERSED: Relaxed Speculative Decoding via Dynamic Ensemble Verification, Ziyi Wang et al.
  (AISTATS 2026) — [paper]({PAPER_URL}), [code]({CODE_URL}). This demo is an independent re-implementation.
* [SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct) by Hugging Face (Apache-2.0),
  the embedded target.
* Speculative decoding: Leviathan, Kalman & Matias, *Fast Inference from Transformers via Speculative Decoding*
  (ICML 2023); Chen et al., *Accelerating Large Language Model Decoding with Speculative Sampling* (2023).
"""


# ---------------------------------------------------------------- the app


def opening_draft_length(pair, examples, start: results.Defaults) -> results.Defaults:
    """`start` at the draft length that pays on this machine for its example and settings: the draft's and
    the verification's costs timed, and the example decoded for 32 tokens to measure its acceptance (about
    5.5 s for the embedded pair on 2 CPU cores), as `bench --n-draft auto` chooses. Kept as is on ZeroGPU
    Spaces, where a GPU is attached only inside a call, and where the opening head does not load (the
    Decode tab then says why, on use)."""
    settings = start.settings
    if start.example_index is None or zero_gpu_space():
        return start
    prompt = examples[start.example_index].prompt
    try:
        head = load_head(settings.head_name, pair) if settings.mode == "dynamic" else None
    except HeadError:
        return start
    mode = {"mode": settings.mode, "ensemble_weight": settings.ensemble_weight, "head": head}
    costs = measure_costs(
        pair, encode_prompt(pair.tokenizer, prompt), range(1, 7), rounds=1, calls=10, draft_tokens=16
    )
    chosen = choose_n_draft(
        pair,
        {"opening": mode},
        costs,
        [prompt],
        32,
        settings.temperature,
        settings.seed,
        probe_n_draft=settings.n_draft,
    )["opening"]
    return results.with_draft_length(start, chosen["n_draft"], chosen["calibration_alpha"], costs)


def build_app(pair, examples: list[Example] | None = None, job: TrainingJob | None = None):
    """The Gradio Blocks app for `pair`. Launch it with `launch(app)` so that its CSS and theme apply."""
    examples = load_examples() if examples is None else examples
    job = job or TrainingJob()
    choices = example_choices(examples)
    heads_now = list_heads(pair)
    start = opening_draft_length(pair, examples, results.arrival_defaults(examples, heads_now))
    first_prompt = examples[start.example_index].prompt if start.example_index is not None else ""
    frontiers = {
        greedy: results.shipped_frontiers(heads_now, 0.0 if greedy else 1.0) for greedy in (False, True)
    }
    presets = results.cost_presets()
    public = public_space()

    with gr.Blocks(title="DIVERSED demo") as app:
        gr.HTML(
            '<div class="dd-header"><h1>DIVERSED</h1><p>Relaxed speculative decoding with dynamic ensemble '
            f"verification. Target <code>{html.escape(short_name(pair.target_name))}</code>, draft "
            f"<code>{html.escape(short_name(pair.draft_name))}</code>, "
            f"on {html.escape(str(pair.device))}.</p>"
            f'<p class="dd-headline">{results.headline(heads_now)}</p></div>'
        )

        with gr.Sidebar(label="Decoding settings", open=True, elem_id="sidebar"):
            gr.Markdown(
                f"### Decoding settings\nShared by Decode, Compare and the dial. They start at the "
                f"{start.note}."
            )
            w = gr.Slider(
                0,
                1,
                value=start.settings.ensemble_weight,
                step=0.05,
                label="static ensemble weight w",
                info="1 = exact SD; lower accepts more drafts",
                elem_id="w-slider",
            )
            head = gr.Dropdown(
                list(heads_now),
                value=start.settings.head_name,
                label="DIVERSED head",
                info="trained heads for this pair; train one in the Train tab",
                elem_id="head",
            )
            n_draft = gr.Slider(
                1,
                min(MAX_N_DRAFT, 12),
                value=start.settings.n_draft,
                step=1,
                label="draft tokens per step N",
                elem_id="n-draft",
            )
            max_new_tokens = gr.Slider(
                8, 512, value=start.settings.max_new_tokens, step=8, label="max new tokens"
            )
            temperature = gr.Slider(
                0,
                2,
                value=start.settings.temperature,
                step=0.05,
                label="temperature",
                info="0 = greedy",
                elem_id="temperature",
            )
            seed = gr.Number(
                start.settings.seed, precision=0, minimum=0, maximum=MAX_SEED, label="seed", elem_id="seed"
            )

        # A task with a head for each kind of decoding: moving to or from greedy switches to the other.
        temperature.change(
            bind(head_for_temperature, results.head_cards(heads_now)),
            [head, temperature],
            head,
            api_visibility="private",
        )

        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Decode", id="decode"):
                with gr.Row():
                    decode_example = gr.Dropdown(
                        choices, value=start.example_index, label="example prompt", scale=2, min_width=240
                    )
                    mode = gr.Radio(
                        list(MODE_LABELS),
                        value=MODE_NAMES[start.settings.mode],
                        label="mode",
                        scale=2,
                        min_width=240,
                        info="w and the head are set in the sidebar",
                        elem_id="mode",
                    )
                prompt = gr.Textbox(
                    first_prompt,
                    label="prompt",
                    lines=3,
                    max_lines=12,
                    elem_id="prompt",
                    placeholder="Type a prompt or pick an example",
                )
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", scale=4, elem_id="generate")
                    stop_button = gr.Button("Stop", variant="secondary", scale=1, elem_id="stop")
                gr.HTML(legend_html())
                tokens = gr.HTML(render_tokens([]), elem_id="tokens")
                stats = gr.HTML(stats_html(None), elem_id="stats")
                w_plot = gr.Plot(w_chart(None), show_label=False, elem_id="w-chart")
                with gr.Accordion(
                    "Trace: download this run, or replay one without models", open=False, elem_id="trace-box"
                ):
                    decode_trace = gr.File(
                        label="trace of the last run (JSON to replay, CSV for spreadsheets)",
                        file_count="multiple",
                        interactive=False,
                        elem_id="decode-trace",
                    )
                    with gr.Row():
                        replay_file = gr.File(
                            label="a JSON trace to replay",
                            file_types=[".json"],
                            type="filepath",
                            height=120,
                            elem_id="replay-file",
                        )
                        replay_run = gr.Dropdown(
                            [], label="run", elem_id="replay-run", min_width=160, scale=0
                        )
                        replay_button = gr.Button("Replay", elem_id="replay", scale=0, min_width=120)

                decode_example.change(
                    bind(example_prompt, examples), decode_example, prompt, api_visibility="private"
                )
                decode_inputs = [prompt, mode, w, head, n_draft, max_new_tokens, temperature, seed]
                # Decode, Compare and the dial share one pool of DECODE_CONCURRENCY slots: they compete for the CPU.
                decoding = gr.on(
                    [generate_button.click, prompt.submit],
                    bind(on_generate, pair),
                    decode_inputs,
                    [tokens, stats, w_plot, decode_trace],
                    concurrency_id="decode",
                    concurrency_limit=DECODE_CONCURRENCY,
                    api_name="generate",
                )
                stop_button.click(None, cancels=[decoding])
                replay_file.change(on_trace_chosen, replay_file, replay_run, api_visibility="private")
                replay_button.click(
                    on_replay,
                    [replay_file, replay_run],
                    [tokens, stats, w_plot],
                    api_name="replay",
                    concurrency_limit=None,
                )

            with gr.Tab("Compare", id="compare"):
                gr.Markdown(
                    "One prompt through each mode in turn, **all with the same seed**, so differences come "
                    "from the verifier alone. Static uses the sidebar's w, DIVERSED its head. ▶ marks the "
                    "first token where an output departs from target-only decoding (at temperature 0 exact SD "
                    "never departs; above 0 it may, since its random draws differ while its law is the "
                    "target's)."
                )
                with gr.Row():
                    compare_example = gr.Dropdown(
                        choices, value=start.example_index, label="example prompt", scale=3, min_width=240
                    )
                    compare_button = gr.Button(
                        "Run compare", variant="primary", scale=1, min_width=120, elem_id="compare"
                    )
                compare_prompt = gr.Textbox(
                    first_prompt, label="prompt", lines=2, max_lines=8, elem_id="compare-prompt"
                )
                with gr.Row(elem_classes="dd-verdict-row"):
                    verdict = gr.HTML(compare_verdict(Comparison()), elem_id="compare-verdict", min_width=260)
                    results_link = gr.Button(
                        "Measured results →", size="sm", scale=0, min_width=160, elem_id="results-link"
                    )
                gr.HTML(legend_html())
                with gr.Row(equal_height=False):
                    panels = [
                        gr.HTML(
                            run_panel_html(label, Comparison()), elem_classes="dd-panel-box", min_width=220
                        )
                        for label in COMPARE_MODES
                    ]
                with gr.Row():
                    acceptance_plot = gr.Plot(show_label=False, elem_id="compare-acceptance", min_width=300)
                    elapsed_plot = gr.Plot(show_label=False, elem_id="compare-elapsed", min_width=300)
                compare_summary = gr.Dataframe(
                    comparison_table(Comparison()),
                    label="summary",
                    interactive=False,
                    elem_id="compare-table",
                )
                compare_trace = gr.File(
                    label="trace of the comparison (JSON to replay in Decode, CSV)",
                    file_count="multiple",
                    interactive=False,
                    elem_id="compare-trace",
                )

                compare_example.change(
                    bind(example_prompt, examples), compare_example, compare_prompt, api_visibility="private"
                )
                compare_button.click(
                    bind(on_compare, pair, examples),
                    [compare_prompt, w, head, n_draft, max_new_tokens, temperature, seed],
                    [*panels, acceptance_plot, elapsed_plot, compare_summary, verdict, compare_trace],
                    concurrency_id="decode",
                    api_name="compare",
                )
                results_link.click(lambda: gr.Tabs(selected="results"), None, tabs, api_visibility="private")

            with gr.Tab("Speed–quality dial", id="dial"):
                tasks_with_cards = [t for t in TASKS if t in frontiers[False]]
                dial_start = tasks_with_cards[0] if tasks_with_cards else "general"
                *figures_start, note_start, points_start = shipped_dial(
                    frontiers,
                    dial_start,
                    start.settings.n_draft,
                    presets[0].cost_ratio,
                    start.settings.temperature,
                )
                gr.Markdown(
                    "Acceptance against quality for each static w, with the theory line 1 − w·E[TV] "
                    "(E[TV] from the w = 1 point) and the trained heads as stars; the projected speedup at a "
                    "draft/target cost ratio c you choose. Quality is the task's reward: ROUGE-2 "
                    "(summarization), final-number match (math), pass@1 (code) or fidelity to the target "
                    "(general)."
                )
                with gr.Row():
                    dial_task = gr.Dropdown(
                        list(TASKS),
                        value=dial_start,
                        label="task",
                        elem_id="dial-task",
                        info="tasks with a shipped frontier card draw it at once",
                        min_width=200,
                    )
                    cost_preset = gr.Dropdown(
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
                dial_note = gr.Markdown(note_start, elem_id="dial-note")
                dial_points = gr.State(points_start)
                with gr.Row():
                    acceptance_plot_dial = gr.Plot(
                        figures_start[0], show_label=False, elem_id="dial-acceptance", min_width=320
                    )
                    quality_plot = gr.Plot(
                        figures_start[1], show_label=False, elem_id="dial-quality", min_width=320
                    )
                with gr.Row():
                    speed_plot = gr.Plot(
                        figures_start[2], show_label=False, elem_id="dial-speed", min_width=320
                    )
                    projection_plot = gr.Plot(
                        figures_start[3], show_label=False, elem_id="dial-projection", min_width=320
                    )
                dial_plots = [acceptance_plot_dial, quality_plot, speed_plot, projection_plot]
                gr.Markdown(
                    "*The projected speedup is computed from the per-token acceptance α (N from the sidebar); "
                    "it is not a measurement.*"
                )
                with gr.Accordion(
                    "Take the dial to your own pair: transformers' assisted generation with the sidebar's w",
                    open=True,
                ):
                    code = gr.Code(
                        snippet(
                            pair,
                            start.settings.ensemble_weight,
                            start.settings.temperature,
                            start.settings.max_new_tokens,
                        ),
                        language="python",
                        elem_id="dial-snippet",
                        interactive=False,
                    )
                with gr.Accordion(
                    "Live sweep: re-measure on your machine and the example prompts", open=False
                ):
                    with gr.Row():
                        dial_prompts = gr.Slider(1, 8, value=2, step=1, label="prompts", min_width=160)
                        dial_tokens = gr.Slider(
                            8, 128, value=32, step=8, label="new tokens per prompt", min_width=160
                        )
                        dial_weights = gr.CheckboxGroup(
                            [0.0, 0.25, 0.5, 0.75, 1.0],
                            value=[0.0, 0.5, 1.0],
                            label="static w to try",
                            min_width=200,
                        )
                    with gr.Row():
                        sweep_button = gr.Button("Run sweep", variant="primary", elem_id="sweep")
                        shipped_button = gr.Button("Show the shipped frontier again", elem_id="shipped")
                    dial_table = gr.Dataframe(label="sweep results", interactive=False)

                shipped_inputs = [dial_task, n_draft, cost_ratio, temperature]
                shipped_outputs = [*dial_plots, dial_note, dial_points]
                dial_task.change(
                    bind(shipped_dial, frontiers), shipped_inputs, shipped_outputs, api_visibility="private"
                )
                shipped_button.click(
                    bind(shipped_dial, frontiers), shipped_inputs, shipped_outputs, api_visibility="private"
                )
                cost_preset.change(
                    bind(preset_cost, presets), cost_preset, cost_ratio, api_visibility="private"
                )
                gr.on(
                    [cost_ratio.change, n_draft.release],
                    respeed,
                    [dial_points, n_draft, cost_ratio],
                    projection_plot,
                    api_visibility="private",
                )
                gr.on(
                    [w.change, temperature.change, max_new_tokens.change],
                    bind(snippet, pair),
                    [w, temperature, max_new_tokens],
                    code,
                    api_visibility="private",
                )
                sweep_button.click(
                    bind(on_sweep, pair, examples),
                    [dial_task, dial_prompts, dial_weights, dial_tokens, n_draft, temperature, cost_ratio],
                    [dial_points, *dial_plots, dial_note, dial_table],
                    concurrency_id="decode",
                    api_name="sweep",
                )

            with gr.Tab("Results", id="results"):
                gr.Markdown(
                    "Measured results, drawn from the files the project ships (each says which command "
                    "wrote it). **Heads against the static frontier** (from `heads/<name>.json`): held-out "
                    "Spec-Bench first turns, the same seed per prompt for every setting; the margin is the "
                    "head's quality minus the static frontier's at the head's acceptance, ± a bootstrap "
                    "standard error over prompts."
                )
                frontier_rows = results.frontier_table(heads_now)
                if frontier_rows.empty:
                    gr.Markdown(
                        f"*No head of this pair has a frontier card. Written by* `{results.FRONTIER_COMMAND}`."
                    )
                else:
                    gr.Dataframe(frontier_rows, interactive=False, elem_id="results-frontier", wrap=True)
                for name in results.BENCH_REPORTS:
                    gr.Markdown(f"### {name}\n\n{results.bench_markdown(name)}", elem_classes="dd-results")

            with gr.Tab("Train", id="train"):
                if public:
                    gr.Markdown(
                        f"Training is off on this public Space (`{PUBLIC_ENV}` is set): a run would hold "
                        "the shared CPU for minutes. Run the app locally (`make demo`) to train heads.",
                        elem_id="train-off",
                    )
                gr.Markdown(
                    "Train a DIVERSED head with sequence-level RL. One run at a time; decoding keeps "
                    "working meanwhile. The head is saved to your heads folder and appears in the "
                    "sidebar's dropdown."
                )
                with gr.Row():
                    train_task = gr.Dropdown(
                        list(TASKS),
                        value="general",
                        label="task",
                        min_width=200,
                        info="the reward: ROUGE-2, math match, pass@1, or fidelity (general)",
                    )
                    train_source = gr.Radio(
                        ["Built-in examples", "Uploaded JSONL"],
                        value="Built-in examples",
                        label="prompts",
                        min_width=200,
                    )
                    train_upload = gr.File(
                        label='prompts (.jsonl): one {"prompt", "reference"?} per line',
                        file_types=[".jsonl"],
                        type="filepath",
                        visible=False,
                        height=120,
                        elem_id="train-upload",
                    )
                with gr.Row():
                    defaults = train_config.HeadTrainConfig(task="general")
                    train_steps = gr.Slider(
                        1,
                        200,
                        value=defaults.steps,
                        step=1,
                        label="steps",
                        elem_id="train-steps",
                        min_width=160,
                    )
                    train_rollouts = gr.Slider(
                        2,
                        8,
                        value=defaults.rollouts_per_prompt,
                        step=1,
                        min_width=160,
                        label="rollouts per prompt",
                        elem_id="train-rollouts",
                    )
                    train_lam = gr.Slider(
                        0, 10, value=defaults.lam, step=0.05, label="λ (speed vs quality)", min_width=160
                    )
                    train_lr = gr.Number(defaults.lr, label="learning rate", min_width=160)
                with gr.Row():
                    train_button = gr.Button(
                        "Start training", variant="primary", elem_id="train-start", interactive=not public
                    )
                    cancel_button = gr.Button(
                        "Cancel", variant="stop", elem_id="train-cancel", interactive=not public
                    )
                train_status = gr.Markdown("Idle.", elem_id="train-status")
                train_plot = gr.Plot(training_figure([]), show_label=False)

                train_source.change(
                    lambda source: gr.update(visible=source == "Uploaded JSONL"),
                    train_source,
                    train_upload,
                    api_visibility="private",
                )
                train_task.change(task_defaults, train_task, [train_lam, train_lr], api_visibility="private")
                # Training itself runs in the job's thread; these handlers only start, poll and cancel it, so they
                # get their own small pool instead of holding decoding slots.
                train_button.click(
                    bind(on_start_training, pair, job),
                    [
                        train_task,
                        train_source,
                        train_upload,
                        train_steps,
                        train_rollouts,
                        train_lam,
                        train_lr,
                    ],
                    [train_plot, train_status, head],
                    concurrency_id="train",
                    concurrency_limit=4,
                    api_name="train",
                )
                cancel_button.click(
                    bind(on_cancel_training, job),
                    None,
                    train_status,
                    concurrency_limit=None,
                    api_name="cancel_training",
                )

            with gr.Tab("About", id="about"):
                gr.Markdown(ABOUT_MD, elem_classes="dd-about")

        app.load(bind(refresh_heads, pair), head, head, api_visibility="private")
        # A run started by another visitor is shown to everyone: there is only one at a time.
        app.load(lambda: training_status(job), None, train_status, api_visibility="private")
    app.queue(default_concurrency_limit=DECODE_CONCURRENCY, max_size=QUEUE_SIZE)
    return app


# On a phone the open sidebar covers the whole page: start it closed there (its toggle still opens it).
# Gradio renders the sidebar after this script starts, so wait for it a little.
NARROW_SCREEN_JS = """
() => {
  if (window.innerWidth > 720) return;
  let tries = 0;
  const close = () => {
    const toggle = document.querySelector('#sidebar.open .toggle-button');
    if (toggle) toggle.click(); else if (tries++ < 50) setTimeout(close, 100);
  };
  close();
}
"""


def launch(app, **kwargs):
    """Launch with the app's stylesheet, theme and script (Gradio 6 takes them at launch, not in Blocks)."""
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
    return app.launch(css_paths=[CSS_PATH], theme=theme, js=NARROW_SCREEN_JS, **kwargs)
