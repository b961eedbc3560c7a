"""The Benchmark tab's chart, a pure function: summary rows in (demo/bench/plan.py), a plotly figure out.

Words as in demo/metrics.py: the mean acceptance length counts the target's own token, so target
only sits at 1 (k = 0). A chain is a line against k; a tree is a point at its depth, named by its shape
(BenchConfig.label). Plotly's modebar keeps its "Download plot as a png" button (only the zoom
and selection tools are removed, as in demo/ui/figures.py).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from demo.bench.faults import FAULT_SHORT, capture_label
from demo.bench.plan import row_config
from demo.methods import METHOD_LABELS, MODE_LABELS, REGISTRY
from demo.ui.figures import MODEBAR_REMOVE

METHOD_COLORS = {name: m.color for name, m in REGISTRY.items()}
MODE_DASH = {"eager": "solid", "cudagraph": "dot"}


def bench_figure(rows: list[dict]) -> go.Figure:
    """Mean acceptance length (left) and tokens/s (right) against k, one line per method and mode of
    the chains, one diamond per tree at its depth; target only (k = 0) is a point on both, and a
    dashed line across the tokens/s panel."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("Mean acceptance length (includes the target's own token)",
                                        "Tokens per second"))
    series: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["method"], row["mode"], row.get("fault"), row.get("tree_topk"), row.get("num_draft_tokens"),
               row.get("lookup"))
        series.setdefault(key, []).append(row)
    ks = sorted({row["k"] for row in rows})
    for (method, mode, fault, tree_topk, _, _), points in series.items():
        points, tree = sorted(points, key=lambda r: r["k"]), tree_topk is not None
        name = f"{METHOD_LABELS[method]} · {MODE_LABELS[mode]}" if fault is None else \
            f"{METHOD_LABELS[method]} · {capture_label(mode)} · {FAULT_SHORT[fault]}"
        if tree:  # one point at its depth, named by its shape
            name = row_config(points[0]).label
        dash = MODE_DASH.get(mode, "solid") if fault is None else "dash" if fault != "none" else "dashdot"
        style = dict(color=METHOD_COLORS.get(method, "#555"), dash=dash, width=2)
        x = [p["k"] for p in points]
        for col, key, fmt in ((1, "mean_acceptance_length", ".2f"), (2, "tokens_per_s", ".1f")):
            fig.add_trace(go.Scatter(x=x, y=[p[key] for p in points], mode="markers" if tree else "lines+markers",
                                     name=name, legendgroup=name, showlegend=col == 1, line=style,
                                     marker=dict(size=12, symbol="diamond") if tree else dict(size=8),
                                     hovertemplate=f"{name}{'' if tree else ', k=%{x}'}: %{{y:{fmt}}}<extra></extra>"),
                          row=1, col=col)
        if method == "none" and len(ks) > 1:
            fig.add_trace(go.Scatter(x=[ks[0], ks[-1]], y=[points[0]["tokens_per_s"]] * 2, mode="lines",
                                     line=dict(color=style["color"], dash="dash", width=1), hoverinfo="skip",
                                     legendgroup=name, showlegend=False), row=1, col=2)
    fig.update_layout(template="plotly_white", height=340, margin=dict(l=56, r=16, t=64, b=48),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0.0),
                      hovermode="closest", modebar=dict(remove=MODEBAR_REMOVE))
    fig.update_annotations(font_size=13)
    fig.update_xaxes(title_text="k, or a tree's depth (0: target only)",  # two panels side by side: short
                     tickmode="array", tickvals=ks or [0], rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="tokens per target forward", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s", row=1, col=2)
    if not rows:
        fig.add_annotation(text="no benchmark yet", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font=dict(color="#888"))
    return fig
