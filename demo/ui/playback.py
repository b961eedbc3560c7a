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
from demo.ui.update import chat_view

NOTHING_TO_REPLAY = "Nothing to replay yet: generate a reply first."
RACE_NEEDS_COMPARISON = ("The race needs the target-only run of the same prompt: tick “Compare with target-only” "
                         "in the settings and generate.")


def build_playback_row() -> dict:
    """How fast steps are shown, and Replay of the latest reply from its trace."""
    with gr.Row(elem_id="sl-play-row", equal_height=True):
        pace = gr.Radio(list(PACES), value=REAL_TIME, label="Pace", scale=4, elem_id="sl-pace",
                        info="real time: each step after its engine time; slower: the run goes at full speed, "
                             "then plays back step by step")
        replay = gr.Button("↺ Replay", scale=1, min_width=96, elem_id="sl-replay")
    return dict(pace=pace, replay=replay)


def register(c: Controls, cache: ModelCache, replies: list) -> list:
    """The replay after a paced reply, Replay and Race; returns their events (Stop cancels them)."""

    def replay(chat, pace, model) -> Iterator[dict]:
        """The latest reply again, step by step from its trace at the pace (no engine): text, stats,
        charts and tree view of each step together."""
        if chat.trace is None or not chat.turns or chat.turns[-1].role != "assistant" \
                or chat.turns[-1].state == "streaming":
            gr.Warning(NOTHING_TO_REPLAY)
            return
        session, n = shown_session(cache, model), len(chat.trace.points)
        frames = replay_frames(chat.trace, PACES[pace], TEXT_INTERVAL_S)
        last_figures = 0.0
        yield {**chat_view(c, session, chat_at(chat, -1)), c.status: status_html(f"replay ({pace}): the prefill…")}
        for frame in play(frames):
            now = time.monotonic()
            figures = PACES[pace] is not None or frame is frames[-1] or now - last_figures >= FIGURE_INTERVAL_S
            last_figures = now if figures else last_figures
            yield {**chat_view(c, session, chat_at(chat, frame.step), figures),
                   c.status: status_html(f"replay ({pace}): step {frame.step} of {n}")}
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
        cmp = chat.comparison
        if cmp is None or cmp.baseline_trace is None:
            gr.Warning(RACE_NEEDS_COMPARISON)
            return
        spec, base = chat.trace, cmp.baseline_trace
        label = METHOD_LABELS[spec.method]
        frames = race_frames(spec, base, race_scale(PACES[pace], base), TEXT_INTERVAL_S)
        yield {c.race: render_race(label, chat.turns[-1], spec, cmp.baseline, base, 0.0, (-1, -1), None)}
        for frame in play(frames):
            yield {c.race: render_race(label, chat.turns[-1], spec, cmp.baseline, base, frame.t, frame.steps, cmp)}

    playback = dict(concurrency_id=PLAYBACK, concurrency_limit=PLAYBACK_CONCURRENCY, show_progress="hidden", **PRIVATE)
    after = [reply.success(follow, inputs=[c.chat, c.pace, c.model], outputs=[c.status, *c.view], **playback)
             for reply in replies]
    return [*after, c.replay.click(replay, inputs=[c.chat, c.pace, c.model], outputs=[c.status, *c.view], **playback),
            c.race_button.click(race, inputs=[c.chat, c.pace], outputs=[c.race], **playback)]
