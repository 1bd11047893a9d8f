"""The frontier as a plotly figure: the static-w curve and each head as a star, acceptance against
quality."""

from __future__ import annotations

from .point import Point


def frontier_figure(points: list[Point], title: str = "Speed–quality frontier"):
    import plotly.graph_objects as go

    static = sorted((p for p in points if p.w is not None), key=lambda p: p.acceptance)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[p.acceptance for p in static],
            y=[p.mean_quality for p in static],
            mode="lines+markers+text",
            text=[f"w={p.w:g}" for p in static],
            textposition="top center",
            name="static w",
        )
    )
    for p in points:
        if p.w is None:
            fig.add_trace(
                go.Scatter(
                    x=[p.acceptance],
                    y=[p.mean_quality],
                    mode="markers+text",
                    text=[p.label],
                    textposition="bottom center",
                    marker={"size": 14, "symbol": "star"},
                    name=p.label,
                )
            )
    fig.update_layout(
        title=title, xaxis_title="acceptance rate", yaxis_title="quality", template="plotly_white"
    )
    return fig
