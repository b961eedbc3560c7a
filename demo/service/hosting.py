"""Hosting: two ways to run, one flag apart, and the limits that keep one visitor of a public app
from taking it from the others. Each limit is a named constant here, next to its check.

- local (``python app.py --local``; the default off a Hugging Face Space): everything, as on your
  own machine: any preset, your own target and drafters ("Your own models", the Load button).
- public (``python app.py --public``; the default on a Space, where ``SPACE_ID`` is set): visitors
  choose among presets only. The custom target / drafter fields and the Load button are not built
  and their events are not registered, so no request can name a path or a hub id. A request holds
  the engine for at most ENGINE_HOLD_S (``Hosting.time_limit``); on a CPU it may ask for at most
  CPU_WORK_BUDGET verified tokens (``Hosting.check_work``), and a run of the Benchmark tab at most
  BENCH_WORK_BUDGET (``Hosting.check_bench_work``). What one client may hold, send and write at once
  is refused at the door, before Gradio reads it (the CLIENT_* limits of demo/service/public_gate.py),
  and Gradio keeps at most SESSION_CAPACITY sessions.

In both modes Gradio's queue holds at most QUEUE_MAX_SIZE events (SPECLENS_QUEUE_SIZE may set
another, demo/service/settings.py), and /gradio_api/upload takes files of at most MAX_FILE_SIZE (the one
file input is the Benchmark tab's prompt file). A visitor's preset is theirs alone (views.py keeps
it in gr.State); the loaded models are shared read-only (demo/service/session.py ModelCache).

A client that goes away stops its generation at the next step: Gradio marks a job dead when its
event stream (the page's /queue/data, or the GET of a /call) closes, and asks a streaming handler
for no further step (tests/service/test_hosting.py proves it). A /call POST whose stream is never opened has
no connection to lose: it runs to its end, which the gate's CLIENT_GENERATIONS and ENGINE_HOLD_S bound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from demo.service.public_gate import PublicGate
from demo.service.request import Request, RequestError, check_values

QUEUE_MAX_SIZE = 16  # events waiting in Gradio's queue; past it a join is refused ("queue is full", 503)
MAX_FILE_SIZE = "1mb"  # what /gradio_api/upload takes (launch(max_file_size=...)); larger: 413
# public, any device: the longest one request may hold the engine (a reply with its comparison, a
# benchmark run), in seconds: it stops there and says so. Every visitor's generations wait behind it,
# so a second visitor's short reply waits at most about this long (tests/service/test_public_gate.py).
ENGINE_HOLD_S = 15.0
# public, on a CPU: the tokens one request may have the target verify, max_new_tokens times the
# tokens verified per step (twice over with the target-only comparison, which verifies one per
# step): refused up front, where ENGINE_HOLD_S would cut the reply anyway.
CPU_WORK_BUDGET = 4096
# public: what one run of the Benchmark tab may have the target verify, summed over its configurations
# (prompts x (max new tokens + the warm-up's) x tokens verified per step, demo/bench/plan.py): on a
# CPU as much as one chat request; on a GPU, which verifies a step's tokens in about the time of one,
# 10 times that: the tab's default plan with the GPU's default tree (80 tokens a step, its lookup
# branch's included) fits. ENGINE_HOLD_S bounds its time.
BENCH_WORK_BUDGET = {"cpu": CPU_WORK_BUDGET, "cuda": 10 * CPU_WORK_BUDGET}
# Sessions Gradio keeps in memory (each holds its chat, its last reply's trace and the page's values);
# past it the least recently used goes. A session is dropped when its page closes (views.py).
SESSION_CAPACITY = 256


# glibc gives each thread that allocates its own malloc arena (up to 8 per core), and an arena keeps
# what its thread freed: over Gradio's worker threads a public app's memory only grew. Two arenas
# (MALLOC_ARENA_MAX=2, as servers commonly set) keep the freed memory reusable by every thread.
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for the threads that start from now on (mallopt M_ARENA_MAX); True
    where it took (Linux with glibc), False elsewhere. Call it before the server's threads start."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-8, arenas))  # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class Hosting:
    """How the app is served: public (presets only, per-client limits) or local (everything)."""

    public: bool = False

    @classmethod
    def choose(cls, public: bool | None = None) -> "Hosting":
        """--public / --local when given (True / False), else public on a Space (SPACE_ID set)."""
        return cls(bool(os.environ.get("SPACE_ID")) if public is None else public)

    def check_work(self, request: Request, device) -> None:
        """Public, on a CPU: refuse a request asking the target to verify more than CPU_WORK_BUDGET tokens."""
        if not self.public or device.type != "cpu":
            return
        check_values(request)  # numbers first: the budget's arithmetic takes no null, NaN or string
        per_step = request.shape.width + (1 if request.compare else 0)
        max_new = int(request.gen.max_new_tokens)
        if max_new * per_step > CPU_WORK_BUDGET:
            raise RequestError(f"This request would have the target verify up to {max_new * per_step:,} tokens "
                               f"({max_new} new tokens x {per_step} verified per step); this public CPU app "
                               f"allows {CPU_WORK_BUDGET:,} per request. Lower max new tokens, or draft fewer "
                               "tokens per step.")

    def bench_budget(self, device) -> int | None:
        """Public: the most a benchmark run may have the target verify on `device` (None: no limit)."""
        return BENCH_WORK_BUDGET.get(device.type, CPU_WORK_BUDGET) if self.public else None

    def check_bench_work(self, work: int, device) -> None:
        """Public: refuse a benchmark that would have the target verify more than BENCH_WORK_BUDGET tokens."""
        budget = self.bench_budget(device)
        if budget is not None and work > budget:
            raise RequestError(f"This benchmark would have the target verify up to {work:,} tokens; this public app "
                               f"allows {budget:,} per run. Choose fewer prompts, fewer max new tokens, or fewer "
                               "methods, modes, draft shapes or k values.")

    def time_limit(self) -> float | None:
        """Public: the seconds one request may hold the engine (None: no limit)."""
        return ENGINE_HOLD_S if self.public else None

    def queue(self, demo, max_size: int = QUEUE_MAX_SIZE) -> None:
        """Queue `demo`'s events: one engine job at a time (its ENGINE concurrency group; other groups
        as the UI sets them), at most `max_size` waiting. In public mode the queue is the only way in
        (``api_open=False``: Gradio's direct routes refuse queued events, as the gate does first)."""
        demo.queue(default_concurrency_limit=1, max_size=max_size, api_open=not self.public)

    def launch_options(self, demo) -> dict:
        """demo.launch keywords: the upload bound, and in public mode the gate (per-client limits)
        and the sessions kept."""
        options: dict = dict(max_file_size=MAX_FILE_SIZE)
        if self.public:
            from starlette.middleware import Middleware

            options["app_kwargs"] = {"middleware": [Middleware(PublicGate, blocks=demo)]}
            options["state_session_capacity"] = SESSION_CAPACITY
        return options
