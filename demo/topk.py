"""Top-k of each row of a vocabulary-wide table, in launches a captured step can afford.

``torch.topk`` over a row of tens of thousands of entries takes CUDA's multi-block radix select,
about ten kernels a call (on the H200, about 330 of the 871 us the compiled drafting of a tree of
depth 7 and top-8 spent on its kernels went to its seven calls); over many narrow slices its
single-block select is no faster (285 us). On a GPU, ``row_topk`` runs two Triton launches instead:
each program takes one BLOCK-wide slice of a row and picks its k largest by k rounds of max (the
largest entry, the lowest position among equals), then one program per row does the same over the
slices' picks; a row of at most BLOCK entries takes the second pass alone. Exact: each of a row's
k largest entries is among the k largest of its own slice; equal entries come out lowest position
first (``torch.topk`` leaves their order unspecified), and NaN ranks with -inf (``torch.topk``
ranks it highest). The op is a ``torch.library.triton_op``, so torch.compile sees its kernels and
CUDA graphs capture them. Without Triton, and on a CPU (where a top-k is one loop over the row),
``torch.topk`` runs as it is.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install
    triton = None

BLOCK = 2048  # the slice one program takes in the first pass


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] float -> (values [R, k] of x's dtype, indices [R, k] int64): each row's k largest,
    largest first."""
    if triton is not None and x.is_cuda and k <= min(32, x.shape[1]):
        values, indices = torch.ops.speclens.row_topk(x.contiguous(), k)
        return values.to(x.dtype), indices
    top = x.topk(k, dim=-1)
    return top.values, top.indices


def two_pass_topk(x: torch.Tensor, k: int, kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """The two passes, launching `kernel` (``_slice_topk``, jitted or interpreted) as `launch`
    does; x [R, V] contiguous -> (values [R, k] float32, indices [R, k] int64)."""
    R, V = x.shape
    if V <= BLOCK:  # one slice: one pass
        values = torch.empty(R, k, dtype=torch.float32, device=x.device)
        indices = torch.empty(R, k, dtype=torch.int64, device=x.device)
        launch(kernel, (R, 1), x, values, indices, V, triton.next_power_of_2(V), k)
        return values, indices
    slices = triton.cdiv(V, BLOCK)
    vals = torch.empty(R, slices * k, dtype=torch.float32, device=x.device)  # [R, S*k] each slice's picks
    pos = torch.empty(R, slices * k, dtype=torch.int64, device=x.device)  # their columns in x
    launch(kernel, (R, slices), x, vals, pos, V, BLOCK, k)
    values = torch.empty(R, k, dtype=torch.float32, device=x.device)
    pick = torch.empty(R, k, dtype=torch.int64, device=x.device)  # columns in vals
    launch(kernel, (R, 1), vals, values, pick, slices * k, triton.next_power_of_2(slices * k), k)
    return values, pos.gather(1, pick)


def launch(kernel, grid, x, values, positions, width, block, k) -> None:
    """One pass: program (r, s) writes the k largest of x[r, s*block : (s+1)*block] (columns below
    width) at values/positions[r, s*k : (s+1)*k], largest first."""
    kernel[grid](x, values, positions, width, x.stride(0), values.stride(0), K=k, BLOCK=block)


if triton is not None:
    @triton.jit
    def _slice_topk(x_ptr, values_ptr, positions_ptr, width, x_stride, out_stride,
                    K: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        part = tl.program_id(1)
        lane = tl.arange(0, BLOCK)
        column = part * BLOCK + lane
        inside = column < width
        x = tl.load(x_ptr + row * x_stride + column, mask=inside, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))  # NaN ranks lowest: every pick stays a column of the row
        taken = lane < 0  # none yet: a column is picked once, even among equal entries
        out = values_ptr + row * out_stride + part * K
        for i in tl.static_range(K):
            free = inside & ~taken
            best = tl.max(tl.where(free, x, float("-inf")), axis=0)
            at = tl.min(tl.where(free & (x == best), lane, BLOCK), axis=0)
            tl.store(out + i, best)
            tl.store(positions_ptr + row * out_stride + part * K + i, (part * BLOCK + at).to(tl.int64))
            taken = taken | (lane == at)

    @torch.library.triton_op("speclens::row_topk", mutates_args=())
    def _row_topk_op(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return two_pass_topk(x, k, torch.library.wrap_triton(_slice_topk))
