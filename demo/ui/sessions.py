"""A visitor's session in memory: Gradio keeps each session's state (the chat, its last reply's
trace, the page's values) until its capacity (hosting's SESSION_CAPACITY in public mode) pushes out
the least recently used, and a closed page's for an hour more. A public app drops a session as soon
as its page closes (Gradio's unload event, when the page's heartbeat ends)."""

from __future__ import annotations

import gradio as gr


def forget_on_leave(demo: gr.Blocks) -> None:
    """Register the unload listener that drops the leaving visitor's session from `demo`'s memory."""

    def forget_session(request: gr.Request) -> None:
        holder = getattr(demo, "state_holder", None)  # Gradio's StateHolder, set when the app starts
        session = getattr(request, "session_hash", None)
        if holder is None or not session:
            return
        with holder.lock:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)

    demo.unload(forget_session)
