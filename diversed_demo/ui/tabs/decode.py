"""The Decode tab: one prompt decoded in one mode, streamed as coloured tokens with live statistics and the
w_t chart; its trace to download, or a trace replayed without models."""

from __future__ import annotations

import math
import time
from pathlib import Path

import gradio as gr

from ...eval.tasks import Example
from ...runtime.model_thread import MODEL_THREAD
from ..examples import example_choices, opening_prompt
from ..handlers import DECODE_SLOTS, bind, example_prompt, user_errors
from ..opening import Defaults
from ..render import MODE_LABELS, legend_html, render_tokens, stats_html, tree_steps_html, w_chart
from ..runs import APP_CONFIG, DecodeRun, resolve_head, stream_decode, throttled
from ..sidebar import Sidebar, settings_from
from ..space import on_gpu
from ..trace import load_trace, read_trace, run_labels, trace_files

UI_INTERVAL_S = 0.25  # streaming: push the text at most this often
CHART_INTERVAL_S = 1.0  # plotly figures are heavier to ship and redraw: push them less often
REPLAY_S = 3.0  # a replayed trace plays back in at most this long, however long the run took
REPLAY_CONCURRENCY = 4  # replays at once: each holds a worker for up to REPLAY_S
MAX_TRACE_BYTES = 5_000_000  # a 512-token Compare trace is about 1 MB
DECODE_CONCURRENCY = 2  # decodes running at once (2 CPU cores on the free Spaces tier)


@on_gpu
def on_generate(
    pair,
    prompt,
    mode,
    w,
    head_name,
    n_draft,
    max_new_tokens,
    temperature,
    seed,
    lam=APP_CONFIG.lam,
    auto_n=False,
    drafts="as the runtime chose",
    request: gr.Request = None,
):
    """Stream one decode: (tokens HTML with the last draft trees under them, stats HTML, w_t chart, trace
    files) after each batch of events."""
    # The first chart a chart interval in: one at the start shows nothing. A chart is sent only where it has
    # new points (target-only's has none): building one costs milliseconds the decode shares.
    last_chart, charted, run = time.perf_counter(), None, None
    with user_errors():
        settings = settings_from(
            mode, w, head_name, n_draft, max_new_tokens, temperature, seed, lam, auto_n, drafts
        )
        head = MODEL_THREAD.call(resolve_head, pair, settings)
        with DECODE_SLOTS.hold(request):
            decoding = MODEL_THREAD.iterate(lambda: stream_decode(pair, prompt, settings, head))
            for run in throttled(decoding, UI_INTERVAL_S):
                if run.done:
                    break
                chart = gr.skip()
                if time.perf_counter() - last_chart >= CHART_INTERVAL_S and charted != w_points(run):
                    chart, charted, last_chart = w_chart(run), w_points(run), time.perf_counter()
                yield decoded_html(run), stats_html(run), chart, gr.skip()
        # The visitor's slot is free before the page shows the run as done: they may go again at once. One
        # last update, the run shown done with its chart and trace: an update after the one that shows it
        # done could land on a replay or a decode the visitor started meanwhile.
        if run is not None:
            files = trace_files({MODE_LABELS[settings.mode]: run}, pair, "decode") if run.done else gr.skip()
            chart = w_chart(run) if charted != w_points(run) else gr.skip()
            yield decoded_html(run), stats_html(run), chart, files


def w_points(run: DecodeRun) -> int:
    """How many points the run's w_t chart has."""
    return sum(event.w is not None for event in run.events)


def decoded_html(run: DecodeRun) -> str:
    """A decode's tokens, and under them its last draft trees where it drafted trees."""
    return render_tokens(run.events) + tree_steps_html(run.events)


def read_trace_file(trace_path) -> str:
    """The text of the chosen trace: a JSON file, or a ValueError saying what to choose instead."""
    if not trace_path:
        raise ValueError("choose a JSON trace file first (one downloaded from Decode or Compare)")
    if str(trace_path).lower().endswith(".csv"):
        raise ValueError("replay reads the JSON trace; the CSV is for spreadsheets")
    size = Path(trace_path).stat().st_size
    if size > MAX_TRACE_BYTES:
        raise ValueError(
            f"the trace is {size / 1e6:.1f} MB; replay reads traces of up to {MAX_TRACE_BYTES / 1e6:g} MB"
        )
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
    end = max(recorded.event_times[-1] if recorded.event_times else 0.0, 1e-9)  # times never decrease
    pace = min(1.0, REPLAY_S / end)
    started, last_sent = time.perf_counter(), -math.inf
    for event, at in zip(recorded.events, recorded.event_times):
        time.sleep(min(REPLAY_S, max(0.0, at * pace - (time.perf_counter() - started))))
        shown.add(event, elapsed_s=at)
        if time.perf_counter() - last_sent >= CHART_INTERVAL_S:
            last_sent = time.perf_counter()
            yield decoded_html(shown), stats_html(shown, replayed=True), w_chart(shown)
    yield decoded_html(recorded), stats_html(recorded, replayed=True), w_chart(recorded)


def build_trace_box(tokens, stats, w_plot) -> gr.File:
    """The Trace fold: the last run's files, and a trace to replay into the view; its download box."""
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
            replay_run = gr.Dropdown([], label="run", elem_id="replay-run", min_width=160, scale=0)
            replay_button = gr.Button("Replay", elem_id="replay", scale=0, min_width=120)

    replay_file.change(on_trace_chosen, replay_file, replay_run, api_visibility="private")
    replay_button.click(
        on_replay,
        [replay_file, replay_run],
        [tokens, stats, w_plot],
        api_name="replay",
        concurrency_limit=REPLAY_CONCURRENCY,
        concurrency_id="replay",
    )
    return decode_trace


def build_decode_tab(pair, examples: list[Example], sidebar: Sidebar, start: Defaults) -> None:
    """The Decode tab at the opening example and mode (`start`)."""
    with gr.Tab("Decode", id="decode"):
        with gr.Row():
            example = gr.Dropdown(
                example_choices(examples),
                value=start.example_index,
                label="example prompt",
                scale=2,
                min_width=240,
            )
            mode = gr.Radio(
                [(label, code) for code, label in MODE_LABELS.items()],
                value=start.settings.mode,
                label="mode",
                scale=2,
                min_width=240,
                info="w, λ and the head are set in the sidebar",
                elem_id="mode",
            )
        prompt = gr.Textbox(
            opening_prompt(examples, start.example_index),
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
        decode_trace = build_trace_box(tokens, stats, w_plot)

    example.change(bind(example_prompt, examples), example, prompt, api_visibility="private")
    # Decode, Compare and the dial share one pool of DECODE_CONCURRENCY slots: they compete for the CPU.
    decoding = gr.on(
        [generate_button.click, prompt.submit],
        bind(on_generate, pair),
        [prompt, mode, *sidebar.inputs],
        [tokens, stats, w_plot, decode_trace],
        concurrency_id="decode",
        concurrency_limit=DECODE_CONCURRENCY,
        api_name="generate",
    )
    stop_button.click(None, cancels=[decoding])
