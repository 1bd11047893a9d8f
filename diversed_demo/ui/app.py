"""The Gradio app: the header, the sidebar and the tabs assembled into one Blocks (each tab's components and
wiring live in ui/tabs/), and its launch with the app's stylesheet, theme and script."""

from __future__ import annotations

import html
import warnings
from pathlib import Path

import gradio as gr

from ..common.paths import ASSETS
from ..eval.tasks import Example
from ..models.heads import list_heads
from .examples import load_examples
from .opening import Defaults, arrival_defaults
from .results_summary import bench_here, key_result
from .runs import TrainingJob
from .sidebar import build_sidebar
from .tabs.about import build_about_tab
from .tabs.compare import build_compare_tab
from .tabs.decode import DECODE_CONCURRENCY, build_decode_tab
from .tabs.dial import build_dial_tab
from .tabs.results import build_results_tab
from .tabs.train import build_train_tab

MAX_UPLOAD = "10mb"  # prompt files and traces are far smaller; a larger upload is refused by Gradio
CACHE_CLEANUP = (3600, 3600)  # every hour, delete Gradio's cached files (uploads, outputs) over an hour old
CSS_PATH = ASSETS / "app.css"
QUEUE_SIZE = 64  # past this many waiting requests, new ones are told the queue is full
# Gradio's queue wakes every 1 ms on Linux while it is empty or its slots are busy (a decode holds the one
# slot), and its progress loop every 10 ms: 8-9% of a core, taken from every decode on a 2-core CPU
# (docs/measurements/speed.md, "The server's idle polling"). Waking every 20 ms delays a request's start
# by at most that; the progress bars (Train) move every 0.1 s.
QUEUE_POLL_S, PROGRESS_POLL_S = 0.02, 0.1

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


def short_name(model: str) -> str:
    """A model's name for the header: a local directory by its last two parts, anything else as given."""
    path = Path(model)
    return "/".join(path.parts[-2:]) if path.is_absolute() else model


LEDE = (
    "In <b>speculative decoding</b> a small <b>draft</b> model guesses the next few tokens and the large "
    "<b>target</b> model checks all the guesses in one pass, keeping those it agrees with. DIVERSED "
    "loosens that check with a dial <b>w</b>, so more guesses are kept: the text comes faster and stays "
    "close to the target's. Start with <b>Compare</b>: one prompt, decoded by the target alone, by exact "
    "speculative decoding, with a fixed w, with a per-token rule that relaxes where the draft's token costs "
    "the target little, and with a trained DIVERSED head."
)


def header_html(pair) -> str:
    """The title, what the page shows in plain words, the key measured result with its source, and the
    pair and device."""
    return (
        f'<div class="dd-header"><h1>DIVERSED</h1><p class="dd-lede">{LEDE}</p>'
        f'<p class="dd-headline">{key_result(pair.target_name, bench_here(pair))}</p>'
        f'<p class="dd-pair">Target <code>{html.escape(short_name(pair.target_name))}</code>, draft '
        f"<code>{html.escape(short_name(pair.draft_name))}</code>, on {html.escape(str(pair.device))}.</p>"
        "</div>"
    )


def build_app(
    pair, examples: list[Example] | None = None, job: TrainingJob | None = None, start: Defaults | None = None
) -> gr.Blocks:
    """The Gradio Blocks app for `pair`, opening at `start` (the launchers time the draft length first, see
    opening.measured_opening; by default the cards' settings, untimed). Launch it with `launch(app)` so
    that its CSS and theme apply."""
    examples = load_examples() if examples is None else examples
    job = job or TrainingJob()
    heads = list_heads(pair)
    start = start or arrival_defaults(examples, heads)

    with gr.Blocks(title="DIVERSED demo", delete_cache=CACHE_CLEANUP) as app:
        gr.HTML(header_html(pair))
        sidebar = build_sidebar(app, pair, heads, start)
        with gr.Tabs(elem_id="tabs") as tabs:
            build_decode_tab(pair, examples, sidebar, start)
            build_compare_tab(pair, examples, sidebar, start, tabs)
            build_dial_tab(pair, examples, heads, sidebar, start)
            build_results_tab(heads)
            build_train_tab(app, pair, job, sidebar)
            build_about_tab()
    app.queue(default_concurrency_limit=DECODE_CONCURRENCY, max_size=QUEUE_SIZE)
    slow_queue_polling(app)
    return app


def slow_queue_polling(app: gr.Blocks) -> None:
    """Make the app's queue poll every QUEUE_POLL_S (progress every PROGRESS_POLL_S), not every 1 ms; a
    warning where this Gradio's queue has no such settings (its polling then costs the decodes)."""
    queue = app._queue  # Gradio sets these intervals by platform only (gradio/queueing.py)
    names = ("sleep_when_free", "progress_update_sleep_when_free")
    if not all(hasattr(queue, name) for name in names):
        warnings.warn(
            f"Gradio {gr.__version__}'s queue has no {' or '.join(names)}: its polling is left as it is",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
    queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, PROGRESS_POLL_S)


def launch(app, **kwargs):
    """Launch with the app's stylesheet, theme and script (Gradio 6 takes them at launch, not in Blocks),
    with uploads capped and Gradio's file cache cleaned."""
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
    limits = {"max_file_size": MAX_UPLOAD, **kwargs}
    return app.launch(css_paths=[CSS_PATH], theme=theme, js=NARROW_SCREEN_JS, **limits)
