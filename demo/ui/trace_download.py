"""The chat page's "Download trace (JSON)" button: after every reply (finished or stopped), the
latest run's trace as a file (demo/service/records.py's trace_json), with the versions and device that made it.
A layout builder and a function that registers its listeners."""

from __future__ import annotations

import time

import gradio as gr

from demo.service.chat import ChatState
from demo.service.downloads import write_download
from demo.service.records import environment, trace_json
from demo.service.model_cache import ModelCache
from demo.service.session import Session, shown_session
from demo.ui.events import PRIVATE


def trace_file(session: Session, chat: ChatState) -> str | None:
    """The trace of the chat's latest reply written to a file of its own (demo/service/downloads.py), or
    None when there is no reply to trace yet."""
    if chat.trace is None or not chat.turns or chat.turns[-1].role != "assistant":
        return None
    reply = chat.turns[-1]
    ids = sorted({i for tree in chat.trace.trees for i in tree.tokens})
    info = session.describe()
    text = trace_json(chat.trace, reply, messages=chat.messages()[:-1],
                      token_text=dict(zip(ids, session.token_texts(ids))),
                      environment=environment(device=info["device"], dtype=info["dtype"], model=info["model"],
                                              drafter=info["drafters"].get(chat.trace.method)))
    return write_download(f"speclens-trace-{time.strftime('%Y%m%d-%H%M%S')}.json", text)


def build_trace_download() -> gr.DownloadButton:
    return gr.DownloadButton("Download trace (JSON)", value=None, interactive=False, size="sm",
                             elem_id="sl-trace-download")


def register(c, cache: ModelCache, replies: list, cleared) -> None:
    """replies: the events after which the chat holds a new reply (generated or stopped); cleared:
    the event after which it holds none (c: demo.ui.controls.Controls)."""

    def trace_download(state: ChatState, name: str):
        path = trace_file(shown_session(cache, name), state)
        return gr.DownloadButton(value=path, interactive=path is not None)

    def no_trace():
        return gr.DownloadButton(value=None, interactive=False)

    quiet = dict(show_progress="hidden", **PRIVATE)
    for event in replies:
        event.then(trace_download, inputs=[c.chat, c.model], outputs=[c.trace_download], **quiet)
    cleared.then(no_trace, outputs=[c.trace_download], **quiet)
