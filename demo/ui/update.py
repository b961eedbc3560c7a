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
from demo.ui.html.guide import render_guide, step_ids
from demo.ui.html.headline import render_headline
from demo.ui.html.inspector import rejected_texts, render_inspector, shown_ids
from demo.ui.html.race import render_race, render_race_hint
from demo.ui.html.render import render_chat, render_comparison, render_delta, render_stats, status_html


def conversation_html(session: Session, chat: ChatState) -> str:
    """The conversation: the latest reply inspectable, with its rejected drafts (the show-rejected
    toggle hides them in the browser)."""
    return render_chat(chat, rejected_texts(chat.trace, session.draft_texts))


def figures_of(trace: RunTrace | None, k: int = 3, timed: RunTrace | None = None) -> list:
    """The four charts of a run (empty ones before the first); `timed`: the comparison's timed run of
    the same reply, whose step times and speed the two time charts name beside the streamed run's."""
    stats = trace.stats if trace else AcceptanceStats(k)
    points = trace.points if trace else []
    t = timed.stats if timed and timed.stats.num_steps else None
    return [acceptance_figure(stats), acceptance_length_figure(points),
            latency_figure(points, t.mean_draft_ms + t.mean_verify_ms if t else None),
            throughput_figure(points, t.tokens_per_s if t else None)]


def timed_run(chat: ChatState) -> RunTrace | None:
    """The comparison's timed run of the reply shown (nothing drawn between its steps), if there is one."""
    cmp = chat.comparison
    return cmp.speculative_trace if cmp and chat.trace and chat.trace.method != "none" else None


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
    source = session.copy_context(trace, step) if record else None
    return render_inspector(trace, step, dict(zip(ids, session.token_texts(ids))) if ids else {}, source)


def guide_html(session: Session, trace: RunTrace | None, focus: int | None = None) -> str:
    """The reply's first steps told (demo/ui/html/guide.py), or the step `focus`; its tokens' texts
    from the tokenizer."""
    if trace is None:
        return render_guide(None, {})
    records = trace.steps if focus is None else trace.steps[focus:focus + 1]
    ids = list(dict.fromkeys(i for r in records[:4] for i in step_ids(r)))
    return render_guide(trace, dict(zip(ids, session.token_texts(ids))), focus)


def comparison_html(session: Session, chat: ChatState) -> str:
    cmp = chat.comparison
    return render_comparison(cmp.speedup, cmp.speculative_tokens_per_s, cmp.baseline_tokens_per_s, cmp.identical,
                             cmp.first_difference, session.describe()["dtype"], cmp.reference_width,
                             cmp.one_row_difference) if cmp else ""


def race_runs(chat: ChatState):
    """(reply, trace) of the race's two lanes: the comparison's timed runs (nothing drawn between their
    steps), the speculative one falling back to the streamed reply; None without a comparison."""
    cmp = chat.comparison
    if cmp is None or cmp.baseline_trace is None or chat.trace is None:
        return None
    spec = (cmp.speculative, cmp.speculative_trace) if cmp.speculative_trace else (chat.turns[-1], chat.trace)
    return spec, (cmp.baseline, cmp.baseline_trace)


def finished_race(chat: ChatState) -> str:
    """The race panel at the finish of both runs (the hint without a comparison)."""
    runs = race_runs(chat)
    if runs is None:
        return render_race_hint()
    (reply, spec), (base_reply, base) = runs
    steps = (len(spec.points), len(base.points))
    t = max(spec.stats.elapsed_s, base.stats.elapsed_s)
    return render_race(METHOD_LABELS[spec.method], reply, spec, base_reply, base, t, steps, chat.comparison)


def counted_views(session: Session, chat: ChatState) -> dict:
    """The headline and the stats: the views that count the reply's tokens, each saying where the last
    is a stop token the reply does not show."""
    unshown = session.unshown_stop(chat.trace)
    timed = timed_run(chat)
    return {"headline": render_headline(chat.trace, chat.comparison, unshown),
            "stats": render_stats(panel_stats(session, chat.trace), DEFINITIONS, unshown,
                                  timed.stats.summary() if timed else None)}


def chat_view(c: Controls, session: Session, chat: ChatState, figures: bool = True) -> dict:
    """The text, the headline and the stats of one chat state and, with `figures`, its charts and
    tree view: one source, so they always count the same tokens."""
    counted = counted_views(session, chat)
    out = {c.conversation: conversation_html(session, chat), c.headline: counted["headline"],
           c.guide: guide_html(session, chat.trace), c.stats: counted["stats"]}
    if figures:
        out.update(zip(c.plots, figures_of(chat.trace, timed=timed_run(chat))))
        out[c.tree] = tree_view(session, chat.trace)
        out[c.tree_step] = tree_step_update(chat.trace)
    return out


def streamed(c: Controls, session: Session, update: Update, on_page: int | None, *, text: bool,
             figures: bool = False) -> tuple[dict, int | None]:
    """One streamed update of a reply, from its chat state, and how many of the reply's tokens the
    page then holds. `on_page`: how many it holds now (None: the reply is not on the page yet).

    The status line always; with `text`, what the reply gained: the whole conversation once, then
    only each step's new tokens (render_delta, for assets/stream.js to append), the headline and
    the stats, and with `figures` the charts and the tree view. A finished reply (update.done)
    carries its whole rendering, its comparison and its race."""
    chat = update.chat
    out = {c.status: status_html(update.status, "done" if update.done else "info")}
    if update.done:
        out |= {c.chat: chat, **chat_view(c, session, chat), c.comparison: comparison_html(session, chat),
                c.race: finished_race(chat)}
        return out, None
    if not text:
        return out, on_page
    reply = chat.turns[-1]
    if on_page is None:
        out[c.conversation] = conversation_html(session, chat)
    elif len(reply.pieces) > on_page:
        rejected = rejected_texts(chat.trace, session.draft_texts)
        out[c.stream] = render_delta(len(chat.turns), reply.pieces, on_page, rejected)
    counted = counted_views(session, chat)
    out |= {c.headline: counted["headline"], c.stats: counted["stats"]}
    if figures:
        out.update(zip(c.plots, figures_of(chat.trace)))
        out |= {c.tree: tree_view(session, chat.trace), c.tree_step: tree_step_update(chat.trace)}
    return out, len(reply.pieces)
