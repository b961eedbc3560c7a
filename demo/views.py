"""The page: ``build_demo`` lays it out (demo/ui/layout.py), then registers each feature's listeners
(demo/ui/: the chat stream, playback and the race, the settings, the models, the inspector and the
tree view, the trace download, the Benchmark tab) and the /generate API.

Handlers only translate between components and the service (demo/service/: models, requests,
hosting limits); figures come from demo/ui/figures.py and HTML from demo/ui/html/.
"""

from __future__ import annotations

import gradio as gr

from demo.service import downloads
from demo.service.hosting import Hosting
from demo.service.model_cache import ModelCache
from demo.service.session import Session
from demo.service.settings import AppSettings
from demo.ui import (api, bench_tab, chat_stream, inspect_panel, models_panel, page_memory, playback, settings_panel,
                     trace_download)
from demo.ui.controls import Controls
from demo.ui.events import PRIVATE
from demo.ui.layout import build_layout


def register_listeners(c: Controls, cache: ModelCache, hosting: Hosting) -> None:
    """Every feature's listeners. Stop and Clear cancel the replies and the playbacks, so they come last."""
    replies = chat_stream.register(c, cache, hosting)
    plays = playback.register(c, cache, replies)
    stopped, cleared = chat_stream.register_stop(c, cache, [*replies, *plays])
    settings_panel.register(c, Session(cache.get(cache.default_name)).device.type)
    models_panel.register(c, cache)
    inspect_panel.register(c, cache)
    trace_download.register(c, cache, [*replies, stopped], cleared)
    bench_tab.register(c.bench, c.model, cache, hosting)


def build_demo(session: Session, hosting: Hosting = Hosting(), cache: ModelCache | None = None,
               defaults: AppSettings = AppSettings()) -> gr.Blocks:
    """The app on `session`'s models (the default every visitor starts with); other presets load
    into `cache` (by default one made around `session`'s models) when a visitor chooses them.
    `defaults`: what the page offers first (demo/service/settings.py, from SPECLENS_* variables)."""
    cache = cache or ModelCache.around(session.models)
    # Gradio's copies of the files it serves (traces, CSVs) are deleted once as old as ours (demo/service/downloads.py)
    with gr.Blocks(title="SpecLens: watch speculative decoding", fill_width=True,
                   delete_cache=(downloads.KEEP_S, downloads.KEEP_S)) as demo:
        controls = build_layout(session, hosting, defaults)
        register_listeners(controls, cache, hosting)
        api.register(cache, hosting)
        demo.load(None, js=settings_panel.CLOSE_SETTINGS_ON_PHONES_JS, **PRIVATE)
        if hosting.public:
            page_memory.forget_on_leave(demo)
    return demo
