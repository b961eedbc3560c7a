"""Hosting: two ways to run, one flag apart, and the limits that keep one visitor of a public app
from taking it from the others. Each limit is a named constant here, next to its check.

- local (``python app.py --local``; the default off a Hugging Face Space): everything, as on your
  own machine: any preset, your own target and drafters ("Your own models", the Load button).
- public (``python app.py --public``; the default on a Space, where ``SPACE_ID`` is set): visitors
  choose among presets only. The custom target / drafter fields and the Load button are not built
  and their events are not registered, so no request can name a path or a hub id. Each client
  may hold CLIENT_GENERATIONS generations, queued or running (``ClientLimit``), and on a CPU a
  request may ask for at most CPU_WORK_BUDGET verified tokens (``Hosting.check_work``), and a run of
  the Benchmark tab at most BENCH_WORK_BUDGET (``Hosting.check_bench_work``).

In both modes Gradio's queue holds at most QUEUE_MAX_SIZE events (SPECLENS_QUEUE_SIZE may set
another, demo/service/settings.py), and /gradio_api/upload takes files of at most MAX_FILE_SIZE (the one
file input is the Benchmark tab's prompt file). A visitor's preset is theirs alone (views.py keeps
it in gr.State); the loaded models are shared read-only (demo/service/session.py ModelCache).

A client that goes away stops its generation at the next step: Gradio marks a job dead when its
event stream (the page's /queue/data, or the GET of a /call) closes, and asks a streaming handler
for no further step (tests/service/test_hosting.py proves it). A /call POST whose stream is never opened has
no connection to lose: it runs to its end, which CLIENT_GENERATIONS and CPU_WORK_BUDGET bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass

from demo.service.request import Request, RequestError

QUEUE_MAX_SIZE = 16  # events waiting in Gradio's queue; past it a join is refused ("queue is full", 503)
MAX_FILE_SIZE = "1mb"  # what /gradio_api/upload takes (launch(max_file_size=...)); larger: 413
CLIENT_GENERATIONS = 1  # public: generations one client may have queued or running; another is refused (429)
# public, on a CPU: the tokens one request may have the target verify, max_new_tokens times the
# tokens verified per step (twice over with the target-only comparison, which verifies one per
# step): 512 new tokens with the CPU's default tree of 8, about 15 s of a 2-core CPU on the default.
CPU_WORK_BUDGET = 4096
# public: what one run of the Benchmark tab may have the target verify, summed over its configurations
# (prompts x (max new tokens + the warm-up's) x tokens verified per step, demo/bench/plan.py): on a
# CPU as much as one chat request; on a GPU, which verifies a step's tokens in about the time of one,
# 8 times that. It holds the engine (every visitor's generations wait behind it), so it stays short.
BENCH_WORK_BUDGET = {"cpu": CPU_WORK_BUDGET, "cuda": 8 * CPU_WORK_BUDGET}
# On a Space every request comes from its proxy, which appends the visitor's address to
# X-Forwarded-For; entries left of the ones its proxies append come from the client and could be forged.
SPACE_PROXY_HOPS = 1

# The handlers (by function name, views.py) that generate, and those of them that start a generation.
HOLDS_GENERATION = ("user", "bot", "generate", "run_benchmark")
STARTS_GENERATION = ("user", "generate", "run_benchmark")
BUSY = ("You already have a generation running or waiting (one at a time per visitor): wait for it to "
        "end, or press Stop, then try again.")


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
                               "methods, modes or k values.")

    def launch_options(self, demo) -> dict:
        """demo.launch keywords: the upload bound, and in public mode the per-client limit."""
        options: dict = dict(max_file_size=MAX_FILE_SIZE)
        if self.public:
            from starlette.middleware import Middleware

            options["app_kwargs"] = {"middleware": [Middleware(ClientLimit, blocks=demo)]}
        return options


def client_key(request) -> str:
    """Who a request comes from (a starlette or gr.Request): off a Space its peer's address (uvicorn
    already resolves a local proxy's X-Forwarded-For there); on a Space, where every peer is the
    Space's proxy, the X-Forwarded-For entry SPACE_PROXY_HOPS from the right."""
    forwarded = [h.strip() for h in (request.headers.get("x-forwarded-for") or "").split(",") if h.strip()]
    if os.environ.get("SPACE_ID") and len(forwarded) >= SPACE_PROXY_HOPS:
        return forwarded[-SPACE_PROXY_HOPS]
    return request.client.host if request.client else "unknown"


class ClientLimit:
    """ASGI middleware: a request that would start a generation (a queue join of a STARTS_GENERATION
    handler, by fn_index or by /call/<api_name>) is refused with 429 and BUSY while its client holds
    CLIENT_GENERATIONS generations, queued or running. What a client holds is read from Gradio's own
    queue (its events from join to end), so a job ending any way (done, stopped, dropped with its
    client) frees its client at once; one lock across the join makes simultaneous requests of a
    client count each other."""

    JOIN = re.compile(r"/gradio_api/(queue/join|call/(v2/)?(?P<api_name>[^/]+))/?$")

    def __init__(self, app, blocks):
        self.app, self.blocks = app, blocks
        self.lock = asyncio.Lock()

    async def __call__(self, scope, receive, send):
        match = scope["type"] == "http" and scope["method"] == "POST" and self.JOIN.search(scope["path"])
        if not match:
            return await self.app(scope, receive, send)
        body, receive = await _buffered(receive)
        if getattr(self._fn(match["api_name"], body), "name", None) not in STARTS_GENERATION:
            return await self.app(scope, receive, send)
        from starlette.requests import Request as HTTPRequest
        from starlette.responses import JSONResponse

        key = client_key(HTTPRequest(scope))
        async with self.lock:
            if self.held(key) >= CLIENT_GENERATIONS:
                return await JSONResponse({"detail": BUSY, "error": BUSY}, status_code=429)(scope, receive, send)
            await self.app(scope, receive, send)  # the join returns once Gradio holds the event

    def held(self, key: str) -> int:
        """The generations `key` has queued or running (Gradio keeps each event from join to end)."""
        events = list(self.blocks._queue.event_ids_to_events.values())
        return sum(e.fn.name in HOLDS_GENERATION and client_key(e.request) == key for e in events)

    def _fn(self, api_name: str | None, body: bytes):
        """The BlockFunction a join names: /call/<api_name>, or queue/join's fn_index."""
        fns = self.blocks.fns.values()
        if api_name is not None:
            return next((fn for fn in fns if fn.api_name == api_name), None)
        try:
            index = json.loads(body).get("fn_index")
        except (ValueError, AttributeError):
            return None  # Gradio answers a malformed join itself
        return self.blocks.fns.get(index) if isinstance(index, int) else None


async def _buffered(receive):
    """The request body, and a receive that replays it to the app."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay
