"""The page's layout: two tabs, the chat page and the Benchmark tab. The chat page is the settings
in a sidebar, the intro, the chat column beside the charts, and the numbers of the run; each
feature's module builds its own components (returned by name into ``Controls``)."""

from __future__ import annotations

import gradio as gr

from demo.metrics import DEFINITIONS
from demo.service.chat import ChatState
from demo.service.hosting import Hosting
from demo.service.session import Session, panel_stats
from demo.service.settings import AppSettings
from demo.ui import chat_stream, inspect_panel, models_panel, playback, settings_panel
from demo.ui.assets import example_prompts, read_asset
from demo.ui.bench_tab import build_bench_tab
from demo.ui.controls import Controls
from demo.ui.figures import CHART_DEFINITIONS
from demo.ui.html.race import render_race_hint
from demo.ui.html.render import notices_html, render_stats
from demo.ui.trace_download import build_trace_download
from demo.ui.update import figures_of


def build_layout(session: Session, hosting: Hosting, defaults: AppSettings = AppSettings()) -> Controls:
    """Two tabs: the chat page, and the Benchmark tab (demo/ui/bench_tab.py); before them, the
    keyboard's link to the prompt box."""
    gr.HTML('<a class="sl-skip" href="#sl-prompt">Skip to the prompt</a>', elem_id="sl-skip",
            js_on_load=read_asset("skip.js"))
    with gr.Tabs(elem_id="sl-tabs"):
        with gr.Tab("Chat", id="chat", elem_id="sl-tab-chat"):
            controls = build_chat_page(session, hosting, defaults)
        controls.bench = build_bench_tab(session, hosting)
    return controls


def build_chat_page(session: Session, hosting: Hosting, defaults: AppSettings) -> Controls:
    with gr.Sidebar(open=True, width=340, elem_id="sl-sidebar"):
        models = dict(preset=models_panel.build_preset(session))
        settings = settings_panel.build_settings(session, defaults)
        if not hosting.public:  # public mode builds no field that names a path or a hub id
            models |= models_panel.build_custom_models(session)
    gr.Markdown(read_asset("intro.md"), elem_id="sl-intro")
    with gr.Accordion("What am I looking at?", open=False, elem_id="sl-explainer"):
        gr.Markdown(read_asset("explainer.md"))
    notices = gr.HTML(notices_html(session.warnings), elem_id="sl-notices")
    with gr.Row(elem_id="sl-top"):
        with gr.Column(scale=6, elem_id="sl-main"):
            chat_parts = chat_stream.build_chat_column(defaults.k or session.default_draft()[0])
            trace_download = build_trace_download()
            gr.Examples([[p] for p in example_prompts()], inputs=[chat_parts["prompt"]], label="Example prompts",
                        examples_per_page=len(example_prompts()), elem_id="sl-examples")
        with gr.Column(scale=5, elem_id="sl-charts"):
            chart_parts = {**playback.build_playback_row(), **build_chart_tabs()}
    with gr.Accordion("Numbers of this run", open=True, elem_id="sl-stats-panel"):
        stats = gr.HTML(render_stats(panel_stats(session, None), DEFINITIONS), elem_id="sl-stats")
    return Controls(chat=gr.State(ChatState()), model=gr.State(session.name),
                    notices=notices, stats=stats, trace_download=trace_download,
                    **chat_parts, **models, **settings, **chart_parts)


def build_chart(name: str, figure) -> gr.Plot:
    with gr.Column(elem_classes=["sl-chart"], min_width=320):
        plot = gr.Plot(figure, show_label=False, elem_id=f"sl-plot-{name}")
        gr.Markdown(CHART_DEFINITIONS[name], elem_classes=["sl-caption"])
    return plot


def build_chart_tabs() -> dict:
    """The tree view, the charts and the race in tabs: one at a time beside the text (or under it
    on a phone). Gradio draws a tab's contents when it is first opened, with their latest values."""
    empty = dict(zip(["acceptance", "acceptance_length", "latency", "throughput"], figures_of(None)))
    with gr.Tabs(elem_id="sl-chart-tabs"):
        with gr.Tab("Draft tree", id="tree", elem_id="sl-tab-tree"):
            tree_parts = inspect_panel.build_tree_panel()
        with gr.Tab("Acceptance", id="acceptance", elem_id="sl-tab-acceptance"):
            plots = {name: build_chart(name, empty[name]) for name in ("acceptance", "acceptance_length")}
        with gr.Tab("Time", id="time", elem_id="sl-tab-time"):
            plots |= {name: build_chart(name, empty[name]) for name in ("latency", "throughput")}
        with gr.Tab("Race", id="race", elem_id="sl-tab-race"):
            race = gr.HTML(render_race_hint(), elem_id="sl-race")
            race_button = gr.Button("▶ Race", elem_id="sl-race-button")
            gr.Markdown("The same prompt with drafts and target-only, replayed on one clock of engine time at the "
                        "pace chosen under the prompt (real time: as measured; slower: a target-only step lasts "
                        "that long).", elem_classes=["sl-caption"])
    return dict(**tree_parts, **plots, race=race, race_button=race_button)
