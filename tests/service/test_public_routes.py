"""Every route into the app, as an anonymous visitor would take it over raw HTTP on 127.0.0.1: the
queue (/queue/join, /call/<api_name>, /call/v2/<api_name>) and Gradio's direct routes (/run/<api_name>,
/api/<api_name>, /run/predict by fn_index). Whatever the route, two generations never share the
engine (their texts are each what the same request gives alone); a public app (with SYSTEM=spaces or
without) answers its events through its queue only, parses and counts every event by its role,
refuses in a sentence and writes no traceback for a visitor's bad input.

No weights, no GPU: a tiny random chat model (each prompt its own text), steps slowed where a test
needs generations that last.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from demo.service.hosting import Hosting
from demo.service.public_gate import DIRECT_CLOSED, TOO_FAST
from demo.views import build_demo
from tests.service.http_app import chat_turn, client, direct, events, generate, serve, ui_event
from tests.tiny_chat import tiny_session

STEP_S = 0.02  # the slow_steps fixture (conftest.py): seconds added to every engine step
VICTIM, ATTACKER = "Write a short story about a cat who learns to swim.", "Tell me about dogs."
PAGE = {"sl-max-new": 8, "sl-shape": "chain", "sl-method": "eagle"}


def app(public: bool):
    """(demo, url) of an app on a tiny random model, launched as app.py launches it."""
    hosting = Hosting(public=public)
    demo = build_demo(tiny_session(), hosting)
    return demo, serve(demo, hosting)


@pytest.fixture(scope="module", params=["local", "public", "public on a Space"])
def served(request):
    """(demo, url, public) for a local app, a public one, and a public one as on a Space (SYSTEM=spaces,
    where Gradio itself closes its direct routes)."""
    mp = pytest.MonkeyPatch()
    if request.param == "public on a Space":
        mp.setenv("SYSTEM", "spaces")
    public = request.param != "local"
    demo, url = app(public)
    yield demo, url, public
    demo.close()
    mp.undo()


def generate_data(prompt: str, max_new_tokens: int = 24) -> list:
    """/generate's values in order: the prompt, EAGLE, eager, a chain of 1, greedy."""
    return [prompt, "eagle", "eager", 1, 0.0, 1.0, max_new_tokens, 0, 0, 0, "pointmass", 0]


# ---------------------------------------------------------------------- 1. no two generations on the engine
def test_no_route_runs_a_generation_beside_a_queued_one(served, slow_steps):
    """A visitor's queued /generate while another client posts to the direct routes from 4 threads:
    each text is what the same request gives alone. Locally the direct calls wait their turn; a
    public app refuses them in a sentence."""
    demo, url, public = served
    with httpx.Client() as http:
        alone = generate(http, url, client(1), prompt=VICTIM, max_new_tokens=24)["text"]
        assert alone and generate(http, url, client(1), prompt=VICTIM, max_new_tokens=24)["text"] == alone
    stop, answers = threading.Event(), []

    def attack(i: int):
        route = ("run/generate", "api/generate", "run/predict")[i % 3]
        with httpx.Client() as http:
            while not stop.is_set():
                body = {"data": generate_data(ATTACKER)}
                if route == "run/predict":
                    body["fn_index"] = next(f._id for f in demo.fns.values() if f.api_name == "generate")
                r = http.post(url + "gradio_api/" + route, json=body, headers=client(2), timeout=120)
                answers.append((r.status_code, r.json()))

    with ThreadPoolExecutor(4) as pool:
        attacks = [pool.submit(attack, i) for i in range(4)]
        time.sleep(0.5)
        try:
            with httpx.Client() as http:
                for _ in range(2):
                    reply = generate(http, url, client(1), prompt=VICTIM, max_new_tokens=24)
                    if reply.get("finish_reason") == "time":  # a public app's time limit on a loaded machine:
                        assert alone.startswith(reply["text"])  # the start of the same text, never another's
                    else:
                        assert reply["text"] == alone, reply.get("finish_reason")
        finally:
            stop.set()
            for a in attacks:
                a.result()
    assert answers
    if public:
        said = {(status, body["detail"]) for status, body in answers}  # refused, or past the POST rate
        assert (404, DIRECT_CLOSED) in said and said <= {(404, DIRECT_CLOSED), (429, TOO_FAST)}
    else:  # a direct call of a streaming handler answers its first value (the prefill's), in its turn
        assert all(status == 200 and body["data"][0]["step"] == 0 for status, body in answers)


def test_generations_consumed_by_threads_at_once_each_get_their_own_text(slow_steps):
    """Two generations asked for at once by two threads, each its own consumer (as two requests'
    handlers are, whatever route they came by): the second runs once the first has ended, and each
    text is what it is alone."""
    from demo.service.engine_thread import on_engine_thread
    from demo.service.request import Request

    session = tiny_session()
    requests = {p: Request.of(p, method="eagle", max_new_tokens=24, num_spec_tokens=2) for p in (VICTIM, ATTACKER)}

    def text(prompt: str) -> str:
        return list(on_engine_thread(session.generate(requests[prompt])))[-1].chat.turns[-1].text

    alone = {p: text(p) for p in requests}
    assert alone[VICTIM] != alone[ATTACKER]
    with ThreadPoolExecutor(6) as pool:
        runs = [(p, pool.submit(text, p)) for p in [VICTIM, ATTACKER] * 3]
        assert [(p, run.result(timeout=120)) for p, run in runs] == [(p, alone[p]) for p, _ in runs]


# ---------------------------------------------------------------------- 2. every event parsed and counted
@pytest.fixture(scope="module")
def public_app():
    demo, url = app(public=True)
    yield demo, url
    demo.close()


def test_a_queued_page_event_is_refused_on_every_direct_route(public_app):
    demo, url = public_app
    with httpx.Client() as http:
        chat_turn(http, url, demo, "r1", client(10))
        for name in ("bot", "replay", "run_benchmark", "trace_download", "user"):
            for route in ("run/predict", "api/predict", "run/x"):
                r = direct(http, url, demo, name, "r1", client(10), PAGE, route=route)
                assert (r.status_code, r.json()["detail"]) == (404, DIRECT_CLOSED), (name, route)


def test_unknown_events_and_bodies_are_refused_in_a_sentence(public_app, capfd):
    demo, url = public_app
    with httpx.Client() as http:
        for route, body in (("queue/join", {"data": [], "fn_index": -1, "session_hash": "r2"}),
                            ("queue/join", {"data": [], "fn_index": 999, "session_hash": "r2"}),
                            ("run/predict", {"data": [], "fn_index": 999}),
                            ("call/nothing", {"data": []}),
                            ("queue/join", [1, 2])):
            r = http.post(url + "gradio_api/" + route, json=body, headers=client(11), timeout=30)
            assert r.status_code in (404, 422) and r.json()["detail"].endswith("."), (route, body, r.text)
        one = http.post(url + "gradio_api/call/generate", json={"data": ["hi"]}, headers=client(11), timeout=30)
        assert one.status_code == 422 and "prompt, method, mode, num_spec_tokens" in one.json()["detail"]
        keywords = http.post(url + "gradio_api/call/v2/generate", json={"prompt": "hi", "max_new_tokens": 8,
                                                                        "method": "eagle"},
                             headers=client(11), timeout=30)
        assert keywords.status_code == 200  # /call/v2's keyword body (Gradio's own curl snippet) is parsed too
        last = list(events(http, url, f"gradio_api/call/generate/{keywords.json()['event_id']}"))[-1]
        assert last[0] == "complete"
        odd = http.post(url + "gradio_api/call/v2/generate", json={"prompt": "hi", "max_new_tokens": 1e9},
                        headers=client(11), timeout=30)
        kind, said = list(events(http, url, f"gradio_api/call/generate/{odd.json()['event_id']}"))[-1]
        assert kind == "error" and "out of range" in str(said)  # the request's own check, in a sentence
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("values", [{"lookup": 65}, {"lookup": -1}, {"lookup": "x"}, {"num_draft_tokens": 9}],
                         ids=["65", "-1", "x", "nodes"])
def test_a_chain_takes_no_tree_setting_through_generate(public_app, values, capfd):
    demo, url = public_app
    with httpx.Client() as http:
        refused = generate(http, url, client(12), tree_topk=0, **values)
        assert isinstance(refused.get("error"), str) and refused["error"].endswith("."), refused
    assert "Traceback" not in capfd.readouterr().err


def test_page_values_keep_their_components_steps_and_files(public_app, capfd):
    demo, url = public_app
    with httpx.Client() as http:
        half = ui_event(http, url, demo, "user", "r3", client(13), {**PAGE, "sl-prompt": "hi", "sl-shape": "tree",
                                                                    "sl-lookup": 2.5})
        assert half["status"] == 422 and "whole number" in half["error"]
        sizes = direct(http, url, demo, "tree_sizes", "r3", client(13), {"sl-k": 10 ** 9})
        assert sizes.status_code == 422 and "out of range" in sizes.json()["detail"]
        outside = direct(http, url, demo, "plan_work", "r3", client(13),
                         {"sl-bench-file": {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}})
        assert outside.status_code == 422 and "uploaded to this app" in outside.json()["detail"]
        queued = ui_event(http, url, demo, "describe_prompts", "r3", client(13),
                          {"sl-bench-file": {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}})
        assert queued["status"] == 422 and "uploaded to this app" in queued["error"]
    assert "Traceback" not in capfd.readouterr().err


def test_a_clients_events_outside_the_queue_run_one_at_a_time(public_app, monkeypatch):
    """Steps of a finished reply posted from 6 threads at once: they run one after another, the
    ones past CLIENT_INSTANT_WAITING (public_gate) are refused, and another visitor's 24-token reply is answered."""
    import demo.ui.playback as playback

    demo, url = public_app
    running, most, lock = [0], [0], threading.Lock()
    real = playback.chat_view

    def counted(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.05)  # a long reply's redraw
            return real(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(playback, "chat_view", counted)
    with httpx.Client() as http:
        chat_turn(http, url, demo, "r4", client(14))
    stop, codes = threading.Event(), []

    def spam(i: int):
        with httpx.Client() as http:
            while not stop.is_set():
                name = ("step_on", "step_back")[i % 2]
                codes.append(direct(http, url, demo, name, "r4", client(14), {}).status_code)

    with ThreadPoolExecutor(12) as pool:
        spammers = [pool.submit(spam, i) for i in range(12)]
        time.sleep(1.0)
        try:
            with httpx.Client() as http:
                start = time.monotonic()
                assert generate(http, url, client(15), prompt=VICTIM, max_new_tokens=24)["text"]
                assert time.monotonic() - start < 20
        finally:
            stop.set()
            for s in spammers:
                s.result()
    assert most[0] == 1 and 200 in codes and set(codes) <= {200, 429}
    with httpx.Client() as http:  # the spam over, the client's steps answer at once
        assert direct(http, url, demo, "step_on", "r4", client(14), {}).status_code == 200


def test_every_event_the_page_registers_has_a_role():
    """The gate counts events by the UI's tags: the generations are exactly the events that run
    the models or start a reply, whatever their handlers are called."""
    from demo.service.roles import GENERATION, INSTANT, PLAYBACK, role

    demo = build_demo(tiny_session(), Hosting(public=True))
    by_role = {}
    for fn in demo.fns.values():
        by_role.setdefault(role(fn), set()).add(fn.name)
    assert by_role[GENERATION] == {"user", "bot", "generate", "run_benchmark", "choose_preset"}
    assert by_role[PLAYBACK] == {"follow", "replay", "race"}
    assert {"step_on", "step_back", "tree_sizes", "plan_work", "models_changed"} <= by_role[INSTANT]
    assert "stop" not in by_role[GENERATION] and "clear" not in by_role[GENERATION]


# ---------------------------------------------------------------------- 3. memory given back
def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_memory_returns_after_page_sessions_end(public_app):
    """Page sessions that each ask one reply (prompts of as many lengths as there are sessions) and
    close: after 100 of them the app's resident memory is within 20 MB of where it was once warm."""
    demo, url = public_app

    def sessions(tag: str, n: int, offset: int) -> None:
        with httpx.Client() as http:
            for i in range(n):
                name = f"m-{tag}-{i}"
                chat_turn(http, url, demo, name, client(50), prompt="a" * (offset + 3 * i))
                with http.stream("GET", url + f"gradio_api/heartbeat/{name}", timeout=30) as beat:
                    next(beat.iter_lines())  # the page opens, then closes
        deadline = time.monotonic() + 20
        while any(f"m-{tag}-{i}" in demo.state_holder.session_data for i in range(n)) and time.monotonic() < deadline:
            time.sleep(0.2)

    sessions("warm", 20, 1)
    gc.collect()
    start = rss_mb()
    sessions("counted", 100, 2)
    gc.collect()
    assert rss_mb() - start < 20
    assert not any(name.startswith("m-") for name in demo.state_holder.session_data)
