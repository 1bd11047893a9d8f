"""The Gradio app: a thin layer over plain functions that render the decoder's events.

Everything with logic in it (events → HTML, live statistics, the compare runs, the projected speedup,
the training job) is a plain function or class above `build_app`, called directly by the tests; the
Gradio handlers only convert inputs, call them and turn ValueErrors into gr.Error messages.
"""
from __future__ import annotations

import contextlib
import html
import json
import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import train
from .theory import alpha_from_acceptance, analytic_speedup
from .decode import MAX_N_DRAFT, MAX_SEED, Summary, encode_prompt, speculative_generate
from .head import list_heads, load_head
from .models import ASSETS, EMBEDDED_DRAFT_DIR
from .rewards import fidelity, task_reward
from .tasks import REFERENCE_TASKS, TASKS, Example, app_examples

CSS_PATH = ASSETS / "app.css"
PAPER_URL = "https://arxiv.org/abs/2604.07622"
CODE_URL = "https://github.com/comeusr/diversed"

UI_INTERVAL_S = 0.1  # streaming: push the text at most this often
CHART_INTERVAL_S = 0.5  # plotly figures are heavier to ship and redraw: push them less often
MAX_PROMPT_CHARS = 4000
DECODE_CONCURRENCY = 2  # decodes running at once (2 CPU cores on the free Spaces tier)
QUEUE_SIZE = 64  # past this many waiting requests, new ones are told the queue is full

MODE_LABELS = {"Target only": "ar", "Exact SD": "exact", "Static ensemble": "static", "DIVERSED": "dynamic"}
KIND_LABELS = {
    "accepted": "accepted draft token",
    "rejected": "rejected draft token",
    "resampled": "resampled from the residual",
    "bonus": "bonus token from the target",
    "ar": "target-only token",
}
# Same hues as the token classes in assets/app.css.
KIND_COLORS = {"accepted": "#16a34a", "rejected": "#dc2626", "resampled": "#d97706", "bonus": "#2563eb",
               "ar": "#64748b"}

# Shown when assets/prompts/examples.json is missing: one or two per task, enough to try every mode.
BUILTIN_EXAMPLES = [
    Example("Summarize in one sentence: The city council voted on Tuesday to turn the old rail yard into a public "
            "park with a playground, a community garden and a bike path. Construction starts next spring and is "
            "paid for by a state grant.", "summarization",
            "The city council approved turning the old rail yard into a grant-funded public park, with "
            "construction starting next spring.", "builtin/summarization/0"),
    Example("Tom has 3 boxes with 12 apples each. He gives away 10 apples. How many apples does he have left?",
            "math", "3 * 12 = 36 apples; 36 - 10 = 26.\n#### 26", "builtin/math/0"),
    Example("A train travels 60 km per hour for 2.5 hours. How far does it go in km?", "math",
            "60 * 2.5 = 150.\n#### 150", "builtin/math/1"),
    Example("Write a Python function is_palindrome(s) that returns True if the string s reads the same forwards "
            "and backwards, ignoring case.", "code", id="builtin/code/0"),
    Example("Give me three tips for sleeping better.", "general", id="builtin/general/0"),
    Example("What is the difference between weather and climate?", "general", id="builtin/general/1"),
]


# ---------------------------------------------------------------- examples and optional modules

def load_examples() -> list[Example]:
    """The app's example prompts (assets/prompts/examples.json via diversed_demo.tasks), else built-in ones."""
    try:
        return [example for examples in app_examples().values() for example in examples] or list(BUILTIN_EXAMPLES)
    except (OSError, ValueError):
        return list(BUILTIN_EXAMPLES)


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


# ---------------------------------------------------------------- decoding runs

@dataclass
class DecodeSettings:
    mode: str = "static"
    ensemble_weight: float = 0.5
    head_name: str | None = None
    n_draft: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    seed: int = 0


def check_prompt(prompt: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty: type one or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is {len(prompt)} characters long; the demo takes at most {MAX_PROMPT_CHARS}")
    return prompt


def resolve_head(pair, settings: DecodeSettings):
    """The head a DIVERSED run needs (None for the other modes)."""
    if settings.mode != "dynamic":
        return None
    if not settings.head_name:
        raise ValueError("DIVERSED needs a trained head: pick one in the sidebar or train one in the Train tab")
    return load_head(settings.head_name, pair)  # a name in the heads folders, or a path


@dataclass
class DecodeRun:
    """One decode as it streams: its events so far, live statistics, then the decoder's Summary."""
    settings: DecodeSettings
    events: list = field(default_factory=list)
    summary: Summary | None = None
    started: float = field(default_factory=time.perf_counter)
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    elapsed_per_token: list[float] = field(default_factory=list)  # seconds since start, at each output token
    acceptance_per_token: list[float | None] = field(default_factory=list)  # cumulative, at each output token

    def add(self, event) -> None:
        if event.step != self.steps:  # a new step: count its drafts
            self.steps = event.step
            self.drafted += event.drafted
        self.events.append(event)
        if event.kind == "rejected":
            return
        self.new_tokens += 1
        self.accepted += event.kind == "accepted"
        self.elapsed_per_token.append(time.perf_counter() - self.started)
        self.acceptance_per_token.append(self.accepted / self.drafted if self.drafted else None)

    @property
    def done(self) -> bool:
        return self.summary is not None

    @property
    def acceptance_rate(self) -> float | None:
        if self.summary:
            return self.summary.acceptance_rate
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        if self.summary:
            return self.summary.tau
        return self.new_tokens / self.steps if self.steps else None

    @property
    def elapsed_s(self) -> float:
        return self.summary.wall_time_s if self.summary else time.perf_counter() - self.started

    @property
    def tokens_per_second(self) -> float:
        if self.summary:
            return self.summary.tokens_per_second
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_w(self) -> float | None:
        if self.summary:
            return self.summary.mean_w
        ws = [e.w for e in self.events if e.w is not None and e.kind != "resampled"]
        return sum(ws) / len(ws) if ws else None


def stream_decode(pair, prompt: str, settings: DecodeSettings, head=None):
    """Decode `prompt`, yielding the same DecodeRun after every token event and once more when done.

    Raises ValueError (bad input, from here or the decoder) before the first yield.
    """
    check_prompt(prompt)
    run = DecodeRun(settings)
    stream = speculative_generate(pair, prompt, mode=settings.mode, ensemble_weight=settings.ensemble_weight,
                                  head=head, n_draft=settings.n_draft, max_new_tokens=settings.max_new_tokens,
                                  temperature=settings.temperature, seed=settings.seed)
    for item in stream:
        if isinstance(item, Summary):
            run.summary = item
        else:
            run.add(item)
        yield run


def throttled(items, interval_s: float):
    """Pass on items at most every `interval_s` seconds, always including the last one."""
    last_sent, pending, has_pending = -math.inf, None, False
    for item in items:
        now = time.perf_counter()
        if now - last_sent >= interval_s:
            last_sent, has_pending = now, False
            yield item
        else:
            pending, has_pending = item, True
    if has_pending:
        yield pending


# ---------------------------------------------------------------- rendering runs

def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def token_title(event) -> str:
    """The hover text of a token: its fate and the numbers behind it."""
    lines = [KIND_LABELS[event.kind], f"w_t = {_fmt(event.w)}" + ("" if event.w is not None else " (no draft here)"),
             f"p(x) = {_fmt(event.p)}  (target)", f"q(x) = {_fmt(event.q)}  (draft)"]
    if event.accept_prob is not None:
        lines.append(f"acceptance probability = {_fmt(event.accept_prob)}")
    return "\n".join(lines)


def render_token(event) -> str:
    text = html.escape(event.text) or "∅"
    # Keep newlines visible: a return mark, then the line break itself (the container is white-space: pre-wrap).
    text = text.replace("\n", '<span class="dd-nl">↵</span>\n')
    title = html.escape(token_title(event), quote=True)
    return f'<span class="dd-tok dd-{event.kind}" title="{title}">{text}</span>'


def render_tokens(events, placeholder: str = "Tokens appear here as they are decided.") -> str:
    if not events:
        return f'<div class="dd-tokens dd-empty">{html.escape(placeholder)}</div>'
    return f'<div class="dd-tokens">{"".join(render_token(e) for e in events)}</div>'


def legend_html(kinds=KIND_LABELS) -> str:
    items = "".join(f'<span class="dd-legend-item"><span class="dd-tok dd-{kind}">token</span> '
                    f'{html.escape(label)}</span>' for kind, label in kinds.items())
    hint = '<span class="dd-legend-item dd-hint">hover a token for w_t, p, q</span>'
    return f'<div class="dd-legend">{items}{hint}</div>'


def stats_html(run: DecodeRun | None) -> str:
    """Live statistics cards: acceptance, τ, tokens/s, elapsed, tokens, mean w."""
    if run is None:
        cards = [("acceptance", "–"), ("τ (tokens / target pass)", "–"), ("tokens / s", "–"), ("elapsed", "–")]
    else:
        acceptance = run.acceptance_rate
        cards = [("acceptance", "n/a" if acceptance is None else f"{acceptance:.0%}"),
                 ("τ (tokens / target pass)", _fmt(run.tau, 2)),
                 ("tokens / s", f"{run.tokens_per_second:.1f}"),
                 ("elapsed", f"{run.elapsed_s:.1f} s"),
                 ("tokens", str(run.new_tokens)),
                 ("mean w_t", _fmt(run.mean_w, 2))]
    body = "".join(f'<div class="dd-stat"><div class="dd-stat-value">{html.escape(value)}</div>'
                   f'<div class="dd-stat-label">{html.escape(label)}</div></div>' for label, value in cards)
    if run is None:
        return f'<div class="dd-stats" data-state="idle">{body}</div>'
    # The settings as attributes let scripts (and the browser test) tell which run the numbers belong to.
    return (f'<div class="dd-stats" data-state="{"done" if run.done else "running"}" data-mode="{run.settings.mode}" '
            f'data-w="{run.settings.ensemble_weight:g}" data-seed="{run.settings.seed}">{body}</div>')


def _figure(title: str, height: int, x_title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=height, template="plotly_white",
                      margin=dict(l=50, r=20, t=40, b=40), legend=dict(orientation="h", y=-0.25),
                      xaxis_title=x_title, yaxis_title=y_title)
    return fig


def w_chart(run: DecodeRun | None) -> go.Figure:
    """Strip chart of w_t at each verified draft position, coloured by the drafted token's fate."""
    fig = _figure("w_t per token", 220, "output token", "w_t")
    fig.update_yaxes(range=[-0.05, 1.05])
    if run is None:
        return fig
    position, points = 0, {kind: ([], [], []) for kind in ("accepted", "rejected")}
    for event in run.events:
        if event.kind in points and event.w is not None:
            xs, ys, texts = points[event.kind]
            xs.append(position)
            ys.append(event.w)
            texts.append(event.text)
        position += event.kind != "rejected"  # a rejected draft sits at the position its resample fills
    for kind, (xs, ys, texts) in points.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=KIND_LABELS[kind], text=texts,
                                 marker=dict(color=KIND_COLORS[kind], size=7),
                                 hovertemplate="%{text}<br>w_t = %{y:.3f}<extra></extra>"))
    if run.settings.mode == "ar":
        fig.add_annotation(text="target only: no draft, no w_t", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


# ---------------------------------------------------------------- compare

COMPARE_MODES = ("Target only", "Exact SD", "Static ensemble", "DIVERSED")


@dataclass
class Comparison:
    """The runs of one prompt through each mode, and each finished run's quality."""
    runs: dict[str, DecodeRun] = field(default_factory=dict)
    quality: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # label → (value, metric)
    skipped: dict[str, str] = field(default_factory=dict)  # label → why


def quality_of(pair, prompt: str, example: Example | None, run: DecodeRun) -> tuple[float | None, str]:
    """(value, metric): ROUGE-2 or math correctness when the prompt is an example with a reference,
    else fidelity (mean target log-probability of the output); (None, "n/a") for an empty output.
    """
    if run.summary is None or not run.summary.token_ids:
        return None, "n/a"
    if example is not None and example.reference is not None and example.task in REFERENCE_TASKS:
        value = task_reward(example.task, example, run.summary.text)
        return float(value), "ROUGE-2" if example.task == "summarization" else "correct"
    return float(fidelity(pair, encode_prompt(pair.tokenizer, prompt), run.summary.token_ids)), "fidelity"


def stream_comparison(pair, prompt: str, settings: DecodeSettings, example: Example | None = None):
    """Run the prompt through every mode in turn (same seed), yielding the Comparison as it grows."""
    check_prompt(prompt)
    comparison = Comparison()
    for label in COMPARE_MODES:
        mode_settings = replace(settings, mode=MODE_LABELS[label])
        if mode_settings.mode == "dynamic" and not settings.head_name:
            comparison.skipped[label] = "no head selected"
            continue
        head = resolve_head(pair, mode_settings)
        for run in stream_decode(pair, prompt, mode_settings, head):
            comparison.runs[label] = run
            if run.done:
                comparison.quality[label] = quality_of(pair, prompt, example, run)
            yield comparison


def comparison_table(comparison: Comparison) -> pd.DataFrame:
    """Speedup over target-only, acceptance, τ, tokens/s and quality of each finished run."""
    baseline = comparison.runs.get("Target only")
    base_speed = baseline.tokens_per_second if baseline is not None and baseline.done else None
    rows = []
    for label in COMPARE_MODES:
        run = comparison.runs.get(label)
        if run is None or not run.done:
            continue
        quality, metric = comparison.quality.get(label, (None, "n/a"))
        rows.append({"mode": label,
                     "speedup ×": round(run.tokens_per_second / base_speed, 2) if base_speed else None,
                     "acceptance": None if run.acceptance_rate is None else round(run.acceptance_rate, 3),
                     "τ": round(run.tau, 2),
                     "tokens/s": round(run.tokens_per_second, 1),
                     "tokens": run.new_tokens,
                     "quality": "n/a" if quality is None else f"{quality:.3f}",
                     "metric": metric})
    return pd.DataFrame(rows, columns=["mode", "speedup ×", "acceptance", "τ", "tokens/s", "tokens", "quality",
                                       "metric"])


def comparison_charts(comparison: Comparison) -> tuple[go.Figure, go.Figure]:
    """Cumulative acceptance and elapsed time against the generated token index, one line per mode."""
    acceptance = _figure("cumulative acceptance", 280, "generated token", "accepted / drafted")
    acceptance.update_yaxes(range=[0, 1.02])
    elapsed = _figure("elapsed time", 280, "generated token", "seconds")
    palette = dict(zip(COMPARE_MODES, ("#64748b", "#2563eb", "#d97706", "#7c3aed")))
    for label, run in comparison.runs.items():
        xs = list(range(1, run.new_tokens + 1))
        line = dict(color=palette[label], width=2)
        if run.settings.mode != "ar":
            acceptance.add_trace(go.Scatter(x=xs, y=run.acceptance_per_token, mode="lines", name=label, line=line))
        elapsed.add_trace(go.Scatter(x=xs, y=run.elapsed_per_token, mode="lines", name=label, line=line))
    return acceptance, elapsed


def run_panel_html(label: str, comparison: Comparison) -> str:
    """One column of the compare view: the run's coloured tokens and a one-line summary."""
    run = comparison.runs.get(label)
    if run is None:
        why = comparison.skipped.get(label, "waiting…")
        return f'<div class="dd-panel"><div class="dd-panel-head">{html.escape(label)}</div>' \
               f'<div class="dd-tokens dd-empty">{html.escape(why)}</div></div>'
    acceptance = "n/a" if run.acceptance_rate is None else f"{run.acceptance_rate:.0%}"
    line = f"acc {acceptance} · τ {_fmt(run.tau, 2)} · {run.tokens_per_second:.1f} tok/s · {run.elapsed_s:.1f} s"
    return (f'<div class="dd-panel" data-state="{"done" if run.done else "running"}">'
            f'<div class="dd-panel-head">{html.escape(label)}'
            f'<span class="dd-panel-stats">{html.escape(line)}</span></div>'
            f'{render_tokens(run.events)}</div>')


# ---------------------------------------------------------------- speed–quality dial

def sweep_points(pair, examples: list[Example], task: str, weights, settings: DecodeSettings,
                 heads: dict | None = None, progress=None) -> pd.DataFrame:
    """The frontier sweep (diversed_demo.frontier.sweep) over `examples` at each static w and with each head.

    One row per point: label, kind (static/head), w (the mean w_t for heads), acceptance (accepted/drafted),
    alpha (per-token acceptance inferred from it), tokens_per_second, quality (the task reward).
    `progress(fraction, description)` is called after each decode.
    """
    from .frontier import sweep
    if not examples:
        raise ValueError("the sweep needs at least one prompt")
    heads = heads or {}
    total, done = (len(weights) + len(heads)) * len(examples), 0

    def report(label, _index, _count):
        nonlocal done
        done += 1
        if progress:
            progress(done / total, f"{label}: {done}/{total} decodes")

    points = sweep(pair, examples, task, weights=weights, heads=heads, progress=report, n_draft=settings.n_draft,
                   max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    rows = [{"label": f"w = {p.w:.2f}" if p.w is not None else p.label.removeprefix("dynamic:"),
             "kind": "static" if p.w is not None else "head",
             "w": p.w if p.w is not None else p.row()["mean_w"],
             "acceptance": p.acceptance, "alpha": alpha_from_acceptance(p.acceptance, settings.n_draft),
             "tokens_per_second": p.tokens_per_second, "quality": p.mean_quality} for p in points]
    return pd.DataFrame(rows)


def expected_tv(points: pd.DataFrame) -> float:
    """E[TV(p, q)] from the exact point (w = 1), whose per-token acceptance is 1 − E[TV]; the other static
    points then test the line 1 − w·E[TV] rather than fit it."""
    exact = points[(points["kind"] == "static") & (points["w"] == 1.0)]
    return float(1 - exact["alpha"].iloc[0]) if not exact.empty else math.nan


def dial_quality_figure(points: pd.DataFrame) -> go.Figure:
    """Left: per-token acceptance α vs w with the theory line 1 − w·E[TV]; right: quality vs acceptance rate."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per-token acceptance vs w", "quality vs acceptance"))
    fig.update_layout(height=340, template="plotly_white", margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.2))
    static, heads = points[points["kind"] == "static"], points[points["kind"] == "head"]
    tv = expected_tv(points)
    if not math.isnan(tv):
        fig.add_trace(go.Scatter(x=[0, 1], y=[1, 1 - tv], mode="lines",
                                 name=f"theory 1 − w·E[TV] (E[TV] ≈ {tv:.2f})",
                                 line=dict(color="#94a3b8", dash="dash")), row=1, col=1)
    fig.add_trace(go.Scatter(x=static["w"], y=static["alpha"], mode="markers+lines", name="static w (measured)",
                             marker=dict(color="#d97706", size=8), line=dict(color="#d97706")), row=1, col=1)
    fig.add_trace(go.Scatter(x=static["acceptance"], y=static["quality"], mode="markers+lines+text",
                             text=static["label"],
                             textposition="top center", showlegend=False, marker=dict(color="#d97706", size=8),
                             line=dict(color="#d97706")), row=1, col=2)
    if not heads.empty:
        star = dict(color="#7c3aed", size=13, symbol="star")
        fig.add_trace(go.Scatter(x=heads["w"], y=heads["alpha"], mode="markers", name="DIVERSED heads (mean w_t)",
                                 marker=star, text=heads["label"]), row=1, col=1)
        fig.add_trace(go.Scatter(x=heads["acceptance"], y=heads["quality"], mode="markers+text", text=heads["label"],
                                 textposition="bottom center", showlegend=False, marker=star), row=1, col=2)
    fig.update_xaxes(title_text="w", range=[-0.05, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="per-token acceptance α", row=1, col=1)
    fig.update_xaxes(title_text="acceptance (accepted / drafted)", row=1, col=2)
    fig.update_yaxes(title_text="quality (task reward)", row=1, col=2)
    return fig


def embedded_cost_ratio() -> float:
    """The embedded draft's measured draft/target cost per token (its card), where the dial's c starts."""
    try:
        return round(json.loads((EMBEDDED_DRAFT_DIR / "card.json").read_text())["spec_bench"]["cost_ratio"], 2)
    except (OSError, ValueError, KeyError):
        return 0.2


def dial_speed_figure(points: pd.DataFrame, n_draft: int, cost_ratio: float) -> go.Figure:
    """Measured tokens/s per setting, and the projected speedup at draft/target cost ratio c."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("measured speed (this machine)",
                                                        f"projected speedup (N = {n_draft}, c = {cost_ratio:g})"))
    fig.update_layout(height=340, template="plotly_white", margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.2))
    colors = ["#7c3aed" if kind == "head" else "#d97706" for kind in points["kind"]]
    fig.add_trace(go.Bar(x=points["label"], y=points["tokens_per_second"], marker_color=colors, showlegend=False),
                  row=1, col=1)
    alphas = [i / 100 for i in range(101)]
    fig.add_trace(go.Scatter(x=alphas, y=[analytic_speedup(a, n_draft, cost_ratio) for a in alphas], mode="lines",
                             name="projection (1 − α^{N+1}) / ((1 − α)(N·c + 1))", line=dict(color="#94a3b8")),
                  row=1, col=2)
    measured = points.dropna(subset=["alpha"])
    projected = [analytic_speedup(a, n_draft, cost_ratio) for a in measured["alpha"]]
    fig.add_trace(go.Scatter(x=measured["alpha"], y=projected,
                             mode="markers+text", text=measured["label"], textposition="top center",
                             marker=dict(color=["#7c3aed" if k == "head" else "#d97706" for k in measured["kind"]],
                                         size=9), name="settings at their α"), row=1, col=2)
    fig.update_yaxes(title_text="tokens / s", row=1, col=1)
    fig.update_xaxes(title_text="per-token acceptance α", row=1, col=2)
    fig.update_yaxes(title_text="projected speedup ×", row=1, col=2)
    return fig


# ---------------------------------------------------------------- training

class TrainingJob:
    """The app's one training run at a time, in a background thread so that decoding keeps working.

    Handlers start it, poll `history`/`status` and ask it to stop; `train_fn(config, callback, should_stop)`
    does the work and returns a result with `.path`.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.history: list[dict] = []
        self.result = None
        self.error: str | None = None
        self.owner: str | None = None  # session that started the run: only it may cancel

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, train_fn, owner: str | None = None) -> bool:
        """Start `train_fn` in the background; False if a run is already going."""
        with self._lock:
            if self.running:
                return False
            self._stop.clear()
            self.history, self.result, self.error, self.owner = [], None, None, owner
            self._thread = threading.Thread(target=self._work, args=(train_fn,), name="diversed-train", daemon=True)
            self._thread.start()
            return True

    def _work(self, train_fn) -> None:
        try:
            self.result = train_fn(self.history.append, self._stop.is_set)
        except Exception as err:  # noqa: BLE001 — any failure is reported to the user, not raised in a thread
            self.error = str(err) or type(err).__name__

    def cancel(self, owner: str | None = None) -> bool:
        """Ask the run to stop after its current step; False if none runs or another session owns it."""
        if not self.running or (self.owner is not None and owner != self.owner):
            return False
        self._stop.set()
        return True

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def training_figure(history: list[dict]) -> go.Figure:
    """Reward (left: its scale depends on the task) and acceptance and mean w_t (right, in [0, 1]) per step."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("reward", "acceptance and mean w_t"))
    fig.update_layout(height=300, template="plotly_white", margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25))
    steps = [h.get("step") for h in history]
    for key, color, col in (("reward", "#16a34a", 1), ("acceptance", "#2563eb", 2), ("mean_w", "#7c3aed", 2)):
        fig.add_trace(go.Scatter(x=steps, y=[h.get(key) for h in history], mode="lines+markers", name=key,
                                 line=dict(color=color)), row=1, col=col)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_xaxes(title_text="step")
    return fig


def training_status(job: TrainingJob, steps: int | None = None) -> str:
    if job.error:
        return f"Training failed: {job.error}"
    last = job.history[-1] if job.history else None
    progress = f"step {last.get('step')}" + (f" of {steps}" if steps else "") if last else "starting…"
    if job.running:
        return f"Training… {progress}" + (" (stopping after this step)" if job.cancelled else "")
    if job.result is not None and job.result.path is None:
        return f"Cancelled at {progress}; no head saved."
    if job.result is not None:
        return f"Finished: {progress}; head saved as **{job.result.path.stem}** ({job.result.path})"
    return "Idle."


# ---------------------------------------------------------------- Gradio layer

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


def _on_gpu(fn):
    """On ZeroGPU Spaces, run `fn` with a GPU attached; elsewhere `spaces` is absent and fn runs as is."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(fn)


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


def _settings(mode_label, w, head_name, n_draft, max_new_tokens, temperature, seed) -> DecodeSettings:
    return DecodeSettings(mode=MODE_LABELS.get(mode_label, "static"), ensemble_weight=float(w),
                          head_name=head_name or None, n_draft=int(n_draft), max_new_tokens=int(max_new_tokens),
                          temperature=float(temperature), seed=int(seed or 0))


def build_app(pair, examples: list[Example] | None = None, job: TrainingJob | None = None):
    """The Gradio Blocks app for `pair`. Launch it with `launch(app)` so that its CSS and theme apply."""

    examples = examples if examples is not None else load_examples()
    job = job or TrainingJob()
    choices = example_choices(examples)

    def head_choices():
        return list(list_heads(pair))  # the user's newest first, then the shipped ones

    def refresh_heads(current):
        names = head_choices()
        return gr.update(choices=names, value=current if current in names else (names[0] if names else None))

    @_on_gpu
    def generate(prompt, mode_label, w, head_name, n_draft, max_new_tokens, temperature, seed):
        settings = _settings(mode_label, w, head_name, n_draft, max_new_tokens, temperature, seed)
        last_chart = -math.inf
        with user_errors():
            head = resolve_head(pair, settings)
            for run in throttled(stream_decode(pair, prompt, settings, head), UI_INTERVAL_S):
                chart = gr.skip()
                if run.done or time.perf_counter() - last_chart >= CHART_INTERVAL_S:
                    chart, last_chart = w_chart(run), time.perf_counter()
                yield render_tokens(run.events), stats_html(run), chart

    @_on_gpu
    def compare(prompt, w, head_name, n_draft, max_new_tokens, temperature, seed):
        settings = _settings("Static ensemble", w, head_name, n_draft, max_new_tokens, temperature, seed)
        example = find_example(prompt, examples)
        last_chart = -math.inf
        with user_errors():
            comparison = Comparison()
            for comparison in throttled(stream_comparison(pair, prompt, settings, example), UI_INTERVAL_S):
                charts = (gr.skip(), gr.skip())
                if time.perf_counter() - last_chart >= CHART_INTERVAL_S:
                    charts, last_chart = comparison_charts(comparison), time.perf_counter()
                yield (*[run_panel_html(label, comparison) for label in COMPARE_MODES], *charts,
                       comparison_table(comparison))
            # The last update always carries the final charts and the full table.
            yield (*[run_panel_html(label, comparison) for label in COMPARE_MODES], *comparison_charts(comparison),
                   comparison_table(comparison))

    @_on_gpu
    def sweep(task, n_prompts, weights, tokens, n_draft, temperature, cost_ratio, progress=gr.Progress()):
        chosen = [e for e in examples if e.task == task][: int(n_prompts)]
        weights = sorted({float(w) for w in weights} | {1.0})  # w = 1 anchors the E[TV] estimate
        settings = DecodeSettings(n_draft=int(n_draft), max_new_tokens=int(tokens), temperature=float(temperature))
        with user_errors():
            heads = {name: load_head(name, pair) for name in head_choices()}
            points = sweep_points(pair, chosen, task, weights, settings, heads,
                                  progress=lambda fraction, text: progress(fraction, desc=text))
        return (points, dial_quality_figure(points), dial_speed_figure(points, int(n_draft), float(cost_ratio)),
                points.round(3))

    def respeed(points, n_draft, cost_ratio):
        if points is None:
            return gr.skip()
        return dial_speed_figure(points, int(n_draft), float(cost_ratio))

    def start_training(task, source, upload, steps, rollouts, lam, lr, request: gr.Request):
        with user_errors():
            if source == "Uploaded JSONL" and not upload:
                raise ValueError("upload a .jsonl file of prompts first, or choose the built-in examples")
            config = train.TrainConfig(task=task, prompts_path=upload if source == "Uploaded JSONL" else None,
                                       steps=int(steps), rollouts_per_prompt=int(rollouts), lam=float(lam),
                                       lr=float(lr))
            # Check settings and prompts here, so that a bad upload is an error message, not a failed run.
            train.check_config(config)
            train.training_examples(config)
        started = job.start(lambda callback, should_stop: train.train_head(
            pair, config, callback=callback, should_stop=should_stop, progress=False), owner=request.session_hash)
        if not started:
            gr.Warning("A training run is already in progress; wait for it to finish.")
            return
        while job.running:
            yield training_figure(job.history), training_status(job, int(steps)), gr.skip()
            time.sleep(0.5)
        if job.error:
            gr.Warning(f"Training failed: {job.error}")
        new_head = job.result.path.stem if job.result is not None and job.result.path else None
        yield training_figure(job.history), training_status(job, int(steps)), refresh_heads(new_head)

    def cancel_training(request: gr.Request):
        if not job.cancel(owner=request.session_hash):
            gr.Warning("No training run of yours is in progress.")
            return gr.skip()
        return training_status(job)

    with gr.Blocks(title="DIVERSED demo") as app:
        gr.HTML('<div class="dd-header"><h1>DIVERSED</h1><p>Relaxed speculative decoding with dynamic ensemble '
                f'verification. Target <code>{html.escape(short_name(pair.target_name))}</code>, draft '
                f'<code>{html.escape(short_name(pair.draft_name))}</code>, '
                f'on {html.escape(str(pair.device))}.</p></div>')
        with gr.Sidebar(label="Decoding settings", open=True):
            gr.Markdown("### Decoding settings\nShared by Decode, Compare and the dial.")
            w = gr.Slider(0, 1, value=0.5, step=0.05, label="static ensemble weight w",
                          info="1 = exact SD; lower accepts more drafts", elem_id="w-slider")
            heads_now = head_choices()
            head = gr.Dropdown(heads_now, value=heads_now[0] if heads_now else None, label="DIVERSED head",
                               info="trained heads for this pair; train one in the Train tab", elem_id="head")
            n_draft = gr.Slider(1, min(MAX_N_DRAFT, 12), value=4, step=1, label="draft tokens per step N")
            max_new_tokens = gr.Slider(8, 512, value=64, step=8, label="max new tokens")
            temperature = gr.Slider(0, 2, value=1.0, step=0.05, label="temperature", info="0 = greedy")
            seed = gr.Number(0, precision=0, minimum=0, maximum=MAX_SEED, label="seed", elem_id="seed")

        with gr.Tabs():
            with gr.Tab("Decode", id="decode"):
                with gr.Row():
                    decode_example = gr.Dropdown(choices, value=None, label="example prompt", scale=2)
                    mode = gr.Radio(list(MODE_LABELS), value="Static ensemble", label="mode", scale=2,
                                    info="w and the head are set in the sidebar", elem_id="mode")
                prompt = gr.Textbox(label="prompt", lines=3, max_lines=12, elem_id="prompt",
                                    placeholder="Type a prompt or pick an example")
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", scale=4, elem_id="generate")
                    stop_button = gr.Button("Stop", variant="secondary", scale=1, elem_id="stop")
                gr.HTML(legend_html())
                tokens = gr.HTML(render_tokens([]), elem_id="tokens")
                stats = gr.HTML(stats_html(None), elem_id="stats")
                w_plot = gr.Plot(w_chart(None), show_label=False, elem_id="w-chart")

            with gr.Tab("Compare", id="compare"):
                gr.Markdown("One prompt and seed through each mode in turn. Static uses the sidebar's w, "
                            "DIVERSED its head.")
                with gr.Row():
                    compare_example = gr.Dropdown(choices, value=None, label="example prompt", scale=3)
                    compare_button = gr.Button("Run compare", variant="primary", scale=1, elem_id="compare")
                compare_prompt = gr.Textbox(label="prompt", lines=2, max_lines=8, elem_id="compare-prompt")
                gr.HTML(legend_html())
                with gr.Row(equal_height=False):
                    panels = [gr.HTML(run_panel_html(label, Comparison()), elem_classes="dd-panel-box")
                              for label in COMPARE_MODES]
                with gr.Row():
                    acceptance_plot = gr.Plot(show_label=False, elem_id="compare-acceptance")
                    elapsed_plot = gr.Plot(show_label=False, elem_id="compare-elapsed")
                compare_summary = gr.Dataframe(comparison_table(Comparison()), label="summary", interactive=False,
                                               elem_id="compare-table")

            with gr.Tab("Speed–quality dial", id="dial"):
                gr.Markdown("Sweep the static weight w over a few prompts; trained heads are overlaid as stars. "
                            "Quality is the task's reward: ROUGE-2 (summarization), final-number match (math), "
                            "pass@1 (code) or fidelity to the target (general).")
                with gr.Row():
                    dial_task = gr.Dropdown(list(TASKS), value="general", label="prompts from task",
                                            info="one task, so that one quality metric is averaged")
                    dial_prompts = gr.Slider(1, 8, value=2, step=1, label="prompts")
                    dial_tokens = gr.Slider(8, 128, value=32, step=8, label="new tokens per prompt")
                    dial_weights = gr.CheckboxGroup([0.0, 0.25, 0.5, 0.75, 1.0], value=[0.0, 0.5, 1.0],
                                                    label="static w to try")
                with gr.Row():
                    cost_ratio = gr.Slider(0.01, 1, value=embedded_cost_ratio(), step=0.01,
                                           label="draft/target cost ratio c",
                                           info="for the projected speedup only; starts at the embedded "
                                                "draft's measured c (assets/draft/card.json)")
                    sweep_button = gr.Button("Run sweep", variant="primary")
                dial_points = gr.State(None)
                quality_plot = gr.Plot(show_label=False, elem_id="dial-quality")
                speed_plot = gr.Plot(show_label=False, elem_id="dial-speed")
                gr.Markdown("*The right-hand speed chart is a projection from the per-token acceptance α, not a "
                            "measurement.*")
                dial_table = gr.Dataframe(label="sweep results", interactive=False)

            with gr.Tab("Train", id="train"):
                gr.Markdown("Train a DIVERSED head with sequence-level RL. One run at a time; decoding keeps "
                            "working meanwhile. The head is saved to your heads folder and appears in the "
                            "sidebar's dropdown.")
                with gr.Row():
                    train_task = gr.Dropdown(list(TASKS), value="general", label="task",
                                             info="the reward: ROUGE-2, math match, pass@1, or fidelity (general)")
                    train_source = gr.Radio(["Built-in examples", "Uploaded JSONL"], value="Built-in examples",
                                            label="prompts")
                    train_upload = gr.File(label="prompts (.jsonl): one {\"prompt\", \"reference\"?} per line",
                                           file_types=[".jsonl"], type="filepath", visible=False, height=120,
                                           elem_id="train-upload")
                with gr.Row():
                    defaults = train.TrainConfig(task="general")
                    train_steps = gr.Slider(1, 200, value=defaults.steps, step=1, label="steps", elem_id="train-steps")
                    train_rollouts = gr.Slider(2, 8, value=defaults.rollouts_per_prompt, step=1,
                                               label="rollouts per prompt", elem_id="train-rollouts")
                    train_lam = gr.Slider(0, 10, value=defaults.lam, step=0.05, label="λ (speed vs quality)")
                    train_lr = gr.Number(defaults.lr, label="learning rate")
                with gr.Row():
                    train_button = gr.Button("Start training", variant="primary", elem_id="train-start")
                    cancel_button = gr.Button("Cancel", variant="stop", elem_id="train-cancel")
                train_status = gr.Markdown("Idle.", elem_id="train-status")
                train_plot = gr.Plot(training_figure([]), show_label=False)

            with gr.Tab("About", id="about"):
                gr.Markdown(ABOUT_MD, elem_classes="dd-about")

        def example_prompt(index):
            return examples[index].prompt if index is not None else gr.skip()

        decode_example.change(example_prompt, decode_example, prompt, api_visibility="private")
        compare_example.change(example_prompt, compare_example, compare_prompt, api_visibility="private")
        decode_inputs = [prompt, mode, w, head, n_draft, max_new_tokens, temperature, seed]
        # Decode, Compare and the dial share one pool of DECODE_CONCURRENCY slots: they compete for the CPU.
        decoding = gr.on([generate_button.click, prompt.submit], generate, decode_inputs, [tokens, stats, w_plot],
                         concurrency_id="decode", concurrency_limit=DECODE_CONCURRENCY, api_name="generate")
        stop_button.click(None, cancels=[decoding])
        compare_button.click(compare, [compare_prompt, w, head, n_draft, max_new_tokens, temperature, seed],
                             [*panels, acceptance_plot, elapsed_plot, compare_summary], concurrency_id="decode",
                             api_name="compare")
        sweep_button.click(sweep, [dial_task, dial_prompts, dial_weights, dial_tokens, n_draft, temperature,
                                   cost_ratio], [dial_points, quality_plot, speed_plot, dial_table],
                           concurrency_id="decode", api_name="sweep")
        cost_ratio.release(respeed, [dial_points, n_draft, cost_ratio], speed_plot, api_visibility="private")
        train_source.change(lambda source: gr.update(visible=source == "Uploaded JSONL"), train_source, train_upload,
                            api_visibility="private")

        def task_defaults(task):
            config = train.TrainConfig(task=task)
            return config.lam, config.lr

        train_task.change(task_defaults, train_task, [train_lam, train_lr], api_visibility="private")
        # Training itself runs in the job's thread; these handlers only start, poll and cancel it, so they
        # get their own small pool instead of holding decoding slots.
        train_button.click(start_training, [train_task, train_source, train_upload, train_steps, train_rollouts,
                                            train_lam, train_lr], [train_plot, train_status, head],
                           concurrency_id="train", concurrency_limit=4, api_name="train")
        cancel_button.click(cancel_training, None, train_status, concurrency_limit=None, api_name="cancel_training")
        app.load(refresh_heads, head, head, api_visibility="private")
        # A run started by another visitor is shown to everyone: there is only one at a time.
        app.load(lambda: training_status(job), None, train_status, api_visibility="private")
    app.queue(default_concurrency_limit=DECODE_CONCURRENCY, max_size=QUEUE_SIZE)
    return app


def launch(app, **kwargs):
    """Launch with the app's stylesheet and theme (Gradio 6 takes them at launch, not in Blocks)."""
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
    return app.launch(css_paths=[CSS_PATH], theme=theme, **kwargs)
