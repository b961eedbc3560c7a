"""Playback: the pace of the steps, Replay of the latest reply, and the race of a reply against its
target-only run. All three read the recorded trace only (demo/ui/replay.py says what each step
shows and when): outside the engine's queue, several visitors at once.
"""

from __future__ import annotations

import time
from typing import Iterator

import gradio as gr

from demo.methods import METHOD_LABELS
from demo.service.model_cache import ModelCache
from demo.service.session import shown_session
from demo.ui.controls import Controls
from demo.ui.events import FIGURE_INTERVAL_S, PLAYBACK, PLAYBACK_CONCURRENCY, PRIVATE, TEXT_INTERVAL_S
from demo.ui.html.race import render_race
from demo.ui.html.render import status_html
from demo.ui.replay import PACES, REAL_TIME, chat_at, play, race_frames, race_scale, replay_frames
from demo.ui.update import chat_view, guide_html, inspector_html, race_runs

NOTHING_TO_REPLAY = "Nothing to replay yet: generate a reply first."
RACE_NEEDS_COMPARISON = ("The race needs the target-only run of the same prompt: tick “Compare with target-only” "
                         "in the settings and generate.")


def build_playback_row() -> dict:
    """How fast steps are shown, Replay of the latest reply from its trace, and a step at a time."""
    with gr.Row(elem_id="sl-play-row", equal_height=True):
        pace = gr.Radio(list(PACES), value=REAL_TIME, label="Pace", scale=4, elem_id="sl-pace",
                        info="real time: each step after its engine time; slower: the run goes at full speed, "
                             "then plays back step by step")
        with gr.Column(scale=1, min_width=120):
            replay = gr.Button("↺ Replay", min_width=96, elem_id="sl-replay")
            with gr.Row():
                step_back = gr.Button("◂", size="sm", min_width=40, elem_id="sl-step-back")
                step_next = gr.Button("step ▸", size="sm", min_width=60, elem_id="sl-step-next")
    return dict(pace=pace, replay=replay, step_back=step_back, step_next=step_next, shown_step=gr.State(None))


def finished_reply(chat) -> bool:
    return (chat.trace is not None and bool(chat.turns) and chat.turns[-1].role == "assistant"
            and chat.turns[-1].state != "streaming")


def register(c: Controls, cache: ModelCache, replies: list) -> list:
    """The replay after a paced reply, Replay, Race and the step buttons; returns the playbacks'
    events (Stop cancels them). One playback at a time: each starts by taking a new number
    (ChatState.next_playback), and an older one stops at its next frame."""

    def replay(chat, pace, model) -> Iterator[dict]:
        """The latest reply again, step by step from its trace at the pace (no engine): text, headline,
        stats, charts and tree view of each step together."""
        if not finished_reply(chat):
            gr.Warning(NOTHING_TO_REPLAY)
            return
        me = chat.next_playback()
        session, n = shown_session(cache, model), len(chat.trace.points)
        frames = replay_frames(chat.trace, PACES[pace], TEXT_INTERVAL_S)
        last_figures = 0.0
        yield {**chat_view(c, session, chat_at(chat, -1)), c.status: status_html(f"replay ({pace}): the prefill…"),
               c.shown_step: None}
        for frame in play(frames):
            if chat.playback != me:
                return
            now = time.monotonic()
            figures = PACES[pace] is not None or frame is frames[-1] or now - last_figures >= FIGURE_INTERVAL_S
            last_figures = now if figures else last_figures
            yield {**chat_view(c, session, chat_at(chat, frame.step), figures),
                   c.status: status_html(f"replay ({pace}): step {frame.step} of {n}")}
        if chat.playback == me:
            yield {**chat_view(c, session, chat), c.status: status_html(f"replayed {n} steps ({pace}).", "done")}

    def follow(chat, pace, model) -> Iterator[dict]:
        """After a generation at a pace slower than real time: its step-by-step replay."""
        if PACES[pace] is None:
            yield {c.status: gr.skip()}
            return
        yield from replay(chat, pace, model)

    def race(chat, pace) -> Iterator[dict]:
        """The speculative run and its target-only baseline side by side on one clock of engine time,
        from the two recorded traces (no engine)."""
        runs = race_runs(chat)
        if runs is None:
            gr.Warning(RACE_NEEDS_COMPARISON)
            yield {c.race: gr.skip()}  # the panel keeps what it shows
            return
        me = chat.next_playback()
        (reply, spec), (base_reply, base) = runs
        label = METHOD_LABELS[spec.method]
        scale = race_scale(PACES[pace], spec, base)
        frames = race_frames(spec, base, scale, TEXT_INTERVAL_S)
        yield {c.race: render_race(label, reply, spec, base_reply, base, 0.0, (-1, -1), None, scale)}
        for frame in play(frames):
            if chat.playback != me:
                return
            yield {c.race: render_race(label, reply, spec, base_reply, base, frame.t, frame.steps, chat.comparison,
                                       scale)}

    def step(chat, model, shown, move: int) -> dict:
        """One step back or on (from the whole reply: its last step): the text, the headline, the
        stats, the charts, the tree view and the inspector of that step together; a running
        playback stops."""
        if not finished_reply(chat):
            gr.Warning(NOTHING_TO_REPLAY)
            return {c.status: gr.skip()}
        chat.next_playback()
        session, n = shown_session(cache, model), len(chat.trace.points)
        # from the whole reply, "step ▸" starts at its prefill and "◂" goes to its last step but one
        at = (0 if move > 0 else n - 1) if shown is None else shown + move
        at = min(max(at, 0), n)
        view = chat_view(c, session, chat if at == n else chat_at(chat, at))
        return {**view, c.inspector: inspector_html(session, chat.trace, at), c.shown_step: at,
                c.guide: guide_html(session, chat.trace, at),
                c.status: status_html(f"step {at} of {n}" + (": the prefill" if at == 0 else "")
                                      + (" (the whole reply)" if at == n else ""), "done")}

    playback = dict(concurrency_id=PLAYBACK, concurrency_limit=PLAYBACK_CONCURRENCY, show_progress="hidden", **PRIVATE)
    shown = [c.status, *c.view]
    after = [reply.success(follow, inputs=[c.chat, c.pace, c.model], outputs=[*shown, c.shown_step], **playback)
             for reply in replies]
    def step_back(chat, model, at):
        return step(chat, model, at, -1)

    def step_on(chat, model, at):
        return step(chat, model, at, 1)

    for button, fn in ((c.step_back, step_back), (c.step_next, step_on)):
        button.click(fn, inputs=[c.chat, c.model, c.shown_step], outputs=[*shown, c.inspector, c.shown_step],
                     queue=False, show_progress="hidden", **PRIVATE)
    # a click while a playback runs starts a new one ("multiple"), which stops the old (next_playback)
    again = dict(trigger_mode="multiple", **playback)
    return [*after, c.replay.click(replay, inputs=[c.chat, c.pace, c.model], outputs=[*shown, c.shown_step], **again),
            c.race_button.click(race, inputs=[c.chat, c.pace], outputs=[c.race], **again)]
