"""Which kernels the forwards run on a GPU: one setting for the process, read when a forward runs
(so a graph captured or a step compiled after a change runs the new choice).

    fused      demo.kernels.attend's attention and demo.kernels.fused's layer kernels: RMSNorm in the projection that
               follows it, RoPE and the cache write in q/k/v's, SiLU-and-multiply in gate/up's, the
               residual in o_proj's and down's; each row computed alike whatever the forward's width.
               The default: on the H200 the verification forward replays in 1.21 ms against 1.82
               for PyTorch's layers compiled, and a chain of 7 decodes ShareGPT at 2395.7 tokens/s
               against 1722.2 with PyTorch's layers compiled the day before (docs/RESULTS.md D15 to D17)
    attention  demo.kernels.attend's Triton attention; PyTorch (cuBLAS, inductor) for the rest
    torch      PyTorch throughout (SDPA's attention)

On a CPU every choice runs PyTorch (Triton's interpreter, TRITON_INTERPRET=1, runs the Triton ones
there for tests).
"""

from __future__ import annotations

import importlib.util
import os

KERNELS = ("attention", "fused", "torch")
DEFAULT_KERNELS = "fused"
_current = DEFAULT_KERNELS

HAVE_TRITON = importlib.util.find_spec("triton") is not None  # a CPU-only install may lack it
# Triton's interpreter (read when Triton is imported) runs the kernels on CPU tensors
INTERPRETED = HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


def set_kernels(name: str) -> None:
    """Pick the kernels every later forward runs."""
    global _current
    if name not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, not {name!r}")
    _current = name


def kernels() -> str:
    return _current


def triton_on(tensor) -> bool:
    """Whether Triton kernels can run on this tensor's device (a GPU, or the interpreter)."""
    return HAVE_TRITON and (tensor.is_cuda or INTERPRETED)
