"""The chat stream: the prompt, Generate, Stop and Clear, and the reply streaming into the page.

Generate (or Shift+Enter) runs ``user`` (check the request, show the user's turn; no engine, so it
answers at once however busy the engine is) then ``bot`` (the reply, one update per step, then the
target-only comparison when asked for), which waits for the engine's queue. While a reply of the
chat streams, Generate is refused in a sentence (Stop first), so no turn edits a chat still
streaming. Stop and Clear cancel whatever runs and draw the chat as it ended.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator

import gradio as gr

from demo.service import zerogpu
from demo.service.chat import ChatState
from demo.service.engine_thread import engine_busy, engine_thread_idle, on_engine_thread
from demo.service.hosting import Hosting
from demo.service.model_cache import ModelCache
from demo.service.request import Request, RequestError
from demo.service.roles import after_engine
from demo.service.session import Session, shown_session, visitor_session
from demo.ui.assets import read_asset
from demo.ui.controls import Controls
from demo.ui.events import ENGINE, FIGURE_INTERVAL_S, PRIVATE, TEXT_INTERVAL_S, TURNS, TURNS_CONCURRENCY
from demo.ui.html.guide import render_guide
from demo.ui.html.headline import render_headline
from demo.ui.html.inspector import render_inspector
from demo.ui.html.race import render_race_hint
from demo.ui.html.render import render_chat, render_legend, status_html
from demo.ui.replay import PACES
from demo.ui.update import chat_view, conversation_html, finished_race, streamed

PROMPT_HINT = "Ask something, then press Generate or Shift+Enter (Enter starts a new line)"
STILL_REPLYING = "A reply is still being generated: press Stop first, or wait for it to end."
WAITING = "waiting for the engine: it answers one request at a time, and yours starts when those before it end…"


def build_chat_column(k: int) -> dict:
    """The prompt and its buttons first (on the first screen, and steady while text streams in), then
    the status, the headline, the legend, the conversation (which follows the stream), the
    comparison and the step inspector."""
    with gr.Row(elem_id="sl-input-row"):
        # lines > 1: Gradio's textbox inserts a newline on Enter and submits on Shift+Enter
        prompt = gr.Textbox(placeholder=PROMPT_HINT, show_label=False, lines=2, max_lines=6, scale=5,
                            elem_id="sl-prompt")
        with gr.Column(scale=1, min_width=130, elem_classes=["sl-buttons"]):
            generate = gr.Button("Generate", variant="primary", elem_id="sl-generate")
            with gr.Row():
                stop = gr.Button("Stop", variant="stop", elem_id="sl-stop", min_width=55)
                clear = gr.Button("Clear", elem_id="sl-clear", min_width=55)
            settings_button = gr.Button("⚙ Settings", size="sm", elem_id="sl-settings-button")
    status = gr.HTML("", elem_id="sl-status")
    headline = gr.HTML(render_headline(None), elem_id="sl-headline")
    with gr.Row(elem_id="sl-legend-row", equal_height=True):
        legend = gr.HTML(render_legend(k), elem_id="sl-legend")
        show_rejected = gr.Checkbox(True, label="show rejected drafts", elem_id="sl-show-rejected", container=False,
                                    scale=0, min_width=170)
    conversation = gr.HTML(render_chat(ChatState()), elem_id="sl-conversation", js_on_load=read_asset("conversation.js"))
    stream = gr.HTML("", elem_id="sl-stream", visible="hidden", js_on_load=read_asset("stream.js"))
    with gr.Accordion("How this reply was made, step by step", open=True, elem_id="sl-guide-box"):
        guide = gr.HTML(render_guide(None, {}), elem_id="sl-guide")
    comparison = gr.HTML("", elem_id="sl-comparison")
    inspector = gr.HTML(render_inspector(None, None, {}), elem_id="sl-inspector", js_on_load=read_asset("inspect.js"))
    return dict(headline=headline, legend=legend, show_rejected=show_rejected, conversation=conversation,
                stream=stream, guide=guide, inspector=inspector, prompt=prompt, generate=generate, stop=stop, clear=clear,
                settings_button=settings_button, status=status, comparison=comparison)


def checked(c: Controls, hosting: Hosting, session: Session, prompt: str, values: dict) -> Request:
    """The request of the settings' values, refused (RequestError) past the hosting's limits, and
    bounded by its time limit."""
    request = replace(c.request(prompt, values), time_limit_s=hosting.time_limit())
    hosting.check_work(request, session.device)
    return request


def stopped_status(chat: ChatState, running: bool, comparing: bool, status: str | None) -> str | None:
    """What Stop says it stopped: the reply (with how far it got), the comparison after it, or a
    replay; None when nothing ran."""
    if running:
        trace = chat.trace
        if trace is None or not trace.steps:
            return "stopped before the first token"
        return f"stopped after {trace.stats.num_generated} tokens ({trace.stats.accounting()})"
    if comparing:
        return "stopped during the comparison with target-only: the reply is whole, the speedup not measured"
    if "replay (" in (status or ""):
        return "replay stopped: the whole reply is shown"
    return None


def register(c: Controls, cache: ModelCache, hosting: Hosting) -> list:
    """Generate and Shift+Enter; returns their reply events (user, then bot)."""

    def user(values: dict) -> Iterator[dict]:
        """Fast first half: check the request and show the user's turn (no engine call). A refusal is
        said in the status line as well as in its toast, so no earlier status stands beside it."""
        try:
            if values[c.chat].replying:
                raise RequestError(STILL_REPLYING)
            # never loads (this half waits for no engine): a preset evicted since is checked on the
            # default's models here and loads in the reply, which checks again
            session = shown_session(cache, values[c.model])
            request = checked(c, hosting, session, values[c.prompt], values)
            values[c.chat].next_playback()  # a replay, race or step shown of the last reply stops
            chat = session.add_user_turn(values[c.chat], request)
        except RequestError as e:
            yield {c.status: status_html(f"not sent: {e}", "error")}
            raise gr.Error(str(e), print_exception=False) from None
        # the last reply's speedup never stands beside the new prompt, even while the reply waits for
        # the engine or runs at a slow pace (when the headline moves only at its end)
        yield {c.chat: chat, c.conversation: conversation_html(session, chat), c.prompt: "", c.comparison: "",
                c.headline: render_headline(None), c.shown_step: None, c.guide: "",
                c.race: render_race_hint(), c.status: status_html(WAITING if engine_busy() else "starting…"),
                c.inspector: render_inspector(None, None, {})}

    def bot(values: dict) -> Iterator[dict]:
        """Stream the reply: the text every step (at most every TEXT_INTERVAL_S), the charts at most
        every FIGURE_INTERVAL_S, then the comparison's status lines. At a pace slower than real time
        only the status moves: the run goes at full speed and the replay after it (demo/ui/playback.py)
        plays it back."""
        chat = values[c.chat]
        if not chat.turns or chat.turns[-1].role != "user":
            return  # an earlier reply, queued when this turn replaced its own, has answered it
        paced = PACES[values[c.pace]] is not None
        last_text = last_figures = 0.0
        try:
            session = visitor_session(cache, values[c.model])
            request = checked(c, hosting, session, chat.turns[-1].text if chat.turns else "", values)
            on_page = None  # tokens of the reply the page holds (None: not on the page yet)
            for update in on_engine_thread(session.reply(chat, request)):
                now = time.monotonic()
                reply = update.chat.turns[-1]
                streaming = reply.role == "assistant" and reply.state == "streaming"
                if streaming and now - last_text < TEXT_INTERVAL_S:  # a step may wait; a new phase may not
                    continue
                last_text = now
                if paced and not update.done:
                    update.status += " · the step-by-step replay follows"
                figures = now - last_figures >= FIGURE_INTERVAL_S
                last_figures = now if figures else last_figures
                out, on_page = streamed(c, session, update, on_page, text=streaming and not paced, figures=figures)
                yield out
        except RequestError as e:
            yield {c.status: status_html(f"stopped: {e}", "error")}
            raise gr.Error(str(e), print_exception=False) from None

    # Neither half shows progress on its outputs: a refusal is the toast alone, since a status tracker
    # would leave a red "Error" badge over the conversation, the prompt box and the status after it fades.
    engine = dict(concurrency_id=ENGINE, show_progress="hidden", **PRIVATE)
    first = dict(fn=user, inputs={c.prompt, c.chat, c.model, *c.settings},
                 outputs=[c.chat, c.conversation, c.prompt, c.comparison, c.headline, c.race, c.status, c.inspector,
                          c.shown_step, c.guide],
                 concurrency_id=TURNS, concurrency_limit=TURNS_CONCURRENCY, show_progress="hidden", **PRIVATE)
    then = dict(fn=zerogpu.on_gpu(bot), inputs={c.chat, c.model, c.pace, *c.settings},
                outputs=[c.chat, c.status, c.comparison, c.race, c.stream, *c.view], **engine)
    return [c.generate.click(**first).success(**then), c.prompt.submit(**first).success(**then)]


def register_stop(c: Controls, cache: ModelCache, runs: list) -> tuple:
    """Stop and Clear: each cancels `runs` (replies, replays, races) at once, then draws from the
    engine's queue, that is once the reply has ended, so no late step of it can overwrite what they
    show. Returns (stopped, cleared) events."""

    def stop(chat, model, status):
        """Everything from the chat as it ended, so the stats, charts and tree view count the tokens
        the text shows."""
        running = bool(chat.turns) and (chat.turns[-1].role == "user" or chat.turns[-1].state == "streaming")
        comparing = chat.comparing
        chat.mark_stopped()
        chat.next_playback()
        engine_thread_idle()  # the step in flight lands (or, seeing the turn stopped, is dropped) before we draw
        session = shown_session(cache, model)
        said = stopped_status(chat, running, comparing, status)
        out = {c.chat: chat, c.conversation: conversation_html(session, chat),
               c.status: status_html(said, "done") if said else gr.skip()}
        if chat.trace is not None:
            out |= {**chat_view(c, session, chat), c.race: finished_race(chat)}
        return out

    def clear(model):
        chat = ChatState()
        return {c.chat: chat, c.status: "", c.comparison: "", c.race: render_race_hint(),
                c.inspector: render_inspector(None, None, {}), **chat_view(c, shown_session(cache, model), chat)}

    # waiting for the engine, Gradio's tracker would put its queue ETA over the status and the text
    engine = dict(concurrency_id=ENGINE, show_progress="hidden", **PRIVATE)
    stopped = c.stop.click(None, cancels=runs, **PRIVATE).then(
        after_engine(stop), inputs=[c.chat, c.model, c.status], outputs=[c.chat, c.status, c.race, *c.view], **engine)
    cleared = c.clear.click(None, cancels=runs, **PRIVATE).then(
        after_engine(clear), inputs=[c.model], outputs=[c.chat, c.status, c.comparison, c.race, c.inspector, *c.view],
        **engine)
    return stopped, cleared
