"""Safe to host publicly: a public app (demo/service/hosting.py) on tiny models, driven through Gradio's own
HTTP routes (/gradio_api/queue/join + /queue/data as the page does, /call/generate, /upload)
against an app on 127.0.0.1. Clients are told apart by X-Forwarded-For, which uvicorn takes from a
local peer as the client's address. Every test also shows another visitor's output unchanged.

No weights, no downloads: "tiny-b" is a preset added for these tests, loaded as another tiny model.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from demo.models.presets import PRESETS, Preset
from demo.service.hosting import CPU_WORK_BUDGET, MAX_FILE_SIZE, Hosting
from demo.service.public_gate import BUSY
from demo.service.model_cache import ModelCache
from demo.service.request import Request, RequestError
from demo.service.session import Session
from demo.views import build_demo
from tests.service.http_app import PROMPT, chat_turn, client, events, generate, post_generate, serve, ui_event
from tests.tiny_chat import tiny_session

OTHER = "tiny-b"  # a second preset, available on a CPU


@pytest.fixture(scope="module")
def public():
    """(demo, url, loads): a public app on a predictable tiny default ("tiny": every token "a"), with
    the preset OTHER loading a random tiny model; `loads` lists the names the cache loaded."""
    mp = pytest.MonkeyPatch()
    mp.setitem(PRESETS, OTHER, Preset(OTHER, target=OTHER, eagle=None, eagle3=None))
    default = tiny_session(predictable=True)
    loads = []

    def load(name, progress=None):
        loads.append(name)
        return tiny_session(name=name).models

    cache = ModelCache(default.models, load, budget_bytes=2**30)
    demo = build_demo(default, Hosting(public=True), cache)
    url = serve(demo, Hosting(public=True))
    yield demo, url, loads
    demo.close()
    mp.undo()


# ---------------------------------------------------------------------- 1. who can change the models
def test_public_app_registers_no_event_that_loads_a_path_or_a_hub_id():
    session = tiny_session(predictable=True)
    local = {fn.name for fn in build_demo(session, Hosting(public=False)).fns.values()}
    public = {fn.name for fn in build_demo(session, Hosting(public=True)).fns.values()}
    assert "load_custom" in local  # local mode: your own models, as before
    assert public == local - {"load_custom"} | {"forget_session"}  # a public app drops a closed page's session


def test_public_routes_expose_generate_and_the_pages_own_events_only(public):
    from gradio_client import Client

    demo, url, loads = public

    def refused(path: str, body: dict) -> bool:
        try:
            return httpx.post(url + path, json=body, timeout=30).status_code != 200
        except httpx.TransportError:
            return True

    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    assert list(api["named_endpoints"]) == ["/generate"] and not api["unnamed_endpoints"]
    # not registered: no route reaches a loader of paths (Gradio answers 500, or drops the connection)
    assert refused("gradio_api/call/load_custom", {"data": ["/etc", "", "", None]})
    assert refused("gradio_api/queue/join", {"data": ["/etc"], "fn_index": max(demo.fns) + 1, "session_hash": "p"})
    with httpx.Client() as http:
        config = http.get(url + "config", timeout=30).json()
        names = {demo.fns[d["id"]].name for d in config["dependencies"]}
        assert names == {fn.name for fn in demo.fns.values()} and "load_custom" not in names
        assert generate(http, url, client(1))["text"] == "a" * 8  # another visitor's output: as ever
    assert not loads


def test_a_visitors_preset_changes_only_their_own_requests(public):
    demo, url, loads = public
    with httpx.Client() as http:
        chose = ui_event(http, url, demo, "choose_preset", "visitor-a", client(1), {"sl-preset": OTHER})
        assert "error" not in chose and f"Loaded {OTHER}" in chose["sl-status"]
        assert f"{OTHER} · EAGLE" in chat_turn(http, url, demo, "visitor-a", client(1))  # A's requests: OTHER
        b = chat_turn(http, url, demo, "visitor-b", client(2))  # B never chose: the default, its text unchanged
        assert "tiny · EAGLE" in b and OTHER not in b and 'title="step' in b
        assert generate(http, url, client(3))["text"] == "a" * 8  # /generate: the default
    assert loads == [OTHER]  # loaded once, then shared


def test_presets_that_do_not_fit_are_listed_unavailable_with_the_reason_and_refused(public):
    demo, url, loads = public
    preset = next(b for b in demo.blocks.values() if b.elem_id == "sl-preset")
    labels = dict((value, label) for label, value in preset.choices)
    assert labels["Qwen3-8B"] == "Qwen3-8B (unavailable: needs a GPU with 20 GB)"  # this test runs on a CPU
    assert labels[OTHER] == OTHER
    with httpx.Client() as http:
        refused = ui_event(http, url, demo, "choose_preset", "visitor-c", client(1), {"sl-preset": "Qwen3-8B"})
        assert "unavailable here: needs a GPU" in refused["sl-status"]
        assert "tiny · EAGLE" in chat_turn(http, url, demo, "visitor-c", client(1))  # still on the default
    assert "Qwen3-8B" not in loads


# ---------------------------------------------------------------------- 4. queue, clients, work, departures
@pytest.fixture
def gate(monkeypatch):
    """Generations wait at their start until gate.set(): a first job stays running for as long as
    a test needs."""
    opened = threading.Event()
    original = Session.generate

    def gated(self, request):
        assert opened.wait(30), "the gate was never opened"
        yield from original(self, request)

    monkeypatch.setattr(Session, "generate", gated)
    yield opened
    opened.set()


def test_a_client_holds_one_generation_and_a_second_is_refused_with_a_sentence(public, gate):
    demo, url, _ = public
    with httpx.Client() as http:
        first = post_generate(http, url, client(1), max_new_tokens=8)
        assert first.status_code == 200
        second = post_generate(http, url, client(1))  # while the first is running: refused, with why
        assert second.status_code == 429 and second.json()["detail"] == BUSY
        page = ui_event(http, url, demo, "user", "visitor-d", client(1), {"sl-prompt": PROMPT})
        assert page["status"] == 429 and page["error"] == BUSY  # the page's Generate too
        other = post_generate(http, url, client(2), max_new_tokens=8)  # another client: queued as usual
        assert other.status_code == 200
        gate.set()
        results = [list(events(http, url, f"gradio_api/call/generate/{r.json()['event_id']}"))[-1]
                   for r in (first, other)]
        assert [(kind, data[0]["text"]) for kind, data in results] == [("complete", "a" * 8)] * 2
        assert generate(http, url, client(1))["text"] == "a" * 8  # its first ended: it may start another


def test_public_cpu_requests_past_the_work_budget_are_refused_with_a_sentence(public):
    over = Request.of(PROMPT, method="eagle", num_spec_tokens=3, max_new_tokens=CPU_WORK_BUDGET // 4 + 1)
    cpu = tiny_session().device
    with pytest.raises(RequestError, match="allows 4,096 per request"):
        Hosting(public=True).check_work(over, cpu)
    Hosting(public=False).check_work(over, cpu)  # local mode: no budget
    Hosting(public=True).check_work(Request.of(PROMPT, method="eagle", num_spec_tokens=3,
                                               max_new_tokens=CPU_WORK_BUDGET // 4), cpu)  # the budget itself
    within = dict(method="eagle", num_spec_tokens=3, max_new_tokens=820)  # 820 x 4 verified per step: 3,280
    Hosting(public=True).check_work(Request.of(PROMPT, **within), cpu)
    with pytest.raises(RequestError, match="verify up to 4,100 tokens"):  # the comparison verifies one more per step
        Hosting(public=True).check_work(Request.of(PROMPT, compare=True, **within), cpu)
    demo, url, _ = public
    with httpx.Client() as http:
        refused = generate(http, url, client(1), max_new_tokens=2048)
        assert "this public CPU app allows 4,096 per request" in refused["error"]
        assert generate(http, url, client(2))["text"] == "a" * 8


def test_a_generation_stops_at_the_next_step_once_its_client_goes(public, monkeypatch):
    """Gradio marks a job dead when its event stream closes and asks its generator for no more steps."""
    steps = []
    original = Session.reply

    def counted(self, chat, request):
        for update in original(self, chat, request):
            steps.append(time.monotonic())
            time.sleep(0.02)  # a step of a real model: the client leaves mid-generation on any machine
            yield update

    monkeypatch.setattr(Session, "reply", counted)
    demo, url, _ = public
    with httpx.Client() as http:
        r = post_generate(http, url, client(1), max_new_tokens=400)
        stream = events(http, url, f"gradio_api/call/generate/{r.json()['event_id']}")
        for _ in range(3):
            next(stream)  # three steps arrive, then the client goes
        stream.close()
        left = time.monotonic()
        time.sleep(2.0)
        after = [t for t in steps if t > left]
        assert len(after) <= 2, f"{len(after)} steps after the client left"  # the step in flight, at most one more
        assert len(steps) < 20  # far from the 100 steps of 400 tokens
        assert generate(http, url, client(1))["text"] == "a" * 8  # it freed its client, and the engine


def test_a_normal_request_completes_within_20_s_under_a_flood_of_abandoned_generations(public, gate):
    """8 clients post 10 /call/generate each and never read them (80 posts in at most 10 s, while the
    first generation holds the engine); each client keeps one, so the queue never fills, and a
    ninth client's request is answered after those 8."""
    demo, url, _ = public
    deadline = time.monotonic() + 10

    def flood(n: int) -> list[int]:
        codes = []
        with httpx.Client() as http:
            for _ in range(10):
                if time.monotonic() > deadline:
                    break
                codes.append(post_generate(http, url, client(100 + n), max_new_tokens=16).status_code)
        return codes

    with ThreadPoolExecutor(8) as pool:
        codes = sum(pool.map(flood, range(8)), [])
    assert codes.count(200) == 8 and codes.count(429) == len(codes) - 8  # one per client; never "queue full"
    gate.set()
    start = time.monotonic()
    with httpx.Client() as http:
        answer = generate(http, url, client(99))
    assert answer["text"] == "a" * 8 and answer["done"]  # another visitor's output: unchanged
    assert time.monotonic() - start < 20


# ---------------------------------------------------------------------- 8. uploads
def test_uploads_past_max_file_size_are_refused(public):
    demo, url, _ = public
    assert MAX_FILE_SIZE == "1mb"
    with httpx.Client() as http:
        big = http.post(url + "gradio_api/upload", files={"files": ("big.bin", b"\0" * (2 * 2**20))}, timeout=60)
        assert big.status_code == 413
        assert generate(http, url, client(1))["text"] == "a" * 8


def test_the_app_is_public_on_a_space_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not Hosting.choose(None).public and Hosting.choose(True).public
    monkeypatch.setenv("SPACE_ID", "user/speclens")
    assert Hosting.choose(None).public and not Hosting.choose(False).public
