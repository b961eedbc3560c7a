"""The public app's gate: an ASGI middleware in front of Gradio's routes that refuses, before Gradio
reads a request, what one client may not do (demo/service/hosting.py names each limit and says why).

- every POST: at most CLIENT_POSTS a second on average (a bucket of CLIENT_BURST), and a body of at
  most MAX_BODY_BYTES (MAX_UPLOAD_BYTES for /upload), refused on its Content-Length or, without one,
  as soon as the bytes read pass the bound: nothing larger is buffered;
- every event, by whichever route it comes (/queue/join, /call/<api_name>, /run/<api_name>,
  /api/<api_name>, by fn_index or by name): an event the app has, as a list of exactly the inputs its
  handler takes (a wrong count is refused in a sentence, where Gradio would print every value it got
  into the log), each of the kind, range, step or choices of its component (Gradio would print a
  traceback for each value it refuses);
- the direct routes (/run/, /api/) only for the events the page itself sends there, those outside
  the queue: a queued event run directly would skip the queue, its concurrency group and every
  count below (the queue is the only way in, as Gradio's ``api_open=False`` makes it);
- what a client holds, counted by each event's role (demo/service/roles.py: the tags the UI gives
  its events): at most CLIENT_EVENTS events queued or running, of them at most CLIENT_GENERATIONS
  generations and CLIENT_PLAYBACKS playbacks, counted from Gradio's own queue across all the
  client's sessions; its events outside the queue one at a time, at most CLIENT_INSTANT_WAITING
  waiting;
- files written: at most CLIENT_UPLOADS uploads and CLIENT_FILES written downloads (an event whose
  outputs hold a file) per WRITES_WINDOW_S.

A refusal is JSON {"detail", "error"} with 404, 413, 422 or 429 and one sentence, and writes nothing
to the log.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections import defaultdict, deque

from demo.service.roles import GENERATION, INSTANT, PLAYBACK, role, writes_files

# On a Space every request comes from its proxy, which appends the visitor's address to
# X-Forwarded-For; entries left of the ones its proxies append come from the client and could be forged.
SPACE_PROXY_HOPS = 1

# What one client (one address) may do at once in public mode, refused before Gradio reads it.
# Events are counted by their role (demo/service/roles.py), as the UI tags them.
CLIENT_GENERATIONS = 1  # generations queued or running; a reply's two halves are one (the first has ended)
CLIENT_PLAYBACKS = 2  # playbacks queued or running: a new Replay while one plays stops the old at its next frame
CLIENT_EVENTS = 4  # queued or running events of any kind: a quarter of the queue
# events outside the queue run in the request, on Gradio's worker threads: one at a time per client
# (a step of a long reply redraws its whole view), the page's few at once waiting their turn
CLIENT_INSTANT_WAITING = 8
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
NO_SUCH_EVENT = "This app has no such event: reload the page."
DIRECT_CLOSED = ("This public app answers its events through its queue only: call /gradio_api/call/generate "
                 "(gradio_client does), or use the page.")
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

    # an event's routes: the queue (by fn_index, or /call/<api_name>), or directly (/run/, /api/:
    # by fn_index, or by api_name; the page sends its events outside the queue to /run/predict)
    EVENT = re.compile(r"/gradio_api/(?:(?P<join>queue/join)|call/(?P<v2>v2/)?(?P<call>[^/]+)"
                       r"|(?:run|api)/(?P<direct>[^/]+))/?$")
    UPLOAD = re.compile(r"/gradio_api/upload/?$")
    SWEEP_S = 60.0  # how often idle clients' counters are dropped (memory stays bounded by active clients)

    def __init__(self, app, blocks):
        self.app, self.blocks = app, blocks
        self.lock = asyncio.Lock()  # one join at a time, so simultaneous joins of a client count each other
        self.posts = Bucket(CLIENT_POSTS, CLIENT_BURST)
        self.uploads = Window(CLIENT_UPLOADS, WRITES_WINDOW_S)
        self.files = Window(CLIENT_FILES, WRITES_WINDOW_S)
        self.instant: dict[str, list] = {}  # client -> [its lock, how many of its instant events wait or run]
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
            route = self.EVENT.search(path)
            if route is None:
                return await self.app(scope, receive, send)
            fn, data, session = self._event(route, body)
            if route["direct"] is not None and role(fn) != INSTANT:
                raise Refused(404, DIRECT_CLOSED)
            _check_arity(fn, data)
            _check_values(fn, data, self._session_blocks(session))
            if route["direct"] is not None:  # an event outside the queue, answered in this request
                return await self._instant(key, scope, receive, send)
            async with self.lock:
                self._check_holds(key, fn)
                if writes_files(fn) and not self.files.take(key, now):
                    raise Refused(429, TOO_MANY_FILES)
                await self.app(scope, receive, send)  # the join returns once Gradio holds the event
        except Refused as refusal:
            await _answer(scope, receive, send, refusal)

    # ------------------------------------------------------------------ events
    def _event(self, route, body: bytes):
        """(the BlockFunction a request names, its data, its session hash), or Refused 404 when it
        names none: by fn_index where the body gives one (as Gradio reads it), else by api_name."""
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            payload = None
        if not isinstance(payload, dict):
            raise Refused(422, "This request's body is not a JSON object of an event's values.")
        fns, index = self.blocks.fns, None if route["v2"] else payload.get("fn_index")
        api_name = route["call"] or route["direct"]
        if isinstance(index, int) and not isinstance(index, bool):
            fn = fns.get(index)
        elif index is None and api_name is not None:
            fn = next((f for f in fns.values() if f.api_name == api_name), None)
        else:
            fn = None
        if fn is None:
            raise Refused(404, NO_SUCH_EVENT)
        session = payload.get("session_hash")
        data = _keywords(fn, payload) if route["v2"] else payload.get("data")
        return fn, data, session if isinstance(session, str) else None

    async def _instant(self, key: str, scope, receive, send) -> None:
        """An event outside the queue, answered in the request: one of the client's at a time, at most
        CLIENT_INSTANT_WAITING waiting for it."""
        lock, _ = slot = self.instant.setdefault(key, [asyncio.Lock(), 0])
        if slot[1] >= CLIENT_INSTANT_WAITING:
            raise Refused(429, TOO_MANY_EVENTS)
        slot[1] += 1
        try:
            async with lock:
                await self.app(scope, receive, send)
        finally:
            slot[1] -= 1

    def _check_holds(self, key: str, fn) -> None:
        """Refuse a join past what `key` may hold."""
        held = [role(e.fn) for e in self._unfinished() if client_key(e.request) == key]
        kind = role(fn)
        if kind == GENERATION and held.count(GENERATION) >= CLIENT_GENERATIONS:
            raise Refused(429, BUSY)
        if kind == PLAYBACK and held.count(PLAYBACK) >= CLIENT_PLAYBACKS:
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
            for key in [k for k, (_, n) in self.instant.items() if n == 0]:
                del self.instant[key]


def _check_arity(fn, data) -> None:
    """An event's data is one value per input, /generate's too (gradio_client sends every one)."""
    wanted = len(fn.inputs)
    if not isinstance(data, list) or len(data) != wanted:
        got = f"{len(data)} values" if isinstance(data, list) else type(data).__name__
        names = getattr(fn, "api_name", None) == "generate" and _parameters(fn)
        raise Refused(422, f"This event takes a list of {wanted} input values" + (f" ({names})" if names else "")
                      + f", not {got}.")


def _keywords(fn, payload: dict) -> list:
    """/call/v2/<api_name>'s body, keyword values of a gr.api endpoint, as the list of its inputs:
    each parameter's value or, left out, its default (Gradio fills them alike)."""
    import inspect

    try:
        parameters = list(inspect.signature(fn.fn).parameters.values())
    except (TypeError, ValueError):
        raise Refused(404, NO_SUCH_EVENT) from None
    unknown = sorted(set(payload) - {p.name for p in parameters} - {"oauth_token"})  # Gradio drops the token
    if unknown:
        raise Refused(422, f"This endpoint takes {_parameters(fn)}; not {', '.join(unknown)[:80]}.")
    missing = [p.name for p in parameters if p.name not in payload and p.default is inspect.Parameter.empty]
    if missing:
        raise Refused(422, f"This endpoint needs {', '.join(missing)}.")
    return [payload.get(p.name, p.default) for p in parameters]


def _parameters(fn) -> str:
    """A gr.api endpoint's parameter names, in order."""
    import inspect

    try:
        return ", ".join(inspect.signature(fn.fn).parameters)
    except (TypeError, ValueError):
        return ""


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
            if _whole(block) and value != int(value):
                raise Refused(422, f"{name} must be a whole number, not {value:g}.")
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
        elif isinstance(block, gr.File) and value is not None and not _uploaded(value):
            raise Refused(422, f"{name} must be a file uploaded to this app (/gradio_api/upload), or none.")


def _uploaded(value) -> bool:
    """Whether a file input's value names a file in Gradio's upload folder, the only files an event
    may read (Gradio refuses any other with a traceback)."""
    from gradio.utils import abspath, get_upload_folder, is_in_or_equal

    path = value.get("path") if isinstance(value, dict) else None
    return isinstance(path, str) and is_in_or_equal(abspath(path), get_upload_folder())


def _whole(block) -> bool:
    """Whether a slider or number takes whole numbers only: a slider stepping by whole numbers from a
    whole minimum, or a number of precision 0."""
    import gradio as gr

    if isinstance(block, gr.Slider):
        step, lo = block.step, block.minimum or 0
        return float(step).is_integer() and float(lo).is_integer()
    return getattr(block, "precision", None) == 0


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
