"""Every engine step on one thread.

PyTorch's CPU thread pool (OpenMP) belongs to the thread that calls into it. Gradio runs each step
of a streaming handler on whichever of its worker threads is free, so a generation hops between
threads, each bringing its own pool, and the pools compete for the cores (on 2 cores the embedded
default runs about a third slower so). The app runs one generation at a time anyway (its engine queue), so every step of
every generation runs on one dedicated thread instead, and only the handler hops.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, TypeVar

T = TypeVar("T")

_ENGINE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speclens-engine")


def on_engine_thread(steps: Iterator[T]) -> Iterator[T]:
    """`steps`, each one computed on the engine thread (the caller waits for it there)."""
    try:
        while True:
            try:
                yield _ENGINE_THREAD.submit(next, steps).result()
            except StopIteration:
                return
    finally:  # a generation dropped midway (Stop, a closed tab) is closed there too, without waiting
        _ENGINE_THREAD.submit(steps.close)


def engine_thread_idle() -> None:
    """Return once every step asked for so far has run. Stop needs it: cancelling the reply's event
    does not interrupt the step in flight, which would otherwise change the chat while Stop draws it."""
    _ENGINE_THREAD.submit(lambda: None).result()
