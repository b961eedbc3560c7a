"""Looking into a run: the draft tree of any step (the slider), the step inspector opened by a
clicked or tapped token (assets/inspect.js sends its step), and the rejected drafts' toggle. Each
reads the chat's trace, never the engine, so it answers while a reply streams.
"""

from __future__ import annotations

import math

import gradio as gr

from demo.service.model_cache import ModelCache
from demo.service.session import shown_session
from demo.ui.controls import Controls
from demo.ui.events import PRIVATE
from demo.ui.figures import CHART_DEFINITIONS, tree_figure
from demo.ui.html.inspector import render_inspector
from demo.ui.update import inspector_html, tree_step_update, tree_view

SHOW_REJECTED_JS = "(show) => { document.body.classList.toggle('sl-hide-rejected', !show); return []; }"


def build_tree_panel() -> dict:
    with gr.Column(elem_id="sl-tree-panel", elem_classes=["sl-chart"]):
        tree = gr.Plot(tree_figure(None, [], 0), show_label=False, elem_id="sl-plot-tree")
        tree_step = gr.Slider(1, 2, value=1, step=1, label="Step", interactive=False, elem_id="sl-tree-step",
                              info="which decoding step's tree to show (the latest while generating)")
        gr.Markdown(CHART_DEFINITIONS["tree"], elem_classes=["sl-caption"])
    return dict(tree=tree, tree_step=tree_step)


def register(c: Controls, cache: ModelCache) -> None:
    def shown_step(chat, step, model):
        """The step in the tree view and in the inspector. A step typed past the run's (or not a whole
        number) is refused in a sentence and the box shows the nearest step there is."""
        session = shown_session(cache, model)
        trees = len(chat.trace.trees) if chat.trace else 0
        valid = (isinstance(step, (int, float)) and not isinstance(step, bool)
                 and (isinstance(step, int) or math.isfinite(step)) and step == int(step))
        at = min(max(int(step) if valid else trees, 1), max(trees, 1))
        out = {c.tree: tree_view(session, chat.trace, at), c.inspector: inspector_html(session, chat.trace, at),
               c.tree_step: gr.skip()}
        if not valid or at != step:
            typed = "An empty step" if step in (None, "") else f"Step {step}"
            gr.Warning(f"{typed} is not a step of this run: its draft trees are steps 1 to {max(trees, 1)}; "
                       f"showing step {at}.")
            out[c.tree_step] = gr.update(value=at)
        return out

    def show_tree(chat, step, model):
        """The slider moved or its box was typed in (the raw value, unchecked by Gradio); an emptied
        box waits for the next digit, or for leaving it (typed_step)."""
        if step is None:
            return {c.tree: gr.skip(), c.inspector: gr.skip(), c.tree_step: gr.skip()}
        return shown_step(chat, step, model)

    def inspect(chat, model, evt: gr.EventData):
        """A token (or a step button) was clicked or tapped: its step in the inspector and, when the
        step drafted, in the tree view; step -1 closes the inspector."""
        step = evt._data.get("step") if isinstance(evt._data, dict) else None
        trace = chat.trace
        if not isinstance(step, int) or trace is None or not 0 <= step < len(trace.steps):
            return {c.inspector: render_inspector(None, None, {}), c.tree: gr.skip(), c.tree_step: gr.skip()}
        session = shown_session(cache, model)
        drafted = trace.steps[step].tree is not None
        return {c.inspector: inspector_html(session, trace, step),
                c.tree: tree_view(session, trace, step) if drafted else gr.skip(),
                c.tree_step: tree_step_update(trace, step) if drafted else gr.skip()}

    answer = dict(trigger_mode="always_last", show_progress="hidden", **PRIVATE)
    def typed_step(chat, model, evt: gr.EventData):
        """On leaving the slider's number box, which sends the typed value before clamping it."""
        return shown_step(chat, evt._data, model)

    # preprocess=False: Gradio's own range check would refuse a typed step past the slider's maximum
    # with an error (and a server traceback) before show_tree could answer it in a sentence
    c.tree_step.input(show_tree, inputs=[c.chat, c.tree_step, c.model], outputs=[c.tree, c.inspector, c.tree_step],
                      preprocess=False, **answer)
    c.tree_step.release(typed_step, inputs=[c.chat, c.model], outputs=[c.tree, c.inspector, c.tree_step], **answer)
    c.inspector.click(inspect, inputs=[c.chat, c.model], outputs=[c.inspector, c.tree, c.tree_step], **answer)
    # rejected drafts are always in the page's HTML; the toggle shows or hides them in the browser
    c.show_rejected.change(None, inputs=[c.show_rejected], js=SHOW_REJECTED_JS, **PRIVATE)
