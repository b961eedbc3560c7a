"""The public app's gate: an ASGI middleware in front of Gradio's routes that refuses, before Gradio
reads a request, what one client may not do (demo/service/hosting.py names each limit and says why).

- every POST: at most CLIENT_POSTS a second on average (a bucket of CLIENT_BURST), and a body of at
  most MAX_BODY_BYTES (MAX_UPLOAD_BYTES for /upload), refused on its Content-Length or, without one,
  as soon as the bytes read pass the bound: nothing larger is buffered;
- a queue join (/queue/join or /call/<api_name>): a list of exactly the inputs its handler takes (a
  wrong count is refused in a sentence, where Gradio would print every value it got into the log),
  each of the kind, range or choices of its component (Gradio would print a traceback for each
  value it refuses), and at most CLIENT_EVENTS events of the client queued or running, of them at most
  CLIENT_GENERATIONS generations (GENERATIONS: whatever holds the engine) and CLIENT_PLAYBACKS
  playbacks (PLAYBACKS), counted from Gradio's own queue across all the client's sessions;
- files written: at most CLIENT_UPLOADS uploads and CLIENT_FILES written downloads (FILES) per
  WRITES_WINDOW_S.

A refusal is JSON {"detail", "error"} with 413, 422 or 429 and one sentence, and writes nothing to
the log.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections import defaultdict, deque

# On a Space every request comes from its proxy, which appends the visitor's address to
# X-Forwarded-For; entries left of the ones its proxies append come from the client and could be forged.
SPACE_PROXY_HOPS = 1

# What one client (one address) may do at once in public mode, refused before Gradio reads it.
# Handlers are named by function name (demo/ui/), so those stay.
GENERATIONS = ("user", "bot", "generate", "run_benchmark", "choose_preset")  # each holds or starts an engine run
PLAYBACKS = ("follow", "replay", "race")  # read a recorded trace, at a pace (demo/ui/playback.py)
FILES = ("trace_download", "run_benchmark")  # each writes a file for download (demo/service/downloads.py)
CLIENT_GENERATIONS = 1  # generations queued or running; a reply's two halves are one (the first has ended)
CLIENT_PLAYBACKS = 2  # playbacks queued or running: a new Replay while one plays stops the old at its next frame
CLIENT_EVENTS = 4  # queued or running events of any kind: a quarter of the queue
CLIENT_POSTS, CLIENT_BURST = 10, 60  # POSTs a second on average, and at once (the page sends a few per action)
CLIENT_UPLOADS, CLIENT_FILES, WRITES_WINDOW_S = 10, 60, 600  # uploads, written downloads per 10 minutes
MAX_BODY_BYTES = 1 << 20  # a request body: the longest prompt the context takes is well under it
MAX_UPLOAD_BYTES = 2 << 20  # an upload's body: a file of hosting's MAX_FILE_SIZE and its multipart framing
BUSY = ("You already have a generation running or waiting (one at a time per visitor): wait for it to "
        "end, or press Stop, then try again.")

TOO_FAST = "Too many requests from your address at once: wait a moment, then try again."
TOO_MANY_EVENTS = ("You already have several actions waiting or running: wait for them to end, or press Stop, "
                   "then try again.")
PLAYING = "You already have a replay or a race playing: wait for it to end, or press Stop, then try again."
TOO_MANY_FILES = (f"You have written many files in the last {WRITES_WINDOW_S // 60} minutes (uploads or downloads); "
                  "wait a few minutes, then try again.")


def client_key(request) -> str:
    """Who a request comes from (a starlette or gr.Request): off a Space its peer's address (uvicorn
    already resolves a local proxy's X-Forwarded-For there); on a Space, where every peer is the
    Space's proxy, the X-Forwarded-For entry SPACE_PROXY_HOPS from the right."""
    forwarded = [h.strip() for h in (request.headers.get("x-forwarded-for") or "").split(",") if h.strip()]
    if os.environ.get("SPACE_ID") and len(forwarded) >= SPACE_PROXY_HOPS:
        return forwarded[-SPACE_PROXY_HOPS]
    return request.client.host if request.client else "unknown"


def too_large(bound: int) -> str:
    return f"This request is larger than this public app takes ({bound // 1024:,} KB at most)."


class Refused(Exception):
    """A request the gate answers itself: its status and its sentence."""

    def __init__(self, status: int, sentence: str):
        super().__init__(sentence)
        self.status, self.sentence = status, sentence


class Window:
    """At most `limit` events per key in any `seconds` (a sliding window of their times)."""

    def __init__(self, limit: int, seconds: float):
        self.limit, self.seconds = limit, seconds
        self.times: dict[str, deque] = defaultdict(deque)

    def take(self, key: str, now: float) -> bool:
        times = self.times[key]
        while times and now - times[0] >= self.seconds:
            times.popleft()
        if len(times) >= self.limit:
            return False
        times.append(now)
        return True

    def forget_idle(self, now: float) -> None:
        for key in [k for k, t in self.times.items() if not t or now - t[-1] >= self.seconds]:
            del self.times[key]


class Bucket:
    """A token bucket per key: `rate` tokens a second up to `burst`; a request takes one."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.state: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def take(self, key: str, now: float) -> bool:
        tokens, when = self.state.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens < 1:
            self.state[key] = (tokens, now)
            return False
        self.state[key] = (tokens - 1, now)
        return True

    def forget_idle(self, now: float) -> None:
        full = self.burst / self.rate  # seconds after which any key's bucket is full again
        for key in [k for k, (_, when) in self.state.items() if now - when >= full]:
            del self.state[key]


class PublicGate:
    """The middleware (Hosting.launch_options installs it in public mode). `blocks`: the app, whose
    queue says what each client holds."""

    JOIN = re.compile(r"/gradio_api/(queue/join|call/(v2/)?(?P<api_name>[^/]+))/?$")
    UPLOAD = re.compile(r"/gradio_api/upload/?$")
    SWEEP_S = 60.0  # how often idle clients' counters are dropped (memory stays bounded by active clients)

    def __init__(self, app, blocks):
        self.app, self.blocks = app, blocks
        self.lock = asyncio.Lock()  # one join at a time, so simultaneous joins of a client count each other
        self.posts = Bucket(CLIENT_POSTS, CLIENT_BURST)
        self.uploads = Window(CLIENT_UPLOADS, WRITES_WINDOW_S)
        self.files = Window(CLIENT_FILES, WRITES_WINDOW_S)
        self.swept = time.monotonic()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        from starlette.requests import Request as HTTPRequest

        key, path, now = client_key(HTTPRequest(scope)), scope["path"], time.monotonic()
        self._sweep(now)
        try:
            if not self.posts.take(key, now):
                raise Refused(429, TOO_FAST)
            upload = bool(self.UPLOAD.search(path))
            body, receive = await _bounded(scope, receive, MAX_UPLOAD_BYTES if upload else MAX_BODY_BYTES)
            if upload and not self.uploads.take(key, now):
                raise Refused(429, TOO_MANY_FILES)
            join = self.JOIN.search(path)
            if join is None:
                return await self.app(scope, receive, send)
            fn, data, session = self._join(join["api_name"], body)
            if fn is None:
                return await self.app(scope, receive, send)  # Gradio answers what names no handler
            _check_arity(fn, data, api=join["api_name"] is not None)
            _check_values(fn, data, self._session_blocks(session))
            async with self.lock:
                self._check_holds(key, fn)
                if fn.name in FILES and not self.files.take(key, now):
                    raise Refused(429, TOO_MANY_FILES)
                await self.app(scope, receive, send)  # the join returns once Gradio holds the event
        except Refused as refusal:
            await _answer(scope, receive, send, refusal)

    # ------------------------------------------------------------------ joins
    def _join(self, api_name: str | None, body: bytes):
        """(the BlockFunction a join names, its data, its session hash): /call/<api_name>, or
        queue/join's fn_index. (None, ...) when the body names no handler: Gradio answers it."""
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            return None, None, None
        if not isinstance(payload, dict):
            return None, None, None
        fns = self.blocks.fns
        if api_name is not None:
            fn = next((f for f in fns.values() if f.api_name == api_name), None)
        else:
            index = payload.get("fn_index")
            fn = fns.get(index) if isinstance(index, int) and not isinstance(index, bool) else None
        session = payload.get("session_hash")
        return fn, payload.get("data"), session if isinstance(session, str) else None

    def _check_holds(self, key: str, fn) -> None:
        """Refuse a join past what `key` may hold."""
        held = [e for e in self._unfinished() if client_key(e.request) == key]
        if fn.name in GENERATIONS and sum(e.fn.name in GENERATIONS for e in held) >= CLIENT_GENERATIONS:
            raise Refused(429, BUSY)
        if fn.name in PLAYBACKS and sum(e.fn.name in PLAYBACKS for e in held) >= CLIENT_PLAYBACKS:
            raise Refused(429, PLAYING)
        if len(held) >= CLIENT_EVENTS:
            raise Refused(429, TOO_MANY_EVENTS)

    def _unfinished(self) -> list:
        """The events Gradio's queue holds waiting or running. Gradio sends an event's last message
        and clears its running slot with no await between, so an event whose end a client has seen
        is never counted (Gradio forgets it later, in event_ids_to_events, after a few awaits)."""
        queue = self.blocks._queue
        waiting = [e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
        return waiting + [e for job in list(queue.active_jobs) if job for e in job]

    def _session_blocks(self, session: str | None) -> dict:
        """The components as `session` has them (a slider's range, a radio's choices change per
        session); {} for a session Gradio does not hold."""
        holder = getattr(self.blocks, "state_holder", None)
        state = holder.session_data.get(session) if holder is not None and session else None
        return state.blocks_config.blocks if state is not None else {}

    def _sweep(self, now: float) -> None:
        if now - self.swept >= self.SWEEP_S:
            self.swept = now
            for counter in (self.posts, self.uploads, self.files):
                counter.forget_idle(now)


def _check_arity(fn, data, api: bool) -> None:
    """A page event's data is one value per input; /generate (gr.api) may leave its later ones to
    their defaults."""
    wanted = len(fn.inputs)
    if not isinstance(data, list) or (len(data) > wanted if api else len(data) != wanted):
        got = f"{len(data)} values" if isinstance(data, list) else type(data).__name__
        raise Refused(422, f"This event takes a list of {wanted} input values, not {got}.")


def _check_values(fn, data: list, blocks: dict) -> None:
    """Each value is of its component's kind and within its range or choices, as Gradio's own
    preprocessing would demand, but refused here in a sentence (Gradio prints a traceback for each)."""
    import gradio as gr

    for block, value in zip(fn.inputs, data):
        block = blocks.get(block._id, block)
        name = f"{block.label or block.elem_id or 'a value'}"
        if isinstance(block, (gr.Slider, gr.Number)):
            if value is None and isinstance(block, gr.Number):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise Refused(422, f"{name} must be a number, not {json.dumps(value)[:40]}.")
            lo, hi = block.minimum, block.maximum
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise Refused(422, f"{name} = {value:g} is out of range: allowed {lo:g} to {hi:g}.")
        elif isinstance(block, (gr.Radio, gr.Dropdown, gr.CheckboxGroup)) and not getattr(block, "allow_custom_value",
                                                                                          False):
            allowed = [c[1] if isinstance(c, (tuple, list)) else c for c in block.choices or []]
            group = isinstance(block, gr.CheckboxGroup)  # its list holds choices only; a radio may be unset
            chosen = value if group else [value]
            if not isinstance(chosen, list) or any(v not in allowed and (group or v is not None) for v in chosen):
                raise Refused(422, f"{name}: {json.dumps(value)[:40]} is not one of its choices.")
        elif isinstance(block, gr.Checkbox) and not isinstance(value, bool):
            raise Refused(422, f"{name} must be true or false, not {json.dumps(value)[:40]}.")
        elif isinstance(block, gr.Textbox) and value is not None and not isinstance(value, str):
            raise Refused(422, f"{name} must be text, not {json.dumps(value)[:40]}.")


async def _bounded(scope, receive, bound: int):
    """The request body (at most `bound` bytes, else Refused 413 before reading more), and a
    receive that replays it to the app."""
    headers = dict(scope.get("headers") or [])
    declared = headers.get(b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > bound):
        raise Refused(413, too_large(bound))
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > bound:
            raise Refused(413, too_large(bound))
        chunks.append(chunk)
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


async def _answer(scope, receive, send, refusal: Refused) -> None:
    from starlette.responses import JSONResponse

    response = JSONResponse({"detail": refusal.sentence, "error": refusal.sentence}, status_code=refusal.status,
                            headers={"Connection": "close"} if refusal.status == 413 else None)
    await response(scope, receive, send)
