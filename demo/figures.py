"""The live charts, one pure function each: plain numbers in, a plotly figure out.

No engine, session or Gradio state in here; the words and definitions are demo/metrics.py's.
"""

from __future__ import annotations

import plotly.graph_objects as go

from demo.chat import StepPoint
from demo.metrics import DEFINITIONS, AcceptanceStats
from demo.render import depth_color

DRAFT_COLOR = "#48b5c4"
VERIFY_COLOR = "#22559f"
RUNNING_COLOR = "#d62728"
MODEBAR_REMOVE = ["zoom", "pan", "select", "lasso", "zoomIn", "zoomOut", "autoScale", "resetScale"]

CHART_DEFINITIONS = {
    "acceptance": DEFINITIONS["acceptance_per_position"],
    "acceptance_length": "Acceptance length of a step: accepted drafts + 1 (the target's own token); "
    "the line is its running mean, the mean acceptance length.",
    "latency": "Each step's time, stacked: draft = proposing the k draft tokens; verify = the target's "
    "verification forward and the acceptance test.",
    "throughput": DEFINITIONS["tokens_per_s"] + " Dots: tokens of one step / its draft + verify time.",
}


def _layout(fig: go.Figure, title: str, x: str, y: str, **extra) -> go.Figure:
    extra.setdefault("hovermode", "x unified")
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01, y=0.98, yanchor="top"),
                      template="plotly_white", height=250, margin=dict(l=48, r=12, t=56, b=36), xaxis_title=x,
                      yaxis_title=y, legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0.0),
                      modebar=dict(remove=MODEBAR_REMOVE), **extra)
    return fig


def _empty_note(fig: go.Figure, points: list, text: str = "no steps yet") -> go.Figure:
    if not points:
        fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font=dict(color="#888"))
    return fig


def acceptance_figure(stats: AcceptanceStats) -> go.Figure:
    """Bars: acceptance at draft position i (share of steps with at least i+1 drafts accepted)."""
    rates = stats.acceptance_per_position
    labels = [str(i + 1) for i in range(len(rates))]
    fig = go.Figure(go.Bar(x=labels, y=rates, marker_color=[depth_color(i + 1) for i in range(len(rates))],
                           marker_line_color="#555", marker_line_width=0.5, name="acceptance",
                           hovertemplate="draft token %{x}: accepted in %{y:.0%} of steps<extra></extra>"))
    _layout(fig, "Acceptance at each draft position", "draft token (depth)", "share of steps",
            hovermode="closest")
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    return _empty_note(fig, rates, "target only: no drafts")


def acceptance_length_figure(points: list[StepPoint]) -> go.Figure:
    """Per-step acceptance length (accepted + 1) over steps, with its running mean."""
    steps = [p.step for p in points if p.num_drafts]
    lengths = [p.num_accepted + 1 for p in points if p.num_drafts]
    running, total = [], 0
    for i, n in enumerate(lengths, 1):
        total += n
        running.append(total / i)
    fig = go.Figure([
        go.Bar(x=steps, y=lengths, name="this step", marker_color="#9ed9a9",
               hovertemplate="step %{x}: %{y} tokens<extra></extra>"),
        go.Scatter(x=steps, y=running, name="running mean", mode="lines", line=dict(color=RUNNING_COLOR, width=2),
                   hovertemplate="mean so far: %{y:.2f}<extra></extra>"),
    ])
    k = max((p.num_drafts for p in points), default=0)
    _layout(fig, "Acceptance length per step", "step", "tokens per target forward")
    fig.update_yaxes(range=[0, k + 1.2] if k else None, dtick=1)
    return _empty_note(fig, steps, "target only: no drafts" if points else "no steps yet")


def latency_figure(points: list[StepPoint]) -> go.Figure:
    """Stacked bars: draft ms and verify ms of each step."""
    steps = [p.step for p in points]
    fig = go.Figure([
        go.Bar(x=steps, y=[p.draft_ms for p in points], name="draft", marker_color=DRAFT_COLOR,
               hovertemplate="draft %{y:.1f} ms<extra></extra>"),
        go.Bar(x=steps, y=[p.verify_ms for p in points], name="verify", marker_color=VERIFY_COLOR,
               hovertemplate="verify %{y:.1f} ms<extra></extra>"),
    ])
    _layout(fig, "Draft and verify time per step", "step", "ms", barmode="stack")
    return _empty_note(fig, steps)


def throughput_figure(points: list[StepPoint]) -> go.Figure:
    """Running tokens/s over engine time, with each step's own rate as dots."""
    t = [p.elapsed_s for p in points]
    per_step = [p.num_emitted / ((p.draft_ms + p.verify_ms) / 1e3) if p.draft_ms + p.verify_ms > 0 else 0.0
                for p in points]
    fig = go.Figure([
        go.Scatter(x=t, y=per_step, name="this step", mode="markers", marker=dict(color="#9ab", size=5),
                   hovertemplate="this step: %{y:.1f} tok/s<extra></extra>"),
        go.Scatter(x=t, y=[p.tokens_per_s for p in points], name="running", mode="lines",
                   line=dict(color=RUNNING_COLOR, width=2), hovertemplate="so far: %{y:.1f} tok/s<extra></extra>"),
    ])
    _layout(fig, "Tokens per second", "engine time (s)", "tokens/s")
    fig.update_yaxes(rangemode="tozero")
    return _empty_note(fig, t)
