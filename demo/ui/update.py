"""What the page shows of a chat state, one function per output, and the one function that builds
every streamed update of a reply (``streamed``): the chat stream, the replay and the API draw
through here, so the text, the stats, the charts and the tree view always show the same tokens.
"""

from __future__ import annotations

import gradio as gr

from demo.methods import METHOD_LABELS
from demo.metrics import DEFINITIONS, AcceptanceStats
from demo.service.chat import ChatState, RunTrace, Update
from demo.service.session import Session, panel_stats
from demo.ui.controls import Controls
from demo.ui.figures import acceptance_figure, acceptance_length_figure, latency_figure, throughput_figure, tree_figure
from demo.ui.html.headline import render_headline
from demo.ui.html.inspector import rejected_texts, render_inspector, shown_ids
from demo.ui.html.race import render_race, render_race_hint
from demo.ui.html.render import render_chat, render_comparison, render_stats, status_html
from demo.ui.replay import step_at


def conversation_html(session: Session, chat: ChatState) -> str:
    """The conversation: the latest reply inspectable, with its rejected drafts (the show-rejected
    toggle hides them in the browser)."""
    return render_chat(chat, rejected_texts(chat.trace, session.token_texts))


def figures_of(trace: RunTrace | None, k: int = 3) -> list:
    """The four charts of a run (empty ones before the first)."""
    stats = trace.stats if trace else AcceptanceStats(k)
    points = trace.points if trace else []
    return [acceptance_figure(stats), acceptance_length_figure(points), latency_figure(points),
            throughput_figure(points)]


def tree_view(session: Session, trace: RunTrace | None, step: int | None = None):
    """The tree of `step` (1-based; None: the latest) of the run, with its tokens' texts."""
    trees = trace.trees if trace else []
    if not trees:
        return tree_figure(None, [], 0, "target only: no drafts" if trace and trace.points else "no steps yet")
    i = min(max(int(step or len(trees)), 1), len(trees)) - 1
    tree = trees[i]
    return tree_figure(tree, session.token_texts([trace.roots[i], *tree.tokens]), i + 1)


def tree_step_update(trace: RunTrace | None, step: int | None = None):
    """The step slider over the run's trees, on `step` (None: the latest) (Gradio wants maximum >
    minimum, so it spans 1..2, disabled, until there are two)."""
    n = len(trace.trees) if trace else 0
    return gr.update(maximum=max(n, 2), value=min(max(step or n, 1), max(n, 1)), interactive=n > 1)


def inspector_html(session: Session, trace: RunTrace | None, step: int | None) -> str:
    """Step `step` of the run taken apart (demo/ui/html/inspector.py), its tokens' texts from the tokenizer."""
    record = trace.steps[step] if trace and step is not None and 0 <= step < len(trace.steps) else None
    ids = shown_ids(record) if record else []
    return render_inspector(trace, step, dict(zip(ids, session.token_texts(ids))) if ids else {})


def comparison_html(session: Session, chat: ChatState) -> str:
    cmp = chat.comparison
    return render_comparison(cmp.speedup, cmp.speculative_tokens_per_s, cmp.baseline_tokens_per_s, cmp.identical,
                             cmp.first_difference, session.describe()["dtype"], cmp.reference_width,
                             cmp.one_row_difference) if cmp else ""


def finished_race(chat: ChatState) -> str:
    """The race panel at the finish of both runs (the hint without a comparison)."""
    cmp = chat.comparison
    if cmp is None or cmp.baseline_trace is None or chat.trace is None:
        return render_race_hint()
    steps = (len(chat.trace.points), len(cmp.baseline_trace.points))
    t = max(chat.trace.stats.elapsed_s, cmp.baseline_trace.stats.elapsed_s)
    return render_race(METHOD_LABELS[chat.trace.method], chat.turns[-1], chat.trace, cmp.baseline,
                       cmp.baseline_trace, t, steps, cmp)


def chat_view(c: Controls, session: Session, chat: ChatState, figures: bool = True) -> dict:
    """The text and the stats of one chat state and, with `figures`, its charts and tree view."""
    out = {c.conversation: conversation_html(session, chat),
           c.stats: render_stats(panel_stats(session, chat.trace), DEFINITIONS)}
    if figures:
        out.update(zip(c.plots, figures_of(chat.trace)))
        out[c.tree] = tree_view(session, chat.trace)
        out[c.tree_step] = tree_step_update(chat.trace)
    return out


def streamed(c: Controls, session: Session, update: Update, baseline_tps: float | None, *, view: str,
             figures: bool = False) -> dict:
    """One streamed update of a reply, from its chat state. `view` says what it draws:

    - "status": the status line only (a paced reply: the replay after it draws the steps);
    - "race": the comparison's target-only run streaming into the race, the speculative lane
      beside it as it was after the same engine time;
    - "reply": the text, the stats and the headline (with `figures`, the charts and the tree view).

    A finished reply (update.done) also carries its headline, comparison and race, whatever `view`.
    """
    chat = update.chat
    out = {c.status: status_html(update.status, "done" if update.done else "info")}
    if view == "race":
        trace, base = chat.trace, update.baseline_trace
        t = base.stats.elapsed_s
        out[c.race] = render_race(METHOD_LABELS[trace.method], chat.turns[-1], trace, update.baseline, base, t,
                                  (step_at(trace, t), len(base.points)), None)
    elif view == "reply":
        out |= {c.chat: chat, **chat_view(c, session, chat, figures)}
    if view == "reply" or update.done:
        out[c.headline] = render_headline(chat.trace, baseline_tps, chat.comparison)
    if update.done:
        out |= {c.chat: chat, c.comparison: comparison_html(session, chat), c.race: finished_race(chat)}
    return out
