"""Raw HTTP against an app served on 127.0.0.1, as a visitor's browser or a script would: Gradio's
own routes (/gradio_api/queue/join + /queue/data as the page does, /call/generate, /upload).
Clients are told apart by X-Forwarded-For, which uvicorn takes from a local peer as the client's
address."""

from __future__ import annotations

import json
import socket

import httpx

from demo.service.hosting import Hosting

PROMPT = "Say a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(demo, hosting: Hosting) -> str:
    """Launch `demo` as app.py does (queue cap, upload bound, per-client limit when public)."""
    hosting.queue(demo)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                            **hosting.launch_options(demo))
    return url


def client(n: int) -> dict:
    """Headers of client number n (its address, as a local proxy would forward it)."""
    return {"X-Forwarded-For": f"10.0.0.{n}"}


# ---------------------------------------------------------------------- raw HTTP helpers
def events(http: httpx.Client, url: str, path: str):
    """The server-sent events of a GET stream, as (event, data) pairs."""
    with http.stream("GET", url + path, timeout=60) as r:
        kind = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                yield kind, json.loads(line[5:])


def post_generate(http: httpx.Client, url: str, headers: dict, **params) -> httpx.Response:
    """POST /gradio_api/call/generate with the contract's parameters by name (the rest default)."""
    order = ["prompt", "method", "mode", "num_spec_tokens", "temperature", "top_p", "max_new_tokens", "seed",
             "tree_topk", "num_draft_tokens", "draft_sampling", "lookup"]
    defaults = dict(prompt=PROMPT, method="eagle", mode="eager", num_spec_tokens=3, temperature=0.0, top_p=1.0,
                    max_new_tokens=8, seed=0, tree_topk=0, num_draft_tokens=0, draft_sampling="pointmass", lookup=0)
    data = [{**defaults, **params}[name] for name in order]
    return http.post(url + "gradio_api/call/generate", content=json.dumps({"data": data}),  # NaN as a script sends it
                     headers={**headers, "content-type": "application/json"}, timeout=30)


def generate(http: httpx.Client, url: str, headers: dict, **params) -> dict:
    """A whole /call/generate: the final value, or {"error": message}."""
    r = post_generate(http, url, headers, **params)
    assert r.status_code == 200, r.text
    last = None
    for kind, data in events(http, url, f"gradio_api/call/generate/{r.json()['event_id']}"):
        if kind == "error":
            return {"error": data.get("error") if isinstance(data, dict) else data}
        if kind == "complete":
            return data[0]
        last = data
    raise AssertionError(f"the stream ended without completing (last: {last})")


def join(http: httpx.Client, url: str, demo, name: str, session_hash: str, headers: dict, values: dict,
         event_data=None) -> httpx.Response:
    """Join the queue with the page's event handled by function `name` (its first registration),
    its inputs the components' initial values overridden by `values` (elem_id -> value), without
    reading its stream."""
    fn = next(f for f in demo.fns.values() if f.name == name)
    data = [values.get(block.elem_id, None if block.stateful else block.value) for block in fn.inputs]
    body = {"data": data, "fn_index": fn._id, "session_hash": session_hash, "event_data": event_data, "trigger_id": None}
    return http.post(url + "gradio_api/queue/join", content=json.dumps(body), timeout=30,
                     headers={**headers, "content-type": "application/json"})


def ui_event(http: httpx.Client, url: str, demo, name: str, session_hash: str, headers: dict, values: dict) -> dict:
    """Run the page's event handled by function `name` as the page would (queue/join, then its
    stream), with the components' initial values overridden by `values` (elem_id -> value).
    Returns {elem_id: output} of the completed event, or {"error": message}."""
    fn = next(f for f in demo.fns.values() if f.name == name)
    r = join(http, url, demo, name, session_hash, headers, values)
    if r.status_code != 200:
        return {"error": r.json().get("detail"), "status": r.status_code}
    event_id = r.json()["event_id"]
    for _, msg in events(http, url, f"gradio_api/queue/data?session_hash={session_hash}"):
        if msg.get("event_id") == event_id and msg.get("msg") == "process_completed":
            if not msg["success"]:
                return {"error": msg["output"].get("error")}
            return {block.elem_id or block._id: value for block, value in zip(fn.outputs, msg["output"]["data"])}
    raise AssertionError(f"{name} never completed")


def chat_turn(http, url, demo, session_hash: str, headers: dict, prompt: str = PROMPT) -> str:
    """One exchange of the page (user, then bot): the conversation's HTML."""
    first = ui_event(http, url, demo, "user", session_hash, headers,
                     {"sl-prompt": prompt, "sl-max-new": 8, "sl-shape": "chain", "sl-method": "eagle"})
    assert "error" not in first, first
    reply = ui_event(http, url, demo, "bot", session_hash, headers, {"sl-max-new": 8, "sl-shape": "chain",
                                                                      "sl-method": "eagle"})
    assert "error" not in reply, reply
    return reply["sl-conversation"]


def direct(http: httpx.Client, url: str, demo, name: str, session_hash: str, headers: dict, values: dict,
           route: str = "run/predict") -> httpx.Response:
    """POST the page's event handled by function `name` to a direct route (by default /run/predict,
    where the page sends its events outside the queue), by fn_index, its inputs as `join` makes them."""
    fn = next(f for f in demo.fns.values() if f.name == name)
    data = [values.get(block.elem_id, None if block.stateful else block.value) for block in fn.inputs]
    body = {"data": data, "fn_index": fn._id, "session_hash": session_hash, "event_data": None, "trigger_id": None}
    return http.post(url + "gradio_api/" + route, content=json.dumps(body), timeout=60,
                     headers={**headers, "content-type": "application/json"})
