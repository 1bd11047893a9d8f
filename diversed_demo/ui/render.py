"""Rendering: token events as HTML coloured by fate (with w_t, p, q in each tooltip), stats cards, charts.

Pure functions of runs and tables; no Gradio and no models here.
"""

from __future__ import annotations

import functools
import html
import math

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from ..common.formatting import fmt
from ..runtime.theory import analytic_speedup
from .runs import TREES, Comparison, DecodeRun

# The decoder's modes (core.config.MODES) as the page names them; logic keys on the codes.
MODE_LABELS = {
    "ar": "Target only",
    "exact": "Exact SD",
    "static": "Static ensemble",
    "cost": "Per-token rule",
    "dynamic": "DIVERSED",
}
RUN_LABELS = {**MODE_LABELS, TREES: "Exact SD on trees"}  # a Compare's runs: the modes, and trees beside them

KIND_LABELS = {
    "accepted": "accepted draft token",
    "rejected": "rejected draft token",
    "resampled": "resampled from the residual",
    "bonus": "bonus token from the target",
    "ar": "target-only token",
}
# Same hues as the token classes in assets/app.css.
KIND_COLORS = {
    "accepted": "#16a34a",
    "rejected": "#dc2626",
    "resampled": "#d97706",
    "bonus": "#2563eb",
    "ar": "#64748b",
}
STATIC_COLOR, RULE_COLOR, HEAD_COLOR, THEORY_COLOR = "#d97706", "#0d9488", "#7c3aed", "#94a3b8"
MODE_COLORS = {
    "ar": "#64748b",
    "exact": "#2563eb",
    "static": STATIC_COLOR,
    "cost": RULE_COLOR,
    "dynamic": HEAD_COLOR,
    TREES: "#0891b2",
}


def token_title(event) -> str:
    """The hover text of a token: its fate and the numbers behind it."""
    lines = [
        KIND_LABELS[event.kind],
        f"w_t = {fmt(event.w)}" + ("" if event.w is not None else " (no draft here)"),
        f"p(x) = {fmt(event.p)}  (target)",
        f"q(x) = {fmt(event.q)}  (draft)",
    ]
    if event.accept_prob is not None:
        lines.append(f"acceptance probability = {fmt(event.accept_prob)}")
    return "\n".join(lines)


DEPARTS_TITLE = "first token where this output departs from target-only decoding"


def render_token(event, departs: bool = False) -> str:
    text = html.escape(event.text) or "∅"
    # Keep newlines visible: a return mark, then the line break itself (the container is pre-wrap).
    text = text.replace("\n", '<span class="dd-nl">↵</span>\n')
    title = token_title(event) + (f"\n▶ {DEPARTS_TITLE}" if departs else "")
    classes = f"dd-tok dd-{event.kind}" + (" dd-departs" if departs else "")
    return f'<span class="{classes}" title="{html.escape(title, quote=True)}">{text}</span>'


def render_tokens(
    events, placeholder: str = "Tokens appear here as they are decided.", departs_at: int | None = None
) -> str:
    """The events as coloured tokens; `departs_at` (an output-token index) marks where the text leaves
    target-only decoding."""
    if not events:
        return f'<div class="dd-tokens dd-empty">{html.escape(placeholder)}</div>'
    parts, position = [], 0
    for event in events:
        output = event.kind != "rejected"
        parts.append(render_token(event, departs=output and position == departs_at))
        position += output
    return f'<div class="dd-tokens">{"".join(parts)}</div>'


TREE_STEPS = 3  # the draft trees shown under a decode: its last steps', newest first


def tree_steps_html(events) -> str:
    """The last TREE_STEPS draft trees of a decode (events of tree steps carry them), newest first: each
    node coloured by fate (kept, tried and rejected, not tried), with p, q, its chance and the rule's terms
    at its position on hover. Empty where the decode drafted chains."""
    trees = [(event.step, event.tree) for event in events if event.tree][-TREE_STEPS:]
    if not trees:
        return ""
    blocks = "".join(tree_html(step, tree) for step, tree in reversed(trees))
    note = "the draft's trees, newest first: hover a candidate for p, q, its chance and why w_t is what it is"
    return f'<div class="dd-trees"><div class="dd-trees-note">{html.escape(note)}</div>{blocks}</div>'


def tree_html(step: int, tree: dict) -> str:
    """One step's tree as nested lists, the root first."""
    nodes, rows = tree["nodes"], {row["row"]: row for row in tree["rows"]}
    children = {}
    for i, node in enumerate(nodes):
        children.setdefault(node["parent"] + 1, []).append(i)

    def branch(row: int) -> str:
        items = []
        for i in children.get(row, []):
            node = nodes[i]
            fate = "kept" if node["kept"] else "tried" if node["accept_prob"] is not None else "untried"
            title = html.escape(tree_node_title(node, fate, rows.get(row)), quote=True)
            label = html.escape(node["text"]) or "∅"
            items.append(
                f'<li><span class="dd-node dd-{fate}" title="{title}">{label}</span>{branch(i + 1)}</li>'
            )
        if row == tree.get("rejected_at"):
            items.append('<li><span class="dd-node dd-redrawn">every candidate rejected: redrawn</span></li>')
        return f"<ul>{''.join(items)}</ul>" if items else ""

    return f'<div class="dd-tree"><span class="dd-tree-step">step {step}</span>{branch(0)}</div>'


def tree_node_title(node: dict, fate: str, row: dict | None) -> str:
    """A tree node's hover: its fate and numbers, then the rule's terms at the position it was drafted for."""
    fates = {
        "kept": "kept",
        "tried": "tried and rejected",
        "untried": "not tried: a candidate before it was kept",
    }
    lines = [fates[fate], f"p(x) = {fmt(node['p'])}  (target)", f"q(x) = {fmt(node['q'])}  (draft)"]
    if node["accept_prob"] is not None:
        lines.append(f"chance of acceptance = {fmt(node['accept_prob'])}")
    if row is not None:
        lines += [
            f"w_t = {fmt(row['w'])} at this position",
            f"H(p) = {fmt(row['entropy'])}, TV(p, q) = {fmt(row['tv'])}",
            f"CE(q, p) − H(p) = {fmt(row['cost'])}"
            + ("" if row.get("lam_tv") is None else f" against λ·TV = {fmt(row['lam_tv'])}"),
        ]
    return "\n".join(lines)


def legend_html(kinds=KIND_LABELS) -> str:
    items = "".join(
        f'<span class="dd-legend-item"><span class="dd-tok dd-{kind}">token</span> '
        f"{html.escape(label)}</span>"
        for kind, label in kinds.items()
    )
    hint = '<span class="dd-legend-item dd-hint">hover a token for w_t, p, q</span>'
    return f'<div class="dd-legend">{items}{hint}</div>'


def attribute(value) -> str:
    """A value as an HTML attribute: numbers as numbers, anything else escaped (a replayed trace's
    settings come from a visitor's file)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    return html.escape(str(value), quote=True)


def stats_html(run: DecodeRun | None, replayed: bool = False) -> str:
    """Live statistics cards: acceptance, τ, tokens/s, elapsed, tokens, mean w."""
    if run is None:
        cards = [
            ("acceptance", "–"),
            ("τ (tokens / target pass)", "–"),
            ("tokens / s", "–"),
            ("elapsed", "–"),
        ]
    else:
        cards = [
            ("acceptance", fmt(run.acceptance_rate, ".0%")),
            ("τ (tokens / target pass)", fmt(run.tau, ".2f")),
            ("tokens / s", fmt(run.tokens_per_second, ".1f")),
            ("elapsed", f"{fmt(run.elapsed_s, '.1f')} s"),
            ("tokens", str(run.new_tokens)),
            ("mean w_t", fmt(run.mean_w, ".2f")),
        ]
    body = "".join(
        f'<div class="dd-stat"><div class="dd-stat-value">{html.escape(value)}</div>'
        f'<div class="dd-stat-label">{html.escape(label)}</div></div>'
        for label, value in cards
    )
    if run is None:
        return f'<div class="dd-stats" data-state="idle">{body}</div>'
    # The settings as attributes let scripts (and the browser test) tell which run the numbers belong to.
    state = "done" if run.done else "running"
    return (
        f'<div class="dd-stats" data-state="{state}" data-mode="{attribute(run.settings.mode)}" '
        f'data-w="{attribute(run.settings.ensemble_weight)}" data-seed="{attribute(run.settings.seed)}"'
        f"{' data-replay' if replayed else ''}>{body}</div>"
    )


def slim_template(name: str) -> go.layout.Template:
    """Plotly's template `name` cut to what 2-D scatter charts read: a figure built on the whole
    plotly_white took 13 ms here (its 3-D, map and colour-scale parts validated each time), on this one
    2 ms, and the page draws the charts alike."""
    whole = pio.templates[name]
    return go.layout.Template(
        layout={key: value for key, value in whole.layout.to_plotly_json().items() if key in CHART_KEYS},
        data={"scatter": whole.data.scatter},
    )


CHART_KEYS = {
    "annotationdefaults", "autotypenumbers", "colorway", "font", "hoverlabel", "hovermode",
    "paper_bgcolor", "plot_bgcolor", "shapedefaults", "title", "xaxis", "yaxis",
}  # fmt: skip
CHART_TEMPLATE = slim_template("plotly_white")


def figure(title: str, height: int, x_title: str, y_title: str) -> go.Figure:
    # One constructor: each later update_layout walks the template again (13 ms a figure, here 2 ms).
    layout = dict(
        title=dict(text=title, font=dict(size=14)),
        height=height,
        template=CHART_TEMPLATE,
        margin=dict(l=50, r=20, t=40, b=40),
        legend=dict(orientation="h", y=-0.25),
        xaxis=dict(title=dict(text=x_title)),
        yaxis=dict(title=dict(text=y_title)),
    )
    return go.Figure(layout=layout)


def w_chart(run: DecodeRun | None) -> go.Figure:
    """Strip chart of w_t at each verified draft position, coloured by the drafted token's fate."""
    points = w_points_by_fate(run)
    if not any(xs for xs, _, _ in points.values()):
        # The same figure for every run without points (target-only's, every time): built once, as a
        # chart costs milliseconds on the request thread at the end of each decode
        return empty_w_chart(run is None, run is not None and run.settings.mode == "ar")
    return w_figure(points, annotate=False)


def w_points_by_fate(run: DecodeRun | None) -> dict[str, tuple[list, list, list]]:
    """Per fate (accepted, rejected): the output positions, w_t and texts of the run's verified drafts."""
    position, points = 0, {kind: ([], [], []) for kind in ("accepted", "rejected")}
    for event in run.events if run is not None else ():
        if event.kind in points and event.w is not None:
            xs, ys, texts = points[event.kind]
            xs.append(position)
            ys.append(event.w)
            texts.append(event.text)
        position += event.kind != "rejected"  # a rejected draft sits at the position its resample fills
    return points


@functools.cache
def empty_w_chart(no_run: bool, target_only: bool) -> go.Figure:
    """The chart with no points: before any run, or a run that verified none (target-only's says why)."""
    if no_run:
        return w_figure({}, annotate=False)
    return w_figure(w_points_by_fate(None), annotate=target_only)


def w_figure(points: dict[str, tuple[list, list, list]], annotate: bool) -> go.Figure:
    fig = figure("w_t per token", 220, "output token", "w_t")
    fig.update_yaxes(range=[-0.05, 1.05])
    for kind, (xs, ys, texts) in points.items():
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=KIND_LABELS[kind],
                text=texts,
                marker=dict(color=KIND_COLORS[kind], size=7),
                hovertemplate="%{text}<br>w_t = %{y:.3f}<extra></extra>",
            )
        )
    if annotate:
        fig.add_annotation(
            text="target only: no draft, no w_t", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper"
        )
    return fig


# ---------------------------------------------------------------- compare


def comparison_charts(comparison: Comparison) -> tuple[go.Figure, go.Figure]:
    """Cumulative acceptance and elapsed time against the generated token index, one line per mode."""
    acceptance = figure("cumulative acceptance", 280, "generated token", "accepted / drafted")
    acceptance.update_yaxes(range=[0, 1.02])
    elapsed = figure("elapsed time", 280, "generated token", "seconds")
    for mode, run in comparison.runs.items():
        xs = list(range(1, run.new_tokens + 1))
        label, line = RUN_LABELS[mode], dict(color=MODE_COLORS[mode], width=2)
        if mode != "ar":
            acceptance.add_trace(
                go.Scatter(x=xs, y=run.acceptance_per_token, mode="lines", name=label, line=line)
            )
        elapsed.add_trace(go.Scatter(x=xs, y=run.elapsed_per_token, mode="lines", name=label, line=line))
    return acceptance, elapsed


def run_panel_html(mode: str, comparison: Comparison) -> str:
    """One column of the compare view: the `mode` run's coloured tokens, a one-line summary, and where it
    departs from target-only decoding."""
    label, run = RUN_LABELS[mode], comparison.runs.get(mode)
    if run is None:
        why = comparison.skipped.get(mode, "waiting…")
        return (
            f'<div class="dd-panel"><div class="dd-panel-head">{html.escape(label)}</div>'
            f'<div class="dd-tokens dd-empty">{html.escape(why)}</div></div>'
        )
    # Two short lines: five columns are narrow at 1400 px.
    lines = (
        f"acc {fmt(run.acceptance_rate, '.0%')} · τ {fmt(run.tau, '.2f')}",
        f"{fmt(run.tokens_per_second, '.1f')} tok/s · {fmt(run.elapsed_s, '.1f')} s",
    )
    departs_at = comparison.departures().get(mode)
    if mode == "ar":
        departure = "the reference for the ▶ marks"
    elif departs_at is None:
        departure = "same tokens as target only" if run.done and "ar" in comparison.runs else ""
    else:
        departure = f"▶ departs from target only at token {departs_at + 1}"
    return (
        f'<div class="dd-panel" data-state="{"done" if run.done else "running"}"'
        f"{'' if departs_at is None else f' data-departs={departs_at}'}>"
        f'<div class="dd-panel-head">{html.escape(label)}'
        + "".join(f'<span class="dd-panel-stats">{html.escape(line)}</span>' for line in lines)
        + f'<span class="dd-panel-stats dd-departure">{html.escape(departure)}</span></div>'
        f"{render_tokens(run.events, departs_at=departs_at)}</div>"
    )


# ---------------------------------------------------------------- speed–quality dial

# Four single charts rather than two side-by-side pairs: in a row that wraps, they stack on a phone.
DIAL_HEIGHT = 320
DIAL_MAIN_HEIGHT = 420  # the dial's main figure: quality against acceptance
HEAD_STAR = dict(color=HEAD_COLOR, size=20, symbol="star", line=dict(color="white", width=1))


def acceptance_figure(points, expected_tv: float) -> go.Figure:
    """Per-token acceptance α against w: the static points, the theory line 1 − w·E[TV], heads at their
    mean w_t. `points` is a frame of the dial's points (frontiers.points_frame)."""
    fig = figure("per-token acceptance vs w", DIAL_HEIGHT, "w", "per-token acceptance α")
    static, heads = points[points["kind"] == "static"], points[points["kind"].isin(["head", "curve"])]
    if not math.isnan(expected_tv):
        fig.add_trace(
            go.Scatter(
                x=[0, 1],
                y=[1, 1 - expected_tv],
                mode="lines",
                name=f"theory 1 − w·E[TV] (E[TV] ≈ {expected_tv:.2f})",
                line=dict(color=THEORY_COLOR, dash="dash"),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=static["w"],
            y=static["alpha"],
            mode="markers+lines",
            name="static w (measured)",
            marker=dict(color=STATIC_COLOR, size=8),
            line=dict(color=STATIC_COLOR),
        )
    )
    if not heads.empty:
        fig.add_trace(
            go.Scatter(
                x=heads["w"],
                y=heads["alpha"],
                mode="markers",
                name="DIVERSED heads (mean w_t)",
                marker=HEAD_STAR,
                text=heads["label"],
            )
        )
    fig.update_xaxes(range=[-0.05, 1.05])
    return fig


def head_curve_trace(name: str, curve) -> go.Scatter:
    """A cost head's points (one a λ, as the rule's) as a solid curve of stars."""
    return go.Scatter(
        x=curve["acceptance"],
        y=curve["quality"],
        text=curve["label"],
        mode="markers+lines",
        name=f"learned head {name} (one point a λ)",
        marker=dict(color=HEAD_COLOR, size=13, symbol="star"),
        line=dict(color=HEAD_COLOR),
        hovertemplate="%{text}<br>acceptance %{x:.3f}<br>quality %{y:.4g}<extra></extra>",
    )


def rule_trace(rule) -> go.Scatter:
    """The per-token rule's points (one a λ) as a dotted curve of diamonds."""
    return go.Scatter(
        x=rule["acceptance"],
        y=rule["quality"],
        text=rule["label"],
        mode="markers+lines",
        name="per-token rule (one point a λ)",
        marker=dict(color=RULE_COLOR, size=9, symbol="diamond"),
        line=dict(color=RULE_COLOR, dash="dot"),
        hovertemplate="per-token rule %{text}<br>acceptance %{x:.3f}<br>quality %{y:.4g}<extra></extra>",
    )


def quality_figure(
    points, title: str = "quality vs acceptance", y_title: str = "quality (task reward)"
) -> go.Figure:
    """Quality (or, with its `y_title`, another measure in the frame's quality column) against the acceptance
    rate: the static frontier as a curve (each w on hover, its two ends named), the rule and each cost head
    as curves, and each head as a large star of its own in the legend."""
    fig = figure(title, DIAL_MAIN_HEIGHT, "acceptance (share of drafted tokens kept)", y_title)
    static = points[points["kind"] == "static"].sort_values("acceptance")
    fig.add_trace(
        go.Scatter(
            x=static["acceptance"],
            y=static["quality"],
            customdata=static["w"],
            mode="markers+lines",
            name="static w: the frontier",
            marker=dict(color=STATIC_COLOR, size=8),
            line=dict(color=STATIC_COLOR),
            hovertemplate="static w = %{customdata:.2f}<br>acceptance %{x:.3f}<br>quality %{y:.4g}"
            "<extra></extra>",
        )
    )
    drawn = static.dropna(subset=["acceptance", "quality"])
    for _, end in drawn.iloc[[0, -1] if len(drawn) > 1 else slice(None)].iterrows():
        exact = end["w"] == 1
        fig.add_annotation(
            x=end["acceptance"],
            y=end["quality"],
            text=f"w = {end['w']:g}" + (" (exact SD)" if exact else ""),
            showarrow=True,
            arrowcolor=THEORY_COLOR,
            ax=40 if exact else -40,
            ay=-30 if exact else 30,
            font=dict(size=11, color="#475569"),
        )
    rule = points[points["kind"] == "rule"].sort_values("acceptance")
    if not rule.empty:
        fig.add_trace(rule_trace(rule))
    curves = points[points["kind"] == "curve"]
    for name, curve in curves.groupby(curves["label"].str.split(" λ = ").str[0], sort=False):
        fig.add_trace(head_curve_trace(name, curve.sort_values("acceptance")))
    for _, head in points[points["kind"] == "head"].iterrows():
        fig.add_trace(
            go.Scatter(
                x=[head["acceptance"]],
                y=[head["quality"]],
                mode="markers",
                name=f"DIVERSED head {head['label']}",
                marker=HEAD_STAR,
                hovertemplate=f"{html.escape(str(head['label']))}<br>acceptance %{{x:.3f}}<br>"
                "quality %{y:.4g}<extra></extra>",
            )
        )
    return name_hovered_measure(fig, y_title.split(" (")[0])


def name_hovered_measure(fig: go.Figure, measure: str) -> go.Figure:
    """The hover text names the measure drawn (fidelity, say) where it is not the task's quality."""
    for trace in fig.data:
        trace.hovertemplate = trace.hovertemplate.replace("quality %{y", f"{measure} %{{y")
    return fig


def projection_figure(points, n_draft: int, cost_ratio: float) -> go.Figure:
    """The projected speedup (1 − α^{N+1}) / ((1 − α)(N·c + 1)) against α, with each setting at its α."""
    fig = figure(
        f"projected speed-up: a model, not a measurement (N = {n_draft}, c = {cost_ratio:g})",
        DIAL_HEIGHT,
        "per-token acceptance α",
        "projected speedup ×",
    )
    alphas = [i / 100 for i in range(101)]
    fig.add_trace(
        go.Scatter(
            x=alphas,
            y=[analytic_speedup(a, n_draft, cost_ratio) for a in alphas],
            mode="lines",
            name="projection (1 − α^{N+1}) / ((1 − α)(N·c + 1))",
            line=dict(color=THEORY_COLOR),
        )
    )
    measured = points.dropna(subset=["alpha"])
    fig.add_trace(
        go.Scatter(
            x=measured["alpha"],
            y=[analytic_speedup(a, n_draft, cost_ratio) for a in measured["alpha"]],
            mode="markers",
            text=measured["label"],
            hovertemplate="%{text}<br>α %{x:.3f}<br>projected %{y:.2f}×<extra></extra>",
            name="settings at their α",
            marker=dict(
                color=[HEAD_COLOR if k in ("head", "curve") else STATIC_COLOR for k in measured["kind"]],
                size=9,
            ),
        )
    )
    fig.add_hline(y=1, line_dash="dot", line_color=THEORY_COLOR)
    return fig


def training_figure(history: list[dict]) -> go.Figure:
    """Per step: the reward (left: its scale depends on the task), and acceptance and mean w_t (right, in
    [0, 1])."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("reward", "acceptance and mean w_t"))
    fig.update_layout(
        height=300,
        template=CHART_TEMPLATE,
        margin=dict(l=50, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.25),
    )
    steps = [h.get("step") for h in history]
    for key, color, col in (
        ("reward", "#16a34a", 1),
        ("acceptance", "#2563eb", 2),
        ("mean_w", HEAD_COLOR, 2),
    ):
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[h.get(key) for h in history],
                mode="lines+markers",
                name=key,
                line=dict(color=color),
            ),
            row=1,
            col=col,
        )
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_xaxes(title_text="step")
    return fig
