"""Where the Triton kernels can run, and which kernels a target's forwards run (``Target(kernels=)``):

    fused  demo.kernels.attend's attention and demo.kernels.fused's layer kernels: RMSNorm in the
           projection that follows it, RoPE and the cache write in q/k/v's, SiLU-and-multiply in
           gate/up's, the residual in o_proj's and down's; each row computed alike whatever the
           forward's width. The default, and what the app runs (docs/PERFORMANCE.md, "Kernels").
    persistent  the same kernels' arithmetic, every layer of a decoding step's forward in one
           persistent launch (demo.kernels.persistent): logits equal to the fused path's, bit for
           bit; a prefill runs the fused kernels. A bench choice (``--kernels persistent``).
    torch  PyTorch throughout (SDPA's attention): the reference the fused path is tested against,
           and a bench row beside it (``python -m demo.bench --kernels torch``).

On a CPU both run PyTorch (Triton's interpreter, TRITON_INTERPRET=1, runs the Triton kernels there
for tests).
"""

from __future__ import annotations

import importlib.util
import os

KERNELS = ("fused", "persistent", "torch")
DEFAULT_KERNELS = "fused"

HAVE_TRITON = importlib.util.find_spec("triton") is not None  # a CPU-only install may lack it
# Triton's interpreter (read when Triton is imported) runs the kernels on CPU tensors
INTERPRETED = HAVE_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


def check_kernels(name: str) -> str:
    """`name` if it is one of KERNELS; else a ValueError that lists them."""
    if name not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, not {name!r}")
    return name


def triton_on(tensor) -> bool:
    """Whether Triton kernels can run on this tensor's device (a GPU, or the interpreter)."""
    return HAVE_TRITON and (tensor.is_cuda or INTERPRETED)
