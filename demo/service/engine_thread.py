"""Every piece of the app's model work on one thread: loading, warm-up and every engine step.

PyTorch's CPU thread pool (OpenMP) belongs to the thread that calls into it. Gradio runs each step
of a streaming handler on whichever of its worker threads is free, so a generation would hop
between threads, each bringing its own pool. Worse, one idle pool is enough: once the main thread
has loaded the models (its own pool), libgomp manages more threads than there are cores and stops
spinning between parallel regions, so every region waits for a sleeping thread. On 2 cores the
embedded default's target-only decoding ran 15 tokens/s asked from one other thread against 24 on
the thread that loaded it. The app runs one generation at a time anyway (its engine queue), so the
models are loaded, warmed up and run on one dedicated thread, and only the handlers hop.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


class _EngineThread:
    """This process's engine thread, started on first use. A process forked after that (as a host
    that attaches a GPU per call may fork) inherits the executor but not its thread: it starts its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._ident: int | None = None

    def _started(self) -> None:
        if self._pid == os.getpid():
            return
        if self._pid is not None:  # forked: the lock may have been copied held
            self._lock = threading.Lock()
        with self._lock:
            if self._pid != os.getpid():
                executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speclens-engine")
                self._ident = executor.submit(threading.get_ident).result()
                self._executor, self._pid = executor, os.getpid()

    def executor(self) -> ThreadPoolExecutor:
        self._started()
        return self._executor

    def ident(self) -> int:
        self._started()
        return self._ident


_THREAD = _EngineThread()


def on_the_engine_thread() -> bool:
    return threading.get_ident() == _THREAD.ident()


def run_on_engine_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs), computed on the engine thread (the caller waits; there, it is a call)."""
    if on_the_engine_thread():
        return fn(*args, **kwargs)
    return _THREAD.executor().submit(fn, *args, **kwargs).result()


def on_engine_thread(steps: Iterator[T]) -> Iterator[T]:
    """`steps`, each one computed on the engine thread (the caller waits for it there)."""
    if on_the_engine_thread():
        yield from steps
        return
    try:
        while True:
            try:
                yield _THREAD.executor().submit(next, steps).result()
            except StopIteration:
                return
    finally:  # a generation dropped midway (Stop, a closed tab) is closed there too, without waiting
        _THREAD.executor().submit(steps.close)


def engine_thread_idle() -> None:
    """Return once every step asked for so far has run. Stop needs it: cancelling the reply's event
    does not interrupt the step in flight, which would otherwise change the chat while Stop draws it."""
    _THREAD.executor().submit(lambda: None).result()
