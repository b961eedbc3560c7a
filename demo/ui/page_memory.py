"""A visitor's page in memory (Gradio calls it a session; in SpecLens a Session is the service over
loaded models, demo/service/session.py): Gradio keeps each page's state (the chat, its last reply's
trace, the page's values) until its capacity (hosting's SESSION_CAPACITY in public mode) pushes out
the least recently used, and a closed page's for an hour more. A public app drops a session as soon
as its page closes (Gradio's unload event, when the page's heartbeat ends), with the queue's
message box of it. What the engine computed for a session leaves nothing behind either: prompts
run padded to a few row counts (demo.engine.Engine.prefill_bucket), so the libraries' per-shape
caches stop growing once those are seen, and hosting.limit_malloc_arenas keeps the memory freed by
Gradio's worker threads reusable by the others."""

from __future__ import annotations

import gradio as gr


def forget_on_leave(demo: gr.Blocks) -> None:
    """Register the unload listener that drops the leaving visitor's page state from `demo`'s memory."""

    def forget_session(request: gr.Request) -> None:
        holder = getattr(demo, "state_holder", None)  # Gradio's StateHolder, set when the app starts
        page = getattr(request, "session_hash", None)
        if holder is None or not page:
            return
        with holder.lock:
            holder.session_data.pop(page, None)
            holder.time_last_used.pop(page, None)
        queue = getattr(demo, "_queue", None)  # and the queue's message box of the session (Gradio keeps 2,000)
        if queue is not None:
            queue.pending_messages_per_session.pop(page, None)

    demo.unload(forget_session)
