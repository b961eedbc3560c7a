"""What each of the page's events does to the app: the tags the UI registers its events with
(demo/ui/events.py) and the public gate counts them by (demo/service/public_gate.py), so that a new
event is counted by what it does, never by its handler's name.

- ENGINE: holds the models (a chat reply, /generate, a benchmark, a preset load), one at a time,
  so that two generations never share the target's KV cache. A handler queued there only to run
  after the engine's work (Stop's and Clear's redraws) is marked ``after_engine`` and holds nothing.
- TURNS: the first half of a chat exchange (check the request, show the user's turn), which touches
  no model and so answers however busy the engine is; it starts a generation, and counts as one.
- PLAYBACK: a replay or a race, which reads a recorded trace at a pace, several at once.
- an event outside the queue (``queue=False``): answered in the request itself (a setting's
  follow-ups, a step of a finished reply); the gate runs one at a time per client.
- an event whose outputs include a file (a download) writes one to disk.
"""

from __future__ import annotations

ENGINE = "engine"
TURNS = "turns"
PLAYBACK = "playback"

GENERATION = "generation"  # what the gate counts: ENGINE and TURNS events
INSTANT = "instant"  # an event outside the queue
OTHER = "other"  # any other queued event (a download, Stop's redraw)


def after_engine(handler):
    """Mark a handler queued in the ENGINE group only for its order (it draws once the engine's work
    before it has ended) and touching no model: the gate counts it as OTHER, not as a generation."""
    handler.after_engine = True
    return handler


def role(fn) -> str:
    """The role of a Gradio BlockFunction: GENERATION, PLAYBACK, INSTANT or OTHER. An ENGINE or
    TURNS event is a generation unless its handler is marked after_engine."""
    if not getattr(fn, "queue", True):
        return INSTANT
    tag = getattr(fn, "concurrency_id", None)
    if tag in (ENGINE, TURNS):
        return OTHER if getattr(fn.fn, "after_engine", False) else GENERATION
    return PLAYBACK if tag == PLAYBACK else OTHER


def writes_files(fn) -> bool:
    """Whether the event's outputs include a file for download (each one written to disk)."""
    import gradio as gr

    return any(isinstance(block, (gr.File, gr.DownloadButton)) for block in getattr(fn, "outputs", ()))
