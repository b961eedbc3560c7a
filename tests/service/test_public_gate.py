"""A public app against a hostile visitor who stays inside every limit (demo/service/public_gate.py,
demo/service/hosting.py): one client, many sessions, every event kind, over raw HTTP on 127.0.0.1.
Each test shows what one client may no longer do, and another visitor's reply still arriving.

No weights, no GPU: the predictable tiny default (every token "a"), with steps slowed where a test
needs a generation that lasts.
"""

from __future__ import annotations

import html
import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import demo.service.hosting as hosting_module
from demo.service.hosting import ENGINE_HOLD_S, SESSION_CAPACITY, Hosting
from demo.service.public_gate import (
    BUSY,
    CLIENT_FILES,
    CLIENT_PLAYBACKS,
    CLIENT_UPLOADS,
    MAX_BODY_BYTES,
    PLAYING,
    TOO_MANY_FILES,
)
from demo.service.server_log import BoundedLog
from demo.service.session import Session
from tests.service.http_app import PROMPT, chat_turn, client, direct, events, generate, join, post_generate, ui_event
from tests.tiny_chat import tiny_session

PAGE = {"sl-prompt": PROMPT, "sl-max-new": 8, "sl-shape": "chain", "sl-method": "eagle"}


@pytest.fixture
def held(monkeypatch):
    """Replies wait at their start until held.set(): a client's first generation stays running."""
    opened = threading.Event()
    original = Session.reply

    def gated(self, chat, request):
        assert opened.wait(60), "the gate was never opened"
        yield from original(self, chat, request)

    monkeypatch.setattr(Session, "reply", gated)
    yield opened
    opened.set()


STEP_S = 0.05  # the slow_steps fixture (conftest.py): seconds added to every engine step


def short_reply(http, url, n: int) -> dict:
    return generate(http, url, client(n), max_new_tokens=8)


# ---------------------------------------------------------------------- 1. one generation per client
def test_one_client_gets_one_reply_however_many_sessions_it_opens(public_app, held):
    """The user turn of 18 sessions, then the reply (`bot`) of each: one is accepted, the rest are
    refused with a sentence, so the queue never fills and another visitor is answered."""
    demo, url = public_app
    with httpx.Client() as http:
        for i in range(18):
            assert "error" not in ui_event(http, url, demo, "user", f"h1-{i}", client(11), PAGE)
        codes = [join(http, url, demo, "bot", f"h1-{i}", client(11), PAGE) for i in range(18)]
        assert [r.status_code for r in codes] == [200] + [429] * 17
        assert {r.json()["detail"] for r in codes[1:]} == {BUSY}
        other = post_generate(http, url, client(12), max_new_tokens=8)  # queued behind the one: never 503
        assert other.status_code == 200
        held.set()
        assert list(events(http, url, f"gradio_api/call/generate/{other.json()['event_id']}"))[-1][1][0]["text"] == "a" * 8


def test_a_preset_load_or_a_benchmark_counts_as_the_clients_generation(public_app, held):
    demo, url = public_app
    with httpx.Client() as http:
        assert "error" not in ui_event(http, url, demo, "user", "h2-a", client(13), PAGE)
        assert join(http, url, demo, "bot", "h2-a", client(13), PAGE).status_code == 200
        for name in ("choose_preset", "run_benchmark", "user"):
            refused = join(http, url, demo, name, "h2-b", client(13), PAGE)
            assert (refused.status_code, refused.json()["detail"]) == (429, BUSY), name
        held.set()


# ---------------------------------------------------------------------- 2. playbacks
def test_replays_of_one_client_are_bounded_and_never_fill_the_queue(public_app):
    demo, url = public_app
    with httpx.Client() as http:
        chat_turn(http, url, demo, "h3", client(14))
        slow = {"sl-pace": "1 step / s"}
        codes = [join(http, url, demo, "replay", "h3", client(14), slow).status_code for _ in range(24)]
        assert codes.count(200) <= CLIENT_PLAYBACKS and codes.count(429) == 24 - codes.count(200)
        refused = join(http, url, demo, "race", "h3", client(14), slow)
        assert refused.status_code == 429 and refused.json()["detail"] == PLAYING
        assert short_reply(http, url, 15)["text"] == "a" * 8  # another visitor: answered, never "queue is full"
        ui_event(http, url, demo, "stop", "h3", client(14), {})  # Stop ends the client's replays


# ---------------------------------------------------------------------- 3. time on the engine
def test_a_public_request_holds_the_engine_at_most_its_time_limit(public_app, slow_steps, monkeypatch):
    monkeypatch.setattr(hosting_module, "ENGINE_HOLD_S", 1.0)
    demo, url = public_app
    with httpx.Client() as http:
        start = time.monotonic()
        long = generate(http, url, client(16), max_new_tokens=400)  # 100 steps of 0.05 s: 5 s untimed
        assert time.monotonic() - start < 3.5
        assert long["finish_reason"] == "time" and "time limit (1 s of engine time a request)" in long["status"]
        assert 0 < len(long["text"]) < 400 and set(long["text"]) == {"a"}  # what was made stays, exact
        # the page, with the comparison: the reply is cut, and the comparison does not start past the limit
        assert "error" not in ui_event(http, url, demo, "user", "h4", client(16), {**PAGE, "sl-max-new": 400})
        reply = ui_event(http, url, demo, "bot", "h4", client(16), {**PAGE, "sl-max-new": 400, "sl-compare": True})
        assert "time limit" in reply["sl-status"] and "no comparison" in reply["sl-status"]
        bench = ui_event(http, url, demo, "run_benchmark", "h4", client(16),
                         {"sl-bench-methods": ["none", "eagle"], "sl-bench-ks": [2], "sl-bench-num-prompts": 4,
                          "sl-bench-max-new": 64})
        assert "stopped at this app's time limit (1 s a run)" in html.unescape(bench["sl-bench-status"])


def test_the_time_limit_stops_the_engine_at_the_step_that_passes_it_and_only_in_public_mode():
    session = tiny_session(predictable=True)
    engine = session.engine("eagle", "eager")
    from demo.config import GenerationConfig

    untimed = list(engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=40)))
    timed = list(engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=40, max_time_s=0.0)))
    assert untimed[-1].finish_reason == "length" and sum(len(e.token_ids) for e in untimed) == 40
    assert [e.finish_reason for e in timed] == ["time"] and timed[0].finished  # the prefill already passed it
    assert Hosting(public=True).time_limit() == ENGINE_HOLD_S and Hosting(public=False).time_limit() is None


# ---------------------------------------------------------------------- 4. bad values, answered in a sentence
BAD_GENERATE = [dict(num_spec_tokens="3"), dict(num_spec_tokens=float("nan")), dict(num_spec_tokens=float("inf")),
                dict(max_new_tokens=float("nan")), dict(max_new_tokens=float("inf")), dict(max_new_tokens=[8]),
                dict(tree_topk="2", num_draft_tokens="4"), dict(tree_topk=2, num_draft_tokens="x"),
                dict(temperature=float("-inf")), dict(seed=float("inf"))]


@pytest.mark.parametrize("bad", BAD_GENERATE, ids=[json.dumps(b) for b in BAD_GENERATE])
def test_bad_generate_values_are_refused_in_a_sentence_without_a_traceback(public_app, bad, capfd):
    demo, url = public_app
    with httpx.Client() as http:
        refused = generate(http, url, client(17), **bad)
        assert isinstance(refused.get("error"), str) and refused["error"].endswith("."), refused
        assert short_reply(http, url, 18)["text"] == "a" * 8
    assert "Traceback" not in capfd.readouterr().err


def test_bad_page_values_are_refused_in_a_sentence_without_a_traceback(public_app, capfd):
    demo, url = public_app
    with httpx.Client() as http:
        for values in ({"sl-k": None}, {"sl-k": float("inf")}, {"sl-max-new": float("nan")},
                       {"sl-shape": "tree", "sl-tree-topk": "2"}, {"sl-max-new": [8]}):
            refused = ui_event(http, url, demo, "user", "h5", client(19), {**PAGE, **values})
            assert isinstance(refused.get("error"), str) and refused["error"], values
        chat_turn(http, url, demo, "h5", client(19))
        for step in (2.5, float("nan"), "x", None, 10**9):  # the tree slider's step: shown, or refused in a sentence
            shown = ui_event(http, url, demo, "show_tree", "h5", client(19), {"sl-tree-step": step})
            assert "error" not in shown or shown["error"].endswith("."), (step, shown)
        bench = {"sl-bench-methods": ["eagle"], "sl-bench-ks": [2], "sl-bench-num-prompts": 1, "sl-bench-max-new": 4}
        for values in ({"sl-bench-ks": [None]}, {"sl-bench-num-prompts": "x"}, {"sl-bench-max-new": float("inf")}):
            refused = ui_event(http, url, demo, "run_benchmark", "h5", client(19), {**bench, **values})
            assert isinstance(refused.get("error"), str) and refused["error"], values
        deep = http.post(url + "gradio_api/upload", headers=client(19), timeout=30,
                         files={"files": ("deep.jsonl", b"[" * 300_000 + b"\n")}).json()[0]
        described = ui_event(http, url, demo, "describe_prompts", "h5", client(19),
                             {**bench, "sl-bench-file": {"path": deep, "meta": {"_type": "gradio.FileData"}}})
        assert "not JSON" in described["sl-bench-prompts"]
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------------- 5. request bodies
def test_a_body_past_the_bound_is_refused_before_it_is_read(public_app):
    demo, url = public_app
    big = b'{"data": ["' + b"a" * (MAX_BODY_BYTES + 1) + b'"], "fn_index": 1, "session_hash": "h6"}'
    with httpx.Client() as http:
        declared = http.post(url + "gradio_api/queue/join", content=big, headers={**client(20), "content-type":
                                                                                  "application/json"}, timeout=30)
        assert declared.status_code == 413 and "larger than this public app takes" in declared.json()["detail"]

        def chunks():  # no Content-Length: refused once the bytes read pass the bound
            for i in range(0, len(big), 1 << 16):
                yield big[i:i + (1 << 16)]

        try:
            streamed = http.post(url + "gradio_api/queue/join", content=chunks(), headers=client(20), timeout=30)
            assert streamed.status_code == 413
        except httpx.TransportError:
            pass  # the server closed the connection on the refused body: also refused
        assert short_reply(http, url, 21)["text"] == "a" * 8


# ---------------------------------------------------------------------- 6. files written
def test_one_client_may_write_only_so_many_files_in_a_window(public_app):
    demo, url = public_app
    with httpx.Client() as http:
        uploads = [http.post(url + "gradio_api/upload", headers=client(22), timeout=30,
                             files={"files": ("q.jsonl", b'{"turns": ["hi"]}\n')}).status_code
                   for _ in range(CLIENT_UPLOADS + 1)]
        assert uploads == [200] * CLIENT_UPLOADS + [429]
        chat_turn(http, url, demo, "h7", client(23))
        traces = [ui_event(http, url, demo, "trace_download", "h7", client(23), {}) for _ in range(CLIENT_FILES + 1)]
        assert all("error" not in t for t in traces[:-1])
        assert traces[-1] == {"error": TOO_MANY_FILES, "status": 429}
        assert short_reply(http, url, 24)["text"] == "a" * 8  # another client writes as ever
        other = http.post(url + "gradio_api/upload", headers=client(24), timeout=30,
                          files={"files": ("q.jsonl", b'{"turns": ["hi"]}\n')})
        assert other.status_code == 200


# ---------------------------------------------------------------------- 7. the log
def test_a_wrong_arity_call_with_a_large_argument_is_refused_and_writes_nothing_to_the_log(public_app, capfd):
    demo, url = public_app
    user = next(f for f in demo.fns.values() if f.name == "user")
    with httpx.Client() as http:
        r = http.post(url + "gradio_api/queue/join", headers=client(25), timeout=30,
                      json={"data": ["x" * 900_000], "fn_index": user._id, "session_hash": "h8"})
        assert r.status_code == 422 and f"takes a list of {len(user.inputs)} input values" in r.json()["detail"]
        assert short_reply(http, url, 26)["text"] == "a" * 8
    written = capfd.readouterr()
    assert len(written.out) + len(written.err) < 10_000


def test_the_bounded_log_cuts_long_lines_and_writes_at_most_its_share_a_minute():
    now = [0.0]
    sink = io.StringIO()
    log = BoundedLog(sink, line_chars=100, minute_chars=1_000, clock=lambda: now[0])
    log.write("x" * 5_000 + "\n")
    assert sink.getvalue() == "x" * 100 + "… (4,901 characters cut)\n"
    for _ in range(50):
        log.write("y" * 60 + "\n")
    assert len(sink.getvalue()) <= 1_000  # the minute's share, then nothing
    now[0] = 61.0
    log.write("z\n")
    assert "characters dropped in the last minute" in sink.getvalue() and sink.getvalue().endswith("z\n")


# ---------------------------------------------------------------------- 8. sessions in memory
def test_a_session_is_dropped_when_its_page_closes_and_the_app_keeps_a_bounded_number(public_app):
    demo, url = public_app
    assert demo.state_session_capacity == SESSION_CAPACITY
    holder = demo.state_holder
    with httpx.Client() as http:
        names = [f"h9-{i}" for i in range(12)]
        for name in names:
            chat_turn(http, url, demo, name, client(27))
        assert all(name in holder.session_data for name in names)
        for name in names:  # each page's heartbeat opens, then the page closes
            with http.stream("GET", url + f"gradio_api/heartbeat/{name}", timeout=30) as beat:
                next(beat.iter_lines())
        deadline = time.monotonic() + 20
        while any(name in holder.session_data for name in names) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(name in holder.session_data for name in names)
        assert short_reply(http, url, 28)["text"] == "a" * 8


# ---------------------------------------------------------------------- 9. what a trace tells
def test_a_trace_names_the_drafter_without_the_servers_paths():
    from demo.service.chat import ChatState
    from demo.service.model_cache import REPO
    from demo.service.request import Request
    from demo.ui.trace_download import trace_file

    session = tiny_session(predictable=True)
    session.models.drafter_labels.update(eagle="/srv/private/drafters/eagle-tiny",
                                         eagle3=str(REPO / "assets" / "drafters" / "eagle3-tiny"))
    request = Request.of(PROMPT, method="eagle", max_new_tokens=4)
    chat = ChatState()
    for update in session.reply(session.add_user_turn(chat, request), request):
        chat = update.chat
    with open(trace_file(session, chat), encoding="utf-8") as f:
        environment = json.load(f)["environment"]
    assert environment["drafter"] == "eagle-tiny" and "/srv" not in json.dumps(environment)
    assert session.describe()["drafters"]["eagle3"] == "assets/drafters/eagle3-tiny"  # the checkout's: relative


# ---------------------------------------------------------------------- 10. all of it at once
def test_another_visitor_is_answered_within_20_s_while_one_client_does_its_worst(public_app, slow_steps):
    """One client, at once: the longest generations it may ask for in 18 sessions (each held the
    whole ENGINE_HOLD_S by slowed steps), slow replays, a benchmark, the direct routes (a generation
    and the page's events outside the queue), uploads, oversized bodies and bad values; another
    visitor's page reply and 24-token /generate reply both arrive within 20 s."""
    demo, url = public_app
    hostile = client(30)
    LONGEST = {**PAGE, "sl-method": "none", "sl-max-new": 400}  # noqa: N806
    stop = threading.Event()

    def worst(kind: int):
        with httpx.Client() as http:
            while not stop.is_set():
                if kind == 0:
                    for i in range(18):  # target only, 400 tokens: 400 slowed steps, cut at ENGINE_HOLD_S
                        ui_event(http, url, demo, "user", f"h11-{i}", hostile, LONGEST)
                        join(http, url, demo, "bot", f"h11-{i}", hostile, LONGEST)
                elif kind == 1:
                    post_generate(http, url, hostile, method="none", max_new_tokens=400)
                    join(http, url, demo, "replay", "h11-0", hostile, {"sl-pace": "1 step / s"})
                    join(http, url, demo, "run_benchmark", "h11-b", hostile,
                         {"sl-bench-methods": ["none"], "sl-bench-num-prompts": 8, "sl-bench-max-new": 512})
                elif kind == 2:  # the direct routes: a generation (refused), and the page's events outside the queue
                    http.post(url + "gradio_api/run/generate", headers=hostile, timeout=60,
                              json={"data": ["x", "none", "eager", 1, 0.0, 1.0, 400, 0, 0, 0, "pointmass", 0]})
                    for name in ("step_on", "step_back", "tree_sizes", "plan_work", "setting_checked"):
                        direct(http, url, demo, name, "h11-0", hostile, {})
                else:
                    http.post(url + "gradio_api/upload", headers=hostile, files={"files": ("q.jsonl", b"x" * 900_000)})
                    http.post(url + "gradio_api/queue/join", headers=hostile, content=b"x" * (MAX_BODY_BYTES + 10))
                    post_generate(http, url, hostile, max_new_tokens=float("nan"))
                time.sleep(0.05)

    with ThreadPoolExecutor(4) as pool:
        attacks = [pool.submit(worst, kind) for kind in range(4)]
        time.sleep(2.0)  # the client holds the engine by now
        try:
            with httpx.Client() as http:
                start = time.monotonic()
                page = chat_turn(http, url, demo, "visitor", client(31))
                assert "a" in page and time.monotonic() - start < 20
                start = time.monotonic()
                assert generate(http, url, client(31), max_new_tokens=24)["text"] == "a" * 24
                assert time.monotonic() - start < 20
        finally:
            stop.set()
            for attack in attacks:
                attack.result()
