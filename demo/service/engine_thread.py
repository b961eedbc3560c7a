"""Every piece of the app's model work on one thread: loading, warm-up and every engine step.

PyTorch's CPU thread pool (OpenMP) belongs to the thread that calls into it. Gradio runs each step
of a streaming handler on whichever of its worker threads is free, so a generation would hop
between threads, each bringing its own pool. Worse, one idle pool is enough: on 2 cores the
embedded default's target-only decoding ran 15 tokens/s on one thread after the main thread had
loaded the models (its own pool), against 24 with everything on one thread. Most likely libgomp,
managing more threads than cores, then sleeps between parallel regions instead of spinning (with
OMP_WAIT_POLICY=PASSIVE the main thread alone slows alike). The app runs one generation at a time anyway (its engine queue), so the
models are loaded, warmed up and run on one dedicated thread, and only the handlers hop.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


class _EngineThread:
    """This process's engine thread, started on first use. A forked process (as a host that attaches
    a GPU per call may fork) inherits the executor but not its thread: it forgets both and starts its own."""

    def __init__(self):
        self.forget()

    def forget(self) -> None:
        self._lock = threading.Lock()  # a fork may copy it held
        self._executor: ThreadPoolExecutor | None = None
        self._ident: int | None = None

    def started(self) -> tuple[ThreadPoolExecutor, int]:
        """(its executor, its thread's ident)."""
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speclens-engine")
                    self._ident = executor.submit(threading.get_ident).result()
                    self._executor = executor
        return self._executor, self._ident


_THREAD = _EngineThread()
os.register_at_fork(after_in_child=_THREAD.forget)


def on_the_engine_thread() -> bool:
    return threading.get_ident() == _THREAD.started()[1]


def run_on_engine_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs), computed on the engine thread (the caller waits; there, it is a call)."""
    if on_the_engine_thread():
        return fn(*args, **kwargs)
    return _THREAD.started()[0].submit(fn, *args, **kwargs).result()


def on_engine_thread(steps: Iterator[T]) -> Iterator[T]:
    """`steps`, each one computed on the engine thread (the caller waits for it there)."""
    if on_the_engine_thread():
        yield from steps
        return
    try:
        while True:
            try:
                yield _THREAD.started()[0].submit(next, steps).result()
            except StopIteration:
                return
    finally:  # a generation dropped midway (Stop, a closed tab) is closed there too, without waiting
        _THREAD.started()[0].submit(steps.close)


def engine_thread_idle() -> None:
    """Return once every step asked for so far has run. Stop needs it: cancelling the reply's event
    does not interrupt the step in flight, which would otherwise change the chat while Stop draws it."""
    _THREAD.started()[0].submit(lambda: None).result()
