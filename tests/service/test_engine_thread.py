"""demo/service/engine_thread.py: a generation's steps all run on one thread, whichever threads ask for
them (PyTorch's CPU thread pool belongs to the calling thread)."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from demo.service.engine_thread import engine_thread_idle, on_engine_thread


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


def test_idle_returns_only_after_the_step_in_flight_has_run():
    release, ran = threading.Event(), []

    def slow_step():
        release.wait(5)
        ran.append("step")
        yield 1

    asker = ThreadPoolExecutor(1).submit(next, on_engine_thread(slow_step()))  # a step in flight
    threading.Timer(0.2, release.set).start()
    engine_thread_idle()
    assert ran == ["step"] and asker.result() == 1
