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

_engine: tuple[int, ThreadPoolExecutor, int] | None = None  # (process id, the thread's executor, its ident)
_starting = threading.Lock()


def _engine_thread() -> tuple[ThreadPoolExecutor, int]:
    """This process's engine thread, started on first use. A process forked after that (as a host
    that attaches a GPU per call may fork) inherits the executor but not its thread: it starts its own."""
    global _engine, _starting
    if _engine is not None and _engine[0] == os.getpid():
        return _engine[1], _engine[2]
    if _engine is not None:  # forked: the lock may have been copied held
        _starting = threading.Lock()
    with _starting:
        if _engine is None or _engine[0] != os.getpid():
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speclens-engine")
            _engine = (os.getpid(), executor, executor.submit(threading.get_ident).result())
    return _engine[1], _engine[2]


def on_the_engine_thread() -> bool:
    return threading.get_ident() == _engine_thread()[1]


def run_on_engine_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs), computed on the engine thread (the caller waits; there, it is a call)."""
    if on_the_engine_thread():
        return fn(*args, **kwargs)
    return _engine_thread()[0].submit(fn, *args, **kwargs).result()


def on_engine_thread(steps: Iterator[T]) -> Iterator[T]:
    """`steps`, each one computed on the engine thread (the caller waits for it there)."""
    if on_the_engine_thread():
        yield from steps
        return
    try:
        while True:
            try:
                yield _engine_thread()[0].submit(next, steps).result()
            except StopIteration:
                return
    finally:  # a generation dropped midway (Stop, a closed tab) is closed there too, without waiting
        _engine_thread()[0].submit(steps.close)


def engine_thread_idle() -> None:
    """Return once every step asked for so far has run. Stop needs it: cancelling the reply's event
    does not interrupt the step in flight, which would otherwise change the chat while Stop draws it."""
    _engine_thread()[0].submit(lambda: None).result()
