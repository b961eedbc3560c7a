"""A served app measured from outside, through /generate as any client calls it.

    python app.py &                                   # on the machine to measure
    python -m demo.bench.served --url http://127.0.0.1:7860/ --max-new-tokens 256

For each mode the app offers and each draft shape (target only, a chain of 3, the device's default
draft, EAGLE-1's chain, and a sampled chain at T = 0.8): whether /generate answered without an
error, its tokens, its tokens/s of engine time and its tokens per target call; then the app's own
defaults (no setting given) over a few prompts, and the bytes one reply of --long-tokens streams,
counted on the wire (the raw server-sent events of /gradio_api/call/generate). Needs gradio_client
and httpx (the app's own requirements).

With --start-app the tool starts `python app.py` itself on a free port (and stops it after); with
--switch-interval S as well, the app's Python hands its GIL between threads every S seconds
(sys.setswitchinterval, set by a sitecustomize this tool puts first on the app's path; Python's own
is 0.005): whether the engine thread waiting for the GIL while the server's threads render and send
each step is what slows the served path.

With --engine, on the machine the app runs on (with the app idle meanwhile), this process then loads
the app's default models itself and runs the engine's own loop (Engine.generate, as the bench does)
over the same prompts in the same mode and draft shape, and prints the served tokens/s beside it:
the share of the engine's speed a visitor gets (issue: at least 90 %).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from demo.methods import DEFAULT_METHOD, METHOD_LABELS, METHODS

PROMPTS = ("Explain how a bicycle gear works.", "Write a short poem about the sea.",
           "Give three tips for learning a new language.", "What is the difference between weather and climate?")
# replies long enough to fill --long-tokens; the first that does is the one counted
LONG_PROMPTS = ("Write a long, detailed story about a lighthouse keeper and a storm, with many characters.",
                "Count from 1 to 400, writing each number as a word, separated by commas.",
                "Write a detailed, multi-chapter history of the bicycle, from its invention to today.")


@dataclass
class ServedRow:
    name: str
    settings: dict
    ok: bool
    tokens: int = 0
    tokens_per_s: float = 0.0
    tokens_per_call: float = 0.0
    error: str = ""


def shapes(device_k: int, device_tree: tuple[int, int]) -> list[tuple[str, dict]]:
    """(name, /generate settings) of every shape measured in each mode."""
    topk, verified = device_tree
    main, label = DEFAULT_METHOD, METHOD_LABELS[DEFAULT_METHOD]
    return [("target only", dict(method="none")),
            *[(f"{METHOD_LABELS[m]} chain of 3", dict(method=m, num_spec_tokens=3, tree_topk=0, num_draft_tokens=0))
              for m in METHODS if m != "none"],
            (f"{label} tree {device_k} x {topk}, {verified}",
             dict(method=main, num_spec_tokens=device_k, tree_topk=topk, num_draft_tokens=verified))
            if device_k is not None else  # /generate's shape left out: the device's default draft
            (f"{label}, the device's default draft", dict(method=main)),
            (f"{label} chain of 3, T = 0.8", dict(method=main, num_spec_tokens=3, tree_topk=0, temperature=0.8))]


def call(client, prompt: str, max_new_tokens: int, **settings) -> ServedRow:
    """One /generate call; its last value's numbers, or the error it answered with."""
    try:
        final = client.predict(prompt=prompt, max_new_tokens=max_new_tokens, api_name="/generate", **settings)
    except Exception as e:  # the point is to see every error the app answers with
        return ServedRow("", settings, False, error=" ".join(str(e).split())[:200])
    s = final["stats"]
    return ServedRow("", settings, bool(final["done"]), s.get("num_generated", 0), s.get("tokens_per_s", 0.0),
                     s.get("tokens_per_call", 0.0))


def streamed_bytes(url: str, params: dict, prompt: str, max_new_tokens: int) -> tuple[int, int, int]:
    """(bytes on the wire, values streamed, tokens) of one /generate reply with the app's defaults
    (`params`: name -> default, in the endpoint's order) but for the prompt and max new tokens."""
    import httpx

    data = [{**params, "prompt": prompt, "max_new_tokens": max_new_tokens}[name] for name in params]
    with httpx.Client(timeout=600) as http:
        r = http.post(url + "gradio_api/call/generate", json={"data": data})
        r.raise_for_status()
        total, values, last = 0, 0, None
        with http.stream("GET", url + f"gradio_api/call/generate/{r.json()['event_id']}") as stream:
            for line in stream.iter_lines():
                total += len(line.encode()) + 1
                if line.startswith("data:") and line[5:].strip() not in ("", "null"):
                    values += 1
                    last = line[5:]
    data = json.loads(last) if last else None
    tokens = data[0]["stats"].get("num_generated", 0) if isinstance(data, list) and data else 0
    return total, values, tokens


def probe(url: str, max_new_tokens: int = 256, long_tokens: int = 512, modes: tuple[str, ...] | None = None) -> str:
    """Every mode x shape, the defaults over PROMPTS and one long reply's bytes, as a markdown report."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    params = {p["parameter_name"]: p.get("parameter_default")
              for p in client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]}
    modes = modes or (("eager", "cudagraph") if params.get("mode") == "cudagraph" else ("eager",))
    lines = [f"defaults: mode {params['mode']}, k {params['num_spec_tokens']}, tree top-k {params['tree_topk']}, "
             f"{params['num_draft_tokens']} verified", "",
             "| mode | shape | answered | tokens | tokens/s | tokens per target call | error |", "|---|---|---|---|---|---|---|"]
    for mode in modes:
        for name, settings in shapes(params["num_spec_tokens"], (params["tree_topk"] or 8, params["num_draft_tokens"]
                                                                 or 64)):
            row = call(client, PROMPTS[0], max_new_tokens, mode=mode, **settings)
            lines.append(f"| {mode} | {name} | {'yes' if row.ok else 'no'} | {row.tokens} | {row.tokens_per_s:.1f} | "
                         f"{row.tokens_per_call:.2f} | {row.error} |")
            print(lines[-1], file=sys.stderr, flush=True)
    call(client, PROMPTS[0], 16)  # the defaults' shape captured before it is timed
    rows = [call(client, prompt, max_new_tokens) for prompt in PROMPTS]
    tokens, seconds = sum(r.tokens for r in rows), sum(r.tokens / r.tokens_per_s for r in rows if r.tokens_per_s)
    lines += ["", f"the defaults over {len(rows)} prompts, {max_new_tokens} new tokens at most: "
              f"{tokens / seconds if seconds else 0:.1f} tokens/s of engine time, "
              f"{sum(r.ok for r in rows)}/{len(rows)} answered"]
    for prompt in LONG_PROMPTS:
        start = time.perf_counter()
        nbytes, values, long = streamed_bytes(url, params, prompt, long_tokens)
        if long >= long_tokens:
            break
    lines.append(f"one reply with the defaults ({long} tokens, max new tokens {long_tokens}): {nbytes:,} bytes in "
                 f"{values} values on the wire, {time.perf_counter() - start:.1f} s")
    return "\n".join(lines)


def engine_loop(prompts: tuple[str, ...], max_new_tokens: int, mode: str) -> tuple[float, str]:
    """(tokens/s of engine time, the draft) of the app's default models (loaded here) over `prompts`
    with the device's default draft at T = 0 (what /generate runs with its shape left out), each
    through Engine.generate alone, the shape captured before it is timed."""
    from demo.config import GenerationConfig
    from demo.methods import DEFAULT_METHOD
    from demo.service.model_cache import preset_choice
    from demo.service.request import Request
    from demo.service.session import Session

    session = Session.load(preset_choice(None))
    engine = session.engine(DEFAULT_METHOD, mode)
    k, tree = session.default_draft()
    tokens = seconds = 0.0
    for i, prompt in enumerate((prompts[0], *prompts)):  # the first: the capture and warm-up, not counted
        ids = session.check(Request.of(prompt, method=DEFAULT_METHOD, mode=mode))
        gen = GenerationConfig(max_new_tokens=max_new_tokens if i else 16, num_spec_tokens=k, tree=tree)
        last = list(engine.generate(ids, gen))[-1]
        if i:
            tokens, seconds = tokens + last.stats.num_generated, seconds + last.stats.elapsed_s
    return (tokens / seconds if seconds else 0.0), f"k {k}, {tree}"


def start_app(switch_interval: float | None, timeout: float = 600.0):
    """`python app.py` on a free port (see the module's docstring); returns (process, url, log path)."""
    import os
    import socket
    import subprocess
    import tempfile
    import urllib.request
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    if switch_interval is not None:
        site = Path(tempfile.mkdtemp(prefix="served-site-"))
        (site / "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({switch_interval!r})\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    root = Path(__file__).resolve().parents[3]
    log = Path(tempfile.mkstemp(prefix="served-app-", suffix=".log")[1])
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc, url, log
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"app.py did not start: {log.read_text()[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.bench.served", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7860/")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--long-tokens", type=int, default=512, help="max new tokens of the reply whose bytes are counted")
    p.add_argument("--engine", action="store_true", help="then the engine's own loop over the same prompts and shape")
    p.add_argument("--start-app", action="store_true", help="start python app.py on a free port (instead of --url)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="with --start-app: the app's sys.setswitchinterval (Python's: 0.005)")
    a = p.parse_args(argv)
    app = None
    if a.start_app:
        app, a.url, log = start_app(a.switch_interval)
        print(f"started app.py at {a.url} (switch interval {a.switch_interval or 'default'}; log {log})",
              file=sys.stderr)
    try:
        return report(a)
    finally:
        if app is not None:
            app.terminate()
            app.wait(30)


def report(a: argparse.Namespace) -> int:
    url = a.url.rstrip("/") + "/"
    print(probe(url, a.max_new_tokens, a.long_tokens))
    if a.engine:
        from gradio_client import Client

        client = Client(url, verbose=False)
        mode = next(q.get("parameter_default") for q in client.view_api(return_format="dict", print_info=False)
                    ["named_endpoints"]["/generate"]["parameters"] if q["parameter_name"] == "mode")
        rows = [call(client, prompt, a.max_new_tokens) for prompt in PROMPTS]  # the defaults, served, again
        served = sum(r.tokens for r in rows) / sum(r.tokens / r.tokens_per_s for r in rows if r.tokens_per_s)
        loop, draft = engine_loop(PROMPTS, a.max_new_tokens, mode)
        print(f"\nthe defaults ({mode}, {draft}) over {len(PROMPTS)} prompts, {a.max_new_tokens} new tokens at most: "
              f"served {served:.1f} tokens/s of engine time, the engine's own loop {loop:.1f}: "
              f"{served / loop if loop else 0:.0%} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
