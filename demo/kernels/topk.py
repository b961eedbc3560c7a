"""Top-k of each row of a vocabulary-wide table, in launches a captured step can afford.

``torch.topk`` over a row of tens of thousands of entries takes CUDA's multi-block radix select,
about ten kernels a call, and a tree's drafting calls it once a depth; over many narrow slices its
single-block select is no faster (docs/PERFORMANCE.md, "Draft trees"). On a GPU, ``row_topk`` runs
two Triton launches instead:
each program takes one BLOCK-wide slice of a row and picks its k largest by k rounds of max (the
largest entry, the lowest position among equals), then one program per row does the same over the
slices' picks; a row of at most BLOCK entries takes the second pass alone. Exact: each of a row's
k largest entries is among the k largest of its own slice; equal entries come out lowest position
first (``torch.topk`` leaves their order unspecified), and NaN ranks with -inf (``torch.topk``
ranks it highest). The op is a ``torch.library.triton_op``, so torch.compile sees its kernels and
CUDA graphs capture them. Without Triton, and on a CPU (where a top-k is one loop over the row),
``torch.topk`` runs as it is.

``log_probs=True`` gives the k largest log-softmax values instead (a tree's children scored by log
q): the first pass also leaves each slice's max and sum of exponentials, and the second weighs them
into the row's logsumexp, so no separate reduction over the row runs (one launch a draft depth).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install
    triton = None

BLOCK = 2048  # the slice one program takes in the first pass
LSE_NONE, LSE_STATS, LSE_WEIGHED, LSE_OWN = 0, 1, 2, 3  # what a pass does towards log-softmax values


def row_topk(x: torch.Tensor, k: int, log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] float -> (values [R, k] of x's dtype, indices [R, k] int64): each row's k largest,
    largest first. log_probs: the values are those entries' log-softmax over the row, float32."""
    if triton is not None and x.is_cuda and k <= min(32, x.shape[1]):
        values, indices = torch.ops.speclens.row_topk(x.contiguous(), k, log_probs)
        return (values if log_probs else values.to(x.dtype)), indices
    top = x.topk(k, dim=-1)
    if log_probs:
        return top.values.float() - torch.logsumexp(x.float(), dim=-1, keepdim=True), top.indices
    return top.values, top.indices


def two_pass_topk(x: torch.Tensor, k: int, kernel, log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The two passes, launching `kernel` (``_slice_topk``, jitted or interpreted) as `launch`
    does; x [R, V] contiguous -> (values [R, k] float32, indices [R, k] int64)."""
    R, V = x.shape
    if V <= BLOCK:  # one slice: one pass
        values = torch.empty(R, k, dtype=torch.float32, device=x.device)
        indices = torch.empty(R, k, dtype=torch.int64, device=x.device)
        launch(kernel, (R, 1), x, values, indices, V, triton.next_power_of_2(V), k, values, 1,
               LSE_OWN if log_probs else LSE_NONE)
        return values, indices
    slices = triton.cdiv(V, BLOCK)
    vals = torch.empty(R, slices * k, dtype=torch.float32, device=x.device)  # [R, S*k] each slice's picks
    pos = torch.empty(R, slices * k, dtype=torch.int64, device=x.device)  # their columns in x
    sums = torch.empty(R, slices, 2, dtype=torch.float32, device=x.device) if log_probs else vals  # max, sum of exp
    launch(kernel, (R, slices), x, vals, pos, V, BLOCK, k, sums, slices, LSE_STATS if log_probs else LSE_NONE)
    values = torch.empty(R, k, dtype=torch.float32, device=x.device)
    pick = torch.empty(R, k, dtype=torch.int64, device=x.device)  # columns in vals
    launch(kernel, (R, 1), vals, values, pick, slices * k, triton.next_power_of_2(slices * k), k, sums, slices,
           LSE_WEIGHED if log_probs else LSE_NONE)
    return values, pos.gather(1, pick)


def launch(kernel, grid, x, values, positions, width, block, k, stats, slices, lse: int) -> None:
    """One pass: program (r, s) writes the k largest of x[r, s*block : (s+1)*block] (columns below
    width) at values/positions[r, s*k : (s+1)*k], largest first. lse: LSE_STATS also writes the
    slice's max and sum of exp(x - max) at stats[r, s]; LSE_WEIGHED subtracts the row's logsumexp,
    weighed from its `slices` slices' stats; LSE_OWN subtracts the slice's own (it is the row)."""
    kernel[grid](x, values, positions, stats, width, x.stride(0), values.stride(0), slices, K=k, BLOCK=block,
                 LSE=lse, SLICES=triton.next_power_of_2(slices))


if triton is not None:
    @triton.jit
    def _slice_topk(x_ptr, values_ptr, positions_ptr, stats_ptr, width, x_stride, out_stride, slices,
                    K: tl.constexpr, BLOCK: tl.constexpr, LSE: tl.constexpr, SLICES: tl.constexpr):
        row = tl.program_id(0)
        part = tl.program_id(1)
        lane = tl.arange(0, BLOCK)
        column = part * BLOCK + lane
        inside = column < width
        x = tl.load(x_ptr + row * x_stride + column, mask=inside, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))  # NaN ranks lowest: every pick stays a column of the row
        lse = 0.0  # what the values written lose: the row's logsumexp, for log-softmax values
        if LSE == 1 or LSE == 3:  # this slice's max and sum of exp(x - max) (a slice of -inf: -inf and 0)
            top = tl.max(x, axis=0)
            total = tl.sum(tl.exp(x - tl.where(top == float("-inf"), 0.0, top)), axis=0)
            if LSE == 1:  # the first of two passes: left for the second
                tl.store(stats_ptr + (row * slices + part) * 2, top)
                tl.store(stats_ptr + (row * slices + part) * 2 + 1, total)
            else:  # one pass: the slice is the row
                lse = top + tl.log(total)
        if LSE == 2:  # the second pass (x: the first's picks): the row's slices weighed together
            s = tl.arange(0, SLICES)
            tops = tl.load(stats_ptr + (row * slices + s) * 2, mask=s < slices, other=float("-inf"))
            sums = tl.load(stats_ptr + (row * slices + s) * 2 + 1, mask=s < slices, other=0.0)
            peak = tl.max(tops, axis=0)
            shift = tl.where(peak == float("-inf"), 0.0, peak)
            lse = shift + tl.log(tl.sum(sums * tl.exp(tops - shift), axis=0))
        taken = lane < 0  # none yet: a column is picked once, even among equal entries
        out = values_ptr + row * out_stride + part * K
        for i in tl.static_range(K):
            free = inside & ~taken
            best = tl.max(tl.where(free, x, float("-inf")), axis=0)
            at = tl.min(tl.where(free & (x == best), lane, BLOCK), axis=0)
            tl.store(out + i, best - lse)
            tl.store(positions_ptr + row * out_stride + part * K + i, (part * BLOCK + at).to(tl.int64))
            taken = taken | (lane == at)

    @torch.library.triton_op("speclens::row_topk", mutates_args=())
    def _row_topk_op(x: torch.Tensor, k: int, log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return two_pass_topk(x, k, torch.library.wrap_triton(_slice_topk), log_probs)
