"""The live charts, one pure function each: plain numbers in, a plotly figure out.

No engine, session or Gradio state in here; the words and definitions are demo/metrics.py's.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from demo.metrics import DEFINITIONS, AcceptanceStats
from demo.service.chat import StepPoint
from demo.tree import DraftTree
from demo.ui.html.render import depth_color

DRAFT_COLOR = "#48b5c4"
VERIFY_COLOR = "#22559f"
RUNNING_COLOR = "#d62728"
PATH_EDGE_COLOR = "#3a3a3a"  # the accepted path's edges; its nodes take the text's depth colours
REJECTED_COLOR = "#e3e3e3"  # nodes off the accepted path, and their edges (darker)
REJECTED_EDGE_COLOR = "#c4c4c4"
MAX_TREE_HEIGHT = 640  # px; a wider tree packs its rows closer
ROW_PX = 28  # px per row that fits a label above each node
LABEL_CHARS = 10  # a node's label shows at most this many characters of its token (hover shows all)
MODEBAR_REMOVE = ["zoom", "pan", "select", "lasso", "zoomIn", "zoomOut", "autoScale", "resetScale"]

CHART_DEFINITIONS = {
    "acceptance": DEFINITIONS["acceptance_per_position"],
    "acceptance_length": "Acceptance length of a step: accepted drafts + 1 (the target's own token); "
    "the line is its running mean, the mean acceptance length.",
    "latency": "Each step's time, stacked: draft = proposing the k draft tokens; verify = the target's "
    "verification forward and the acceptance test.",
    "throughput": DEFINITIONS["tokens_per_s"] + " Dots: tokens of one step / its draft + verify time.",
    "tree": "One step's draft: the root is the last emitted token, each node a draft token hanging from the "
    "token before it; the target verifies every node in one forward. Coloured: the accepted path, by depth as "
    "in the text; grey: not accepted. Hover a node for its token, q (the drafter's probability) and p (the "
    "target's).",
}


def _layout(fig: go.Figure, title: str, x: str, y: str, **extra) -> go.Figure:
    extra.setdefault("hovermode", "x unified")
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01, y=0.98, yanchor="top"),
                      template="plotly_white", height=250, margin=dict(l=48, r=12, t=56, b=36), xaxis_title=x,
                      yaxis_title=y, legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0.0),
                      # a vertical toolbar on the right: on a phone a horizontal one covers the title
                      modebar=dict(remove=MODEBAR_REMOVE, orientation="v"), **extra)
    return fig


def _empty_note(fig: go.Figure, points: list, text: str = "no steps yet") -> go.Figure:
    """An empty chart says why, over axes from 0 (plotly's default empty range starts at -1)."""
    if not points:
        fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font=dict(color="#888"))
        fig.update_xaxes(range=[0, 1])
        if fig.layout.yaxis.range is None:
            fig.update_yaxes(range=[0, 1])
    return fig


def _step_ticks(fig: go.Figure, steps: list[int]) -> go.Figure:
    """Whole-number ticks on a step axis: every 1, 2, 5, 10, 20, ... steps, about 10 of them at most
    (plotly's own choice puts half steps between two steps)."""
    span = max(steps, default=1)
    dtick = next(d * 10**e for e in range(12) for d in (1, 2, 5) if d * 10**e * 10 >= span)
    return fig.update_xaxes(tick0=0, dtick=dtick)


def acceptance_figure(stats: AcceptanceStats) -> go.Figure:
    """Bars: acceptance at draft 1..k (share of steps whose first i drafts were all accepted)."""
    rates = stats.acceptance_per_position
    labels = [f"draft {i}" for i in range(1, len(rates) + 1)]
    fig = go.Figure(go.Bar(x=labels, y=rates, marker_color=[depth_color(i + 1) for i in range(len(rates))],
                           marker_line_color="#555", marker_line_width=0.5, name="acceptance",
                           hovertemplate="%{x}: accepted in %{y:.0%} of steps<extra></extra>"))
    _layout(fig, "Acceptance at draft 1 .. k", "draft i: the i-th draft token of a step (its depth)", "share of steps",
            hovermode="closest")
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    return _empty_note(fig, rates, "target only: no drafts")


def acceptance_length_figure(points: list[StepPoint]) -> go.Figure:
    """Per-step acceptance length (accepted + 1) over steps, with its running mean."""
    steps = [p.step for p in points if p.reach]
    lengths = [p.num_accepted + 1 for p in points if p.reach]
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
    k = max((p.reach for p in points), default=0)
    _layout(fig, "Acceptance length per step", "step", "tokens per target forward")
    fig.update_yaxes(range=[0, k + 1.2] if k else None, dtick=1)
    _step_ticks(fig, steps)
    return _empty_note(fig, steps, "target only: no drafts" if points else "no steps yet")


def latency_figure(points: list[StepPoint], timed_ms: float | None = None) -> go.Figure:
    """Stacked bars: draft ms and verify ms of each step; `timed_ms`: the comparison's timed run's mean
    step (draft + verify, nothing drawn between steps), a dashed line over the streamed bars."""
    steps = [p.step for p in points]
    fig = go.Figure([
        go.Bar(x=steps, y=[p.draft_ms for p in points], name="draft", marker_color=DRAFT_COLOR,
               hovertemplate="draft %{y:.1f} ms<extra></extra>"),
        go.Bar(x=steps, y=[p.verify_ms for p in points], name="verify", marker_color=VERIFY_COLOR,
               hovertemplate="verify %{y:.1f} ms<extra></extra>"),
    ])
    if timed_ms is not None and steps:
        fig.add_trace(go.Scatter(x=[steps[0], steps[-1]], y=[timed_ms, timed_ms], mode="lines", name="timed run's mean",
                                 line=dict(color=RUNNING_COLOR, dash="dash", width=2),
                                 hovertemplate="timed, nothing drawn: %{y:.1f} ms a step<extra></extra>"))
    _layout(fig, "Draft and verify time per step" + (", as streamed" if timed_ms is not None else ""), "step", "ms",
            barmode="stack")
    _step_ticks(fig, steps)
    return _empty_note(fig, steps)


def throughput_figure(points: list[StepPoint], timed_tps: float | None = None) -> go.Figure:
    """Running tokens/s over engine time, with each step's own rate as dots; `timed_tps`: the
    comparison's timed run's tokens/s (nothing drawn between steps), a dashed line."""
    t = [p.elapsed_s for p in points]
    per_step = [p.num_emitted / ((p.draft_ms + p.verify_ms) / 1e3) if p.draft_ms + p.verify_ms > 0 else 0.0
                for p in points]
    fig = go.Figure([
        go.Scatter(x=t, y=per_step, name="this step", mode="markers", marker=dict(color="#9ab", size=5),
                   hovertemplate="this step: %{y:.1f} tok/s<extra></extra>"),
        go.Scatter(x=t, y=[p.tokens_per_s for p in points], name="running", mode="lines",
                   line=dict(color=RUNNING_COLOR, width=2), hovertemplate="so far: %{y:.1f} tok/s<extra></extra>"),
    ])
    if timed_tps is not None and t:
        fig.add_trace(go.Scatter(x=[t[0], t[-1]], y=[timed_tps, timed_tps], mode="lines", name="timed run",
                                 line=dict(color=DRAFT_COLOR, dash="dash", width=2),
                                 hovertemplate="timed, nothing drawn: %{y:.1f} tok/s<extra></extra>"))
    _layout(fig, "Tokens per second" + (", as streamed" if timed_tps is not None else ""), "engine time (s)",
            "tokens/s")
    fig.update_yaxes(rangemode="tozero")
    return _empty_note(fig, t)


def tree_rows(parents: list[int]) -> list[int]:
    """Row of each node 0..N (0: the root) in a tree drawn left to right: leaves take successive rows
    in depth-first order, children in node order (the drafter's order), and a parent shares its first
    child's row, so the drafter's first choices run along one line. parents: [N], node i + 1's parent."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents, 1):
        children[parent].append(node)
    rows = [0] * (len(parents) + 1)
    next_row = 0

    def place(node: int) -> int:
        nonlocal next_row
        if not children[node]:
            rows[node], next_row = next_row, next_row + 1
        else:
            rows[node] = min(place(child) for child in children[node])
        return rows[node]

    place(0)
    return rows


def shown(text: str) -> str:
    """A token as a label: whitespace made visible, cut to LABEL_CHARS."""
    text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def tree_figure(tree: DraftTree | None, token_text: list[str], step: int, note: str = "no steps yet") -> go.Figure:
    """One step's draft tree: nodes by depth (x) and row (y, tree_rows), edges parent -> child; the
    accepted path in the text's depth colours, the rest grey; hover: token, depth, q and p.
    token_text: [N + 1] the text of the root (the last emitted token), then of nodes 1..N."""
    fig = go.Figure()
    _layout(fig, f"Draft tree of step {step}" if tree else "Draft tree", "depth in the draft", "",
            hovermode="closest")
    fig.update_yaxes(visible=False)
    if tree is None:
        return _empty_note(fig, [], note)
    depths = [0] + tree.depths
    rows = tree_rows(tree.parents)
    on_path = {0, *tree.path}
    edges = {True: ([], []), False: ([], [])}  # on the path -> (xs, ys), None between segments
    for node, parent in enumerate(tree.parents, 1):
        xs, ys = edges[node in on_path]
        xs += [depths[parent], depths[node], None]
        ys += [rows[parent], rows[node], None]
    for accepted, (xs, ys) in edges.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", name="accepted path" if accepted else
                                 "not accepted", line=dict(color=PATH_EDGE_COLOR if accepted else REJECTED_EDGE_COLOR,
                                                           width=3 if accepted else 1.2)))
    q = tree.draft_probs
    hover, colors, text_colors = [], [], []
    for node in range(len(depths)):
        token = html.escape(token_text[node], quote=False)  # plotly reads <b>, <br>, &...; in hover and labels
        if node == 0:
            hover.append(f"root: the last emitted token<br>token: {token}")
            colors.append("#ffffff")
            text_colors.append("#1b1b1b")
            continue
        i = node - 1
        if node in on_path:
            what = f"accepted draft token {depths[node]}"
        elif tree.parents[i] in on_path:
            what = "rejected"
        else:
            what = "below a rejected token"
        if tree.is_copied(node):
            what += ", copied from the text (prompt lookup)"
        probs = ("q: none, not drafted" if tree.is_copied(node) else f"q = {q[i]:.3f}" if q is not None
                 else "q: not recorded") + f" · p = {tree.target_probs[i]:.3f}"
        hover.append(f"node {node}: {what}<br>token: {token}<br>depth {depths[node]} · {probs}")
        colors.append(depth_color(depths[node]) if node in on_path else REJECTED_COLOR)
        text_colors.append("#1b1b1b" if node in on_path else "#5f6368")
    num_rows = max(rows) + 1
    height = min(MAX_TREE_HEIGHT, max(260, 90 + ROW_PX * num_rows))
    # too many rows to label every node: the accepted path and the drafts it rejected keep their labels
    # (a phone has no hover), the nodes below a rejected one show theirs on hover
    dense = (height - 90) / num_rows < ROW_PX
    labelled = {n for n in range(len(depths)) if n in on_path or tree.parents[n - 1] in on_path}
    labels = [html.escape(shown(t), quote=False) if not dense or n in labelled else ""
              for n, t in enumerate(token_text)]
    fig.add_trace(go.Scatter(
        x=depths, y=rows, mode="markers+text", name="nodes", showlegend=False, text=labels,
        textposition="top center", textfont=dict(size=11, color=text_colors, family="monospace"),
        marker=dict(size=9 if dense else 13, color=colors,
                    line=dict(color=[PATH_EDGE_COLOR if n in on_path else "#aaaaaa" for n in range(len(depths))],
                              width=1.2)),
        hovertext=hover, hoverinfo="text"))
    fig.update_layout(height=height,
                      title_text=f"Draft tree of step {step}: {len(tree.tokens)} drafts, {len(tree.path)} accepted")
    fig.update_xaxes(tickmode="array", tickvals=list(range(max(depths) + 1)),
                     ticktext=["root"] + [str(d) for d in range(1, max(depths) + 1)],
                     range=[-0.5, max(depths) + 0.5], showgrid=False, zeroline=False)
    row_px = (height - 90) / num_rows
    fig.update_yaxes(range=[num_rows - 0.5, -0.5 - 16 / row_px])  # row 0 on top, with room for its label
    return fig
