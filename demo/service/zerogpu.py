"""ZeroGPU, Hugging Face's shared Space GPUs: a GPU is attached to a process for one call of a
function decorated with ``spaces.GPU`` and taken back after it. So on ZeroGPU:

- every handler that runs the models (a chat reply, /generate, a benchmark) runs inside
  ``spaces.GPU`` (``on_gpu``);
- generation is eager: CUDA graphs captured in one call do not survive to the next (the GPU, and
  the memory the graphs point at, are attached per call), so graph mode is off and the page says why
  (``GRAPHS_OFF``, through Session.cudagraph_unavailable);
- the app skips its start-up warm-up, which would run with no GPU attached.

ZeroGPU is the `spaces` package importable *and* SPACES_ZERO_GPU set (what ZeroGPU Spaces set;
``spaces.config.Config.zero_gpu`` when the package has it): `spaces` is installed on every Gradio
Space, and its decorator does nothing off ZeroGPU, where a dedicated GPU keeps its graphs. Without
`spaces`, everything here is a no-op.
"""

from __future__ import annotations

import functools
import os

GRAPHS_OFF = ("on ZeroGPU the GPU is attached for each call, and CUDA graphs captured in one call do not "
              "survive to the next")
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


def on_gpu(fn, duration: int = REPLY_SECONDS):
    """`fn` run inside ``spaces.GPU(duration=...)`` on ZeroGPU (keeping its name, which the hosting
    limits read, and its signature, which Gradio reads); `fn` itself anywhere else."""
    if not active():
        return fn
    return functools.wraps(fn)(spaces_module().GPU(duration=duration)(fn))
