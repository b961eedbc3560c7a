"""Every piece of the app's model work on one thread, one job at a time: loading, warm-up and each
generation, from its first step to its last.

PyTorch's CPU thread pool (OpenMP) belongs to the thread that calls into it. Gradio runs each step
of a streaming handler on whichever of its worker threads is free, so a generation would hop
between threads, each bringing its own pool. Worse, one idle pool is enough: on 2 cores the
embedded default's target-only decoding ran 15 tokens/s on one thread after the main thread had
loaded the models (its own pool), against 24 with everything on one thread. Most likely libgomp,
managing more threads than cores, then sleeps between parallel regions instead of spinning (with
OMP_WAIT_POLICY=PASSIVE the main thread alone slows alike). So the models are loaded, warmed up and
run on one dedicated thread, and only the handlers hop.

A generation is one job: it holds the engine thread from its first step to its end, and the next
job (another generation, a load) starts only then. So whatever route a request came in by (the
page's queue, /call, a direct /run, a script in the same process), two generations never
interleave their steps on the models' caches; the engine refuses that anyway (Target.hold_cache),
and this is what makes every route wait its turn instead. A job whose consumer stops asking for
steps without closing it is ended after ABANDONED_S, so a dropped request cannot hold the engine.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

# A generation's consumer that asked for no step for this long, and never closed it, has gone: its
# job ends and frees the engine. A page or API consumer asks again as soon as it has sent a step
# (milliseconds to a second), and Gradio closes a generation whose client left.
ABANDONED_S = 30.0
ENDED = ("This generation was ended: it asked for no step for "
         f"{ABANDONED_S:g} s, and the engine went on to other requests.")


class EngineReleased(RuntimeError):
    """A job's consumer asked for a step after ABANDONED_S without one: the engine has moved on."""


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
_GIVEN = [0]  # jobs given to the engine thread and not yet ended (engine_busy)
_GIVEN_LOCK = threading.Lock()


def _given(future) -> None:
    """Count a job given to the engine thread until its future is done."""
    with _GIVEN_LOCK:
        _GIVEN[0] += 1

    def ended(_):
        with _GIVEN_LOCK:
            _GIVEN[0] -= 1

    future.add_done_callback(ended)


def engine_busy() -> bool:
    """A job (a generation, a load, a warm-up) holds the engine thread or waits for it: a request now
    waits its turn. What the page says while a reply waits."""
    with _GIVEN_LOCK:
        return _GIVEN[0] > 0

_NEXT, _CLOSE = "next", "close"  # what a consumer asks of its job
_VALUE, _END, _ERROR = "value", "end", "error"  # what the job answers


class _Job:
    """A generation on the engine thread: it runs one step per ask, in order, and holds the thread
    between steps, so no other job's step comes between two of its own."""

    def __init__(self, steps: Iterator[T]):
        self.steps = steps
        self.asks: queue.SimpleQueue = queue.SimpleQueue()
        self.answers: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        """On the engine thread: a step per ask until the steps end, fail, are closed or abandoned."""
        try:
            while True:
                try:
                    ask = self.asks.get(timeout=ABANDONED_S)
                except queue.Empty:  # the consumer went without closing: whatever it asks later is refused
                    self.answers.put((_ERROR, EngineReleased(ENDED)))
                    return
                if ask == _CLOSE:
                    return
                try:
                    self.answers.put((_VALUE, next(self.steps)))
                except StopIteration:
                    self.answers.put((_END, None))
                    return
                except BaseException as e:  # noqa: BLE001 (the consumer raises it)
                    self.answers.put((_ERROR, e))
                    return
        finally:  # a generation dropped midway (Stop, a closed tab) is closed here, on the engine thread
            self.steps.close()


def on_the_engine_thread() -> bool:
    return threading.get_ident() == _THREAD.started()[1]


def run_on_engine_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs), computed on the engine thread as a job of its own (the caller waits for
    the jobs before it, then for it; there, it is a call)."""
    if on_the_engine_thread():
        return fn(*args, **kwargs)
    future = _THREAD.started()[0].submit(fn, *args, **kwargs)
    _given(future)
    return future.result()


def on_engine_thread(steps: Iterator[T]) -> Iterator[T]:
    """`steps` as one job of the engine thread: each step computed there when the caller asks for it
    (the caller waits for it), and no other job's work between them. On the engine thread itself,
    `steps` as they are."""
    if on_the_engine_thread():
        yield from steps
        return
    job = _Job(steps)
    _given(_THREAD.started()[0].submit(job.run))
    try:
        while True:
            job.asks.put(_NEXT)
            kind, value = job.answers.get()
            if kind == _END:
                return
            if kind == _ERROR:
                raise value
            yield value
    finally:  # the job ends at its next ask; its steps are closed on the engine thread
        job.asks.put(_CLOSE)


def engine_thread_idle() -> None:
    """Return once the jobs given to the engine thread so far have ended. Stop needs it: cancelling a
    reply closes its job after the step in flight, which would otherwise change the chat while Stop
    draws it."""
    _THREAD.started()[0].submit(lambda: None).result()
