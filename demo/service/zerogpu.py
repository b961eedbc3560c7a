"""ZeroGPU, Hugging Face's shared Space GPUs: a GPU is attached to a process for one call of a
function decorated with ``spaces.GPU`` and taken back after it. So on ZeroGPU:

- every handler that runs the models (a chat reply, /generate, a benchmark) runs inside
  ``spaces.GPU`` (``on_gpu``);
- CUDA graphs live for one call: the GPU, and the memory the graphs point at, are attached per
  call, so a graph captured in one call is never replayed in another. A request in graph mode
  captures the steps it needs inside its call (no compile, which ZeroGPU does not support; only the
  attend buckets its prompt and reply reach), replays them for the rest of the reply, and every
  engine's graphs are released as the call begins and as it ends (``per_call``); the page says
  what the capture cost (``GRAPHS_PER_CALL``);
- the app skips its start-up warm-up, which would run with no GPU attached.

ZeroGPU is the `spaces` package importable *and* SPACES_ZERO_GPU set (what ZeroGPU Spaces set;
``spaces.config.Config.zero_gpu`` when the package has it): `spaces` is installed on every Gradio
Space, and its decorator does nothing off ZeroGPU, where a dedicated GPU keeps its graphs. Without
`spaces`, everything here is a no-op.
"""

from __future__ import annotations

import functools
import inspect
import os
import weakref

GRAPHS_PER_CALL = ("on ZeroGPU the GPU is attached for each call, so each request captures the CUDA graphs "
                   "it needs (no compile) and the status says what that cost")
_PER_CALL: "weakref.WeakSet" = weakref.WeakSet()  # what holds graphs of one call: each has release_graphs()
REPLY_SECONDS = 120  # spaces.GPU(duration=...): the most one chat reply or /generate call holds the GPU
BENCH_SECONDS = 300  # ... and one run of the Benchmark tab (bounded by hosting.BENCH_WORK_BUDGET)


def spaces_module():
    """The `spaces` package, or None when it is not installed."""
    try:
        import spaces
    except ImportError:
        return None
    return spaces


def active() -> bool:
    """Whether this process runs on ZeroGPU."""
    spaces = spaces_module()
    if spaces is None:
        return False
    flag = getattr(getattr(getattr(spaces, "config", None), "Config", None), "zero_gpu", None)
    if flag is None:
        flag = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
    return bool(flag)


def per_call(holder) -> None:
    """Release `holder`'s CUDA graphs (holder.release_graphs()) as every ZeroGPU call begins and ends:
    a graph captured in one call points at memory of a GPU attached for that call only."""
    _PER_CALL.add(holder)


def release_graphs() -> None:
    """Every registered holder's graphs released (the next graph-mode request captures anew), on the
    engine thread: after the job that used them has ended, never beside one."""
    from demo.service.engine_thread import run_on_engine_thread

    run_on_engine_thread(_release_all)


def _release_all() -> None:
    for holder in list(_PER_CALL):
        holder.release_graphs()
    import torch

    if _PER_CALL and torch.cuda.is_available():
        torch.cuda.empty_cache()  # the graphs' memory pools, given back with the GPU


def _within_one_call(fn):
    """`fn` with every holder's graphs released before it runs and after it ends (a generator: once it
    is exhausted or closed), so no graph outlives the call that captured it."""
    if inspect.isgeneratorfunction(fn):
        def call(*args, **kwargs):
            release_graphs()
            try:
                yield from fn(*args, **kwargs)
            finally:
                release_graphs()
    else:
        def call(*args, **kwargs):
            release_graphs()
            try:
                return fn(*args, **kwargs)
            finally:
                release_graphs()
    return functools.wraps(fn)(call)


def on_gpu(fn, duration: int = REPLY_SECONDS):
    """`fn` run inside ``spaces.GPU(duration=...)`` on ZeroGPU, its graphs those of the call alone
    (keeping its name, which the hosting limits read, and its signature, which Gradio reads); `fn`
    itself anywhere else."""
    if not active():
        return fn
    return functools.wraps(fn)(spaces_module().GPU(duration=duration)(_within_one_call(fn)))
