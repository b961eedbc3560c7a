"""Running code under Triton's interpreter: a fresh process with TRITON_INTERPRET=1 (Triton reads it
when it is imported), where each kernel runs in numpy on the CPU and ``tl.dot`` is numpy's matmul.

The kernels' tests check that a row's bits never depend on the rows beside it, which a GPU's
matrix instructions give. numpy's OpenBLAS picks its matmul kernel for the CPU it finds, or as
OPENBLAS_CORETYPE says (this workplace's machines set Haswell), and its Haswell kernel computes the
rows of a 16-row tile in two groups that round apart (rows 0-5 and 6-15), so a row's bits would
follow its place in the tile. The process pins OpenBLAS to its plain SSE kernel (Prescott, on every
x86-64), which computes every row alike, on one thread (as torch's own CPU ops: a process's bits never
follow how a loaded machine schedules its threads), with a fixed hash seed."""

import os
import subprocess
import sys


def interpreter_env() -> dict:
    return dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.getcwd(), OPENBLAS_CORETYPE="Prescott",
                OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")


def run_interpreted(code: str, expect: str = "checked", timeout: int = 900) -> str:
    """Run `code` in an interpreting process; assert it exits cleanly and prints `expect`. -> stdout."""
    out = subprocess.run([sys.executable, "-c", code], env=interpreter_env(), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    assert expect in out.stdout, out.stdout[-2000:]
    return out.stdout
