"""A public app measured against one hostile client, from outside, as a visitor would see it.

    python app.py --public &                          # on the machine to measure
    python -m demo.bench.hostile --url http://127.0.0.1:7860/ --seconds 120

For --seconds, one client (one X-Forwarded-For address) does its worst inside the documented limits
(README, "Hosting"): the longest target-only generations it may ask for, through the page's two
halves in many sessions and through /generate, slow replays, the largest benchmark, Gradio's direct
routes (a generation, the page's events outside the queue), uploads, oversized bodies, wrong-arity
calls and bad values, each as fast as it is answered. Meanwhile
another client asks for a short reply through /generate every few seconds. Prints what the hostile
client got (accepted and refused, by status) and how long each of the visitor's replies took, end
to end. The app must see 127.0.0.1 as a trusted proxy (uvicorn's default), which lets
X-Forwarded-For name each client. Needs httpx (the app's own requirement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections import Counter

import httpx

from demo.methods import DEFAULT_METHOD

HOSTILE, VISITOR = {"X-Forwarded-For": "10.66.0.1"}, {"X-Forwarded-For": "10.77.0.1"}
LONG_PROMPT = "Write a very long story about a lighthouse keeper, chapter by chapter."  # a reply that runs to its limit
GENERATE = ["prompt", "method", "mode", "num_spec_tokens", "temperature", "top_p", "max_new_tokens", "seed",
            "tree_topk", "num_draft_tokens", "draft_sampling", "lookup"]


class App:
    """The served app's routes, from its /config."""

    def __init__(self, url: str):
        self.url = url.rstrip("/") + "/"
        config = httpx.get(self.url + "config", timeout=60).json()
        self.deps = {d["api_name"]: d for d in config["dependencies"] if d.get("api_name")}
        self.values = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
        self.elem = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}

    def data(self, api_name: str, values: dict) -> list:
        ids = self.deps[api_name]["inputs"]
        by_id = {self.elem[e]: v for e, v in values.items() if e in self.elem}
        return [by_id.get(i, self.values.get(i)) for i in ids]

    def join(self, http, api_name: str, session: str, values: dict, headers: dict) -> httpx.Response:
        body = {"data": self.data(api_name, values), "fn_index": self.deps[api_name]["id"], "session_hash": session,
                "event_data": None, "trigger_id": None}
        return http.post(self.url + "gradio_api/queue/join", content=json.dumps(body), timeout=60,
                         headers={**headers, "content-type": "application/json"})

    def direct(self, http, api_name: str, session: str, values: dict, headers: dict) -> httpx.Response:
        """POST a page event to /run/predict by fn_index, where the page sends its events outside the queue."""
        body = {"data": self.data(api_name, values), "fn_index": self.deps[api_name]["id"], "session_hash": session,
                "event_data": None, "trigger_id": None}
        return http.post(self.url + "gradio_api/run/predict", content=json.dumps(body), timeout=60,
                         headers={**headers, "content-type": "application/json"})

    def generate(self, http, headers: dict, **settings) -> tuple[int, dict | None]:
        """POST /call/generate and read its stream to the end: (status, the last value or None)."""
        values = {"prompt": "Say hi.", "method": DEFAULT_METHOD, "mode": "eager", "num_spec_tokens": 3, "temperature": 0.0,
                  "top_p": 1.0, "max_new_tokens": 24, "seed": 0, "tree_topk": 0, "num_draft_tokens": 0,
                  "draft_sampling": "pointmass", "lookup": 0, **settings}
        r = http.post(self.url + "gradio_api/call/generate", content=json.dumps({"data": [values[k] for k in GENERATE]}),
                      headers={**headers, "content-type": "application/json"}, timeout=60)
        if r.status_code != 200:
            return r.status_code, None
        last = None
        with http.stream("GET", self.url + f"gradio_api/call/generate/{r.json()['event_id']}", timeout=120) as s:
            for line in s.iter_lines():
                if line.startswith("data:"):
                    last = json.loads(line[5:])
        return 200, last[0] if isinstance(last, list) and last else None


def attack(app: App, kind: int, until: float, got: Counter) -> None:
    longest = {"sl-prompt": LONG_PROMPT, "sl-method": "none",
               "sl-max-new": 1900, "sl-shape": "chain"}
    with httpx.Client() as http:
        n = 0
        while time.monotonic() < until:
            n += 1
            try:
                if kind == 0:  # the page's two halves, in a new session each time
                    session = f"hostile-{n}"
                    got[f"user {app.join(http, 'user', session, longest, HOSTILE).status_code}"] += 1
                    time.sleep(0.2)
                    got[f"bot {app.join(http, 'bot', session, longest, HOSTILE).status_code}"] += 1
                    got[f"replay {app.join(http, 'replay', 'hostile-1', {'sl-pace': '1 step / s'}, HOSTILE).status_code}"] += 1
                elif kind == 1:  # /generate at its longest, and the largest benchmark
                    status, _ = app.generate(http, HOSTILE, prompt=LONG_PROMPT, method="none", max_new_tokens=1900)
                    got[f"generate {status}"] += 1
                    bench = {"sl-bench-methods": ["none", DEFAULT_METHOD], "sl-bench-num-prompts": 80, "sl-bench-max-new": 512}
                    got[f"benchmark {app.join(http, 'run_benchmark', f'hostile-b{n}', bench, HOSTILE).status_code}"] += 1
                elif kind == 3:  # the direct routes: a generation outside the queue, the page's events outside it
                    body = {"data": app.data("generate", {}), "fn_index": app.deps["generate"]["id"]}
                    body["data"][:7] = [LONG_PROMPT, "none", "eager", 1, 0.0, 1.0, 1900]
                    got[f"direct generate {http.post(app.url + 'gradio_api/run/generate', json=body, headers=HOSTILE).status_code}"] += 1
                    for name, values in (("step_on", {}), ("step_back", {}), ("tree_sizes", {"sl-k": 10 ** 9}),
                                         ("plan_work", {})):
                        got[f"{name} {app.direct(http, name, 'hostile-1', values, HOSTILE).status_code}"] += 1
                else:  # what fills disks, memory and logs
                    r = http.post(app.url + "gradio_api/upload", headers=HOSTILE, files={"files": ("q.jsonl", b"x" * 900_000)})
                    got[f"upload {r.status_code}"] += 1
                    r = http.post(app.url + "gradio_api/queue/join", headers=HOSTILE, content=b"x" * (8 << 20))
                    got[f"8 MB body {r.status_code}"] += 1
                    body = {"data": ["x" * 500_000], "fn_index": app.deps["user"]["id"], "session_hash": f"hostile-a{n}"}
                    r = http.post(app.url + "gradio_api/queue/join", json=body, headers=HOSTILE)
                    got[f"wrong arity {r.status_code}"] += 1
                    status, last = app.generate(http, HOSTILE, max_new_tokens=float("nan"))
                    got[f"bad value {status}"] += 1
            except httpx.HTTPError as e:
                got[f"{type(e).__name__}"] += 1
            time.sleep(0.05)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7860/")
    p.add_argument("--seconds", type=float, default=120.0, help="how long the hostile client keeps at it")
    p.add_argument("--every", type=float, default=5.0, help="seconds between the visitor's replies")
    args = p.parse_args(argv)
    app = App(args.url)
    got: Counter = Counter()
    until = time.monotonic() + args.seconds
    threads = [threading.Thread(target=attack, args=(app, kind, until, got), daemon=True) for kind in range(4)]
    for t in threads:
        t.start()
    time.sleep(3.0)  # the hostile client holds the engine by now
    waits, texts = [], []
    with httpx.Client() as http:
        while time.monotonic() < until:
            start = time.monotonic()
            status, last = app.generate(http, VISITOR, max_new_tokens=24)
            waits.append(time.monotonic() - start)
            texts.append(bool(last and last.get("done")) if status == 200 else False)
            print(f"visitor reply {len(waits)}: {waits[-1]:.1f} s, {'answered' if texts[-1] else f'status {status}'}",
                  flush=True)
            time.sleep(args.every)
    for t in threads:
        t.join(timeout=120)
    print("\nhostile client, by request and status:")
    for what, n in sorted(got.items()):
        print(f"  {what}: {n}")
    print(f"\nvisitor: {sum(texts)} of {len(waits)} replies answered; end to end median {statistics.median(waits):.1f} s, "
          f"max {max(waits):.1f} s")


if __name__ == "__main__":
    main()
