"""demo/service/engine_thread.py: the models are loaded, warmed up and run on one thread, whichever
threads ask (PyTorch's CPU thread pool belongs to the calling thread, and an idle second pool slows
the first)."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from demo.engine import Engine
from demo.service.engine_thread import engine_thread_idle, on_engine_thread, run_on_engine_thread
from demo.service.model_cache import ModelCache, ModelChoice, Models
from demo.service.session import Session
from tests.tiny_chat import tiny_session

ENGINE_THREAD = run_on_engine_thread(threading.get_ident)


def steps(n: int, threads: list[int]):
    """n steps, each noting the thread it ran on."""
    for i in range(n):
        threads.append(threading.get_ident())
        yield i


def test_every_step_runs_on_one_thread_whichever_threads_ask():
    ran: list[int] = []
    wrapped = on_engine_thread(steps(6, ran))
    askers = itertools.cycle([ThreadPoolExecutor(1) for _ in range(3)])  # as Gradio's worker threads do
    got = []
    while True:
        try:
            got.append(next(askers).submit(next, wrapped).result())
        except StopIteration:
            break
    assert got == list(range(6))
    assert len(set(ran)) == 1 and ran[0] != threading.get_ident()


def test_an_error_of_a_step_reaches_the_caller():
    def failing():
        yield 1
        raise ValueError("bad step")

    wrapped = on_engine_thread(failing())
    assert next(wrapped) == 1
    with pytest.raises(ValueError, match="bad step"):
        next(wrapped)


def test_a_generation_dropped_midway_is_closed():
    closed = threading.Event()

    def generation():
        try:
            yield from range(100)
        finally:
            closed.set()

    wrapped = on_engine_thread(generation())
    next(wrapped)
    wrapped.close()
    assert closed.wait(5)


def test_idle_returns_only_after_the_job_in_flight_has_ended():
    release, ran = threading.Event(), []

    def slow_step():
        release.wait(5)
        ran.append("step")
        yield 1

    asker = ThreadPoolExecutor(1).submit(next, on_engine_thread(slow_step()))  # a step in flight, then dropped
    threading.Timer(0.2, release.set).start()
    engine_thread_idle()
    assert ran == ["step"] and asker.result() == 1


def test_a_generation_holds_the_engine_thread_until_it_ends():
    """Two generations asked for step by step from two threads: the second's first step runs only
    once the first has ended, so no step of one comes between two of the other."""
    order = []

    def generation(name: str, n: int):
        for i in range(n):
            order.append((name, i))
            yield i

    first = on_engine_thread(generation("a", 4))
    assert next(first) == 0
    second = ThreadPoolExecutor(1).submit(lambda: list(on_engine_thread(generation("b", 2))))
    time.sleep(0.3)  # the second waits, its job queued behind the first
    assert order == [("a", 0)] and not second.done()
    assert list(first) == [1, 2, 3]
    assert second.result(timeout=10) == [0, 1]
    assert order == [("a", i) for i in range(4)] + [("b", 0), ("b", 1)]


def test_a_generation_its_consumer_abandoned_frees_the_engine(monkeypatch):
    """A consumer that stops asking without closing its generation: after ABANDONED_S the job ends,
    the generation is closed, the next job runs, and a late ask is refused in a sentence."""
    import demo.service.engine_thread as engine_thread

    monkeypatch.setattr(engine_thread, "ABANDONED_S", 0.3)
    closed = threading.Event()

    def generation():
        try:
            yield from range(10)
        finally:
            closed.set()

    dropped = on_engine_thread(generation())
    assert next(dropped) == 0  # ... and never asked again
    assert run_on_engine_thread(lambda: "next job") == "next job"  # waited out the abandoned one
    assert closed.is_set()
    with pytest.raises(engine_thread.EngineReleased, match="asked for no step"):
        next(dropped)


def test_a_call_runs_on_the_engine_thread_and_one_made_there_runs_in_place():
    assert ENGINE_THREAD != threading.get_ident()
    assert run_on_engine_thread(lambda: run_on_engine_thread(threading.get_ident)) == ENGINE_THREAD  # no deadlock
    nested = run_on_engine_thread(lambda: list(on_engine_thread(steps(3, []))))
    assert nested == [0, 1, 2]


def record_threads(monkeypatch, cls, name: str) -> list[int]:
    """The threads `cls.name` is called on from now on."""
    threads, real = [], getattr(cls, name)

    def recorded(*args, **kwargs):
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(cls, name, recorded)
    return threads


def test_a_session_loads_its_models_and_warms_up_on_the_engine_thread(monkeypatch):
    session, loads = tiny_session(), []

    def load(choice, **kwargs):
        loads.append(threading.get_ident())
        return session.models

    monkeypatch.setattr(Models, "load", load)
    loaded = Session.load(ModelChoice(name="tiny", target="tiny"))
    assert loads == [ENGINE_THREAD] and loaded.models is session.models
    generations = record_threads(monkeypatch, Engine, "generate")
    loaded.warmup(("eager",))
    assert generations and set(generations) == {ENGINE_THREAD}


def test_a_model_cache_loads_a_preset_on_the_engine_thread():
    session = tiny_session()
    threads = []

    def load(name, progress=None):
        threads.append(threading.get_ident())
        return session.models

    cache = ModelCache(session.models, load, budget_bytes=10 ** 12)
    cache.get("another")
    assert threads == [ENGINE_THREAD]


def test_a_forked_process_starts_an_engine_thread_of_its_own():
    """A child forked after the engine thread started inherits its executor but not its thread."""
    import multiprocessing

    run_on_engine_thread(threading.get_ident)  # the parent's engine thread runs
    fork = multiprocessing.get_context("fork")
    with fork.Pool(1) as pool:
        child = pool.apply_async(run_on_engine_thread, (sum, [1, 2, 3]))
        assert child.get(timeout=30) == 6


def test_a_refused_prompt_is_said_in_the_status_line_too_so_no_earlier_status_stands_beside_it():
    import gradio as gr

    from demo.views import build_demo

    demo = build_demo(tiny_session())
    user = next(f for f in demo.fns.values() if f.name == "user")
    values = {block: getattr(block, "value", None) for block in user.inputs}
    chat = next(b for b in user.inputs if b.__class__.__name__ == "State" and hasattr(b.value, "turns"))
    status = next(b for b in user.outputs if getattr(b, "elem_id", None) == "sl-status")
    values[chat] = type(chat.value)()
    said = user.fn(values)  # an empty prompt
    first = next(said)
    assert set(first) == {status} and "sl-status-error" in first[status] and "The prompt is empty" in first[status]
    with pytest.raises(gr.Error, match="The prompt is empty"):  # and its toast
        next(said)


def test_the_engine_is_busy_while_a_job_holds_it_or_waits_and_idle_after():
    from demo.service.engine_thread import engine_busy

    engine_thread_idle()
    assert not engine_busy()
    release = threading.Event()
    holding = ThreadPoolExecutor(1).submit(run_on_engine_thread, release.wait, 30)
    started = time.monotonic()
    while not engine_busy() and time.monotonic() - started < 10:
        time.sleep(0.01)
    assert engine_busy()
    generation = on_engine_thread(steps(2, []))
    release.set()
    assert list(generation) == [0, 1] and holding.result(timeout=10)
    engine_thread_idle()
    assert not engine_busy()


def test_a_prompt_sent_while_the_engine_answers_another_says_it_waits_its_turn():
    """The page's first half (no engine) tells the visitor that their reply waits for the engine,
    where it said "starting…" for as long as another request ran."""
    from demo.views import build_demo

    session = tiny_session()
    demo = build_demo(session)
    user = next(f for f in demo.fns.values() if f.name == "user")
    values = {block: getattr(block, "value", None) for block in user.inputs}
    prompt = next(b for b in user.inputs if getattr(b, "elem_id", None) == "sl-prompt")
    chat = next(b for b in user.inputs if b.__class__.__name__ == "State" and b.value is not None
                and hasattr(b.value, "turns"))
    status = next(b for b in user.outputs if getattr(b, "elem_id", None) == "sl-status")
    values[prompt] = "hello"
    values[chat] = type(chat.value)()
    engine_thread_idle()
    assert "starting" in list(user.fn(values))[-1][status]
    release = threading.Event()
    holding = ThreadPoolExecutor(1).submit(run_on_engine_thread, release.wait, 30)
    try:
        started = time.monotonic()
        while "waiting for the engine" not in (said := list(user.fn({**values, chat: type(chat.value)()}))[-1][status]):
            assert time.monotonic() - started < 10, said
            time.sleep(0.01)
    finally:
        release.set()
        holding.result(timeout=10)
