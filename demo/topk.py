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


EXPAND_MAX_ENTRIES = 8192  # expand_topk's second pass holds the rows' first-pass picks in one program


def expand_topk(x: torch.Tensor, k: int, score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One depth of a draft tree: each frontier row's k children and the next frontier.

    x [R, V] the rows' logits; score [R] float32, each row's cumulative log q -> (log q [R, k]
    float32 and ids [R, k] int64, as ``row_topk(x, k, log_probs=True)``; best [k] int64, the flat
    indices row * k + j of the k largest score[row] + log q[row, j], largest first, lowest index
    first among equals, as ``row_topk`` over the [1, R * k] scores). On a GPU the second pass does
    both in one program: no launch for the scores and none for the frontier's own top-k."""
    R, V = x.shape
    width = triton.cdiv(V, BLOCK) * k if triton is not None else 0
    if (triton is not None and x.is_cuda and k <= min(32, V) and V > BLOCK
            and triton.next_power_of_2(R) * triton.next_power_of_2(width) <= EXPAND_MAX_ENTRIES):
        return torch.ops.speclens.expand_topk(x.contiguous(), k, score.float().contiguous())
    logq, ids = row_topk(x, k, log_probs=True)
    best = row_topk((score[:, None] + logq).view(1, R * k), k)[1].view(k)
    return logq, ids, best


def two_pass_expand(x: torch.Tensor, k: int, score: torch.Tensor, kernel, pick_kernel):
    """expand_topk's launches (jitted or interpreted): the first pass of `two_pass_topk` with the
    slices' log-softmax stats, then one ``_expand_pick`` program. x [R, V] contiguous, V > BLOCK."""
    R, V = x.shape
    slices = triton.cdiv(V, BLOCK)
    vals = torch.empty(R, slices * k, dtype=torch.float32, device=x.device)  # [R, S*k] each slice's picks
    pos = torch.empty(R, slices * k, dtype=torch.int64, device=x.device)  # their columns in x
    sums = torch.empty(R, slices, 2, dtype=torch.float32, device=x.device)  # max, sum of exp
    launch(kernel, (R, slices), x, vals, pos, V, BLOCK, k, sums, slices, LSE_STATS)
    logq = torch.empty(R, k, dtype=torch.float32, device=x.device)
    ids = torch.empty(R, k, dtype=torch.int64, device=x.device)
    best = torch.empty(k, dtype=torch.int64, device=x.device)
    pick_kernel[(1,)](vals, pos, sums, score, logq, ids, best, R, slices * k, slices, K=k,
                      R_P2=triton.next_power_of_2(R), W_P2=triton.next_power_of_2(slices * k),
                      SLICES=triton.next_power_of_2(slices), K_P2=triton.next_power_of_2(k))
    return logq, ids, best


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

    @triton.jit
    def _expand_pick(vals_ptr, pos_ptr, stats_ptr, score_ptr, logq_ptr, ids_ptr, best_ptr, R, width, slices,
                     K: tl.constexpr, R_P2: tl.constexpr, W_P2: tl.constexpr, SLICES: tl.constexpr,
                     K_P2: tl.constexpr):
        """The second pass over all R rows at once: each row's k largest of its slices' picks, as
        log-softmax values (the slices' stats weighed into the row's logsumexp, as LSE_WEIGHED),
        then the k largest of score[row] + those over every row, flat index row * K + j."""
        rows = tl.arange(0, R_P2)
        lane = tl.arange(0, W_P2)
        live = rows < R
        inside = live[:, None] & (lane < width)[None, :]
        x = tl.load(vals_ptr + rows[:, None] * width + lane[None, :], mask=inside, other=float("-inf"))
        x = tl.where(x == x, x, float("-inf"))  # [R_P2, W_P2]
        s = tl.arange(0, SLICES)
        lse = tl.zeros((R_P2,), dtype=tl.float32)  # [R_P2] each row's logsumexp, weighed row by row as
        for r in tl.static_range(R_P2):  # LSE_WEIGHED weighs it (the same reduction, the same bits)
            there = s < tl.where(r < R, slices, 0)  # no slices for a padding row
            tops = tl.load(stats_ptr + (r * slices + s) * 2, mask=there, other=float("-inf"))
            sums = tl.load(stats_ptr + (r * slices + s) * 2 + 1, mask=there, other=0.0)
            peak = tl.max(tops, axis=0)
            shift = tl.where(peak == float("-inf"), 0.0, peak)
            lse = tl.where(rows == r, shift + tl.log(tl.sum(sums * tl.exp(tops - shift), axis=0)), lse)
        j = tl.arange(0, K_P2)
        picks = tl.full((R_P2, K_P2), float("-inf"), dtype=tl.float32)  # each row's log q, largest first
        taken = (rows[:, None] < 0) & (lane[None, :] < 0)  # none yet
        for i in tl.static_range(K):
            free = inside & ~taken
            best = tl.max(tl.where(free, x, float("-inf")), axis=1)  # [R_P2]
            at = tl.min(tl.where(free & (x == best[:, None]), lane[None, :], W_P2), axis=1)
            tl.store(logq_ptr + rows * K + i, best - lse, mask=live)
            tl.store(ids_ptr + rows * K + i, tl.load(pos_ptr + rows * width + at, mask=live, other=0), mask=live)
            picks = tl.where(j[None, :] == i, (best - lse)[:, None], picks)
            taken = taken | (lane[None, :] == at[:, None])
        score = tl.load(score_ptr + rows, mask=live, other=0.0)
        valid = live[:, None] & (j < K)[None, :]
        total = tl.where(valid, score[:, None] + picks, float("-inf"))  # [R_P2, K_P2]
        flat = rows[:, None] * K + j[None, :]
        chosen = (rows[:, None] < 0) & (j[None, :] < 0)
        for i in tl.static_range(K):
            free = valid & ~chosen
            top = tl.max(tl.max(tl.where(free, total, float("-inf")), axis=1), axis=0)
            at = tl.min(tl.min(tl.where(free & (total == top), flat, R_P2 * K_P2 * 2), axis=1), axis=0)
            tl.store(best_ptr + i, at.to(tl.int64))
            chosen = chosen | (flat == at)

    @torch.library.triton_op("speclens::expand_topk", mutates_args=())
    def _expand_topk_op(x: torch.Tensor, k: int, score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return two_pass_expand(x, k, score, torch.library.wrap_triton(_slice_topk),
                               torch.library.wrap_triton(_expand_pick))

    @torch.library.triton_op("speclens::row_topk", mutates_args=())
    def _row_topk_op(x: torch.Tensor, k: int, log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return two_pass_topk(x, k, torch.library.wrap_triton(_slice_topk), log_probs)
