"""A Llama-family decoder layer's projections as fused Triton kernels, each row computed alike
whatever the forward's width (``demo.kernels.runtime`` "fused").

A decoding step of a small target is launch-bound: the default one's verification forward runs
about ten kernels a layer, most of them tiny. Here each projection is one kernel with what
surrounds it folded in:

    norm_qkv_rope      RMSNorm (the row's sum of squares in the same kernel), x @ W^T (+ bias) over
                       the stacked q/k/v weight, RoPE on q and k (a program takes both halves of a
                       head), k and v written into the cache at their slots; q comes back
    norm_linear        the same without RoPE (heads rope_fits refuses: under 32, or Qwen3's per-head
                       q/k norms), and the final norm with the head
    norm_gated         RMSNorm, then silu(x @ Wg^T) * (x @ Wu^T): the gate/up projection
    linear_residual    residual + x @ W^T: o_proj and down

so a layer is four launches and the attention's one or two (``demo.kernels.attend``). A program takes
block_m rows and a block of output columns and walks the input in block_k steps, always in the same
order, so a row's result never depends on how many rows run beside it (the property that lets a
1-row step and an 8-row verification compute a token alike in bf16; cuBLAS picks its kernel, and
with it the reduction order, by the row count). Every rounding to the tensor dtype that the eager
layer makes (the norm's cast before its weight, each linear's output, RoPE's products and sum,
silu's, the product's, the residual sum's) is made here too. norm_qkv_rope writes the caches in
place (the op says so, ``mutates_args``).

The projections are ``torch.library.triton_op``s: torch.compile sees their kernels. norm_qkv_rope,
which writes into the cache, is a plain ``custom_op``: the compiler never traces into it and
functionalizes its in-place writes as it does PyTorch's own (traced as a triton_op, a compiled
fused chain can give other tokens than eager; `tests/gpu/test_fused_gpu.py` holds a compiled fused
forward to eager's logits and cache, bit for bit). CUDA graphs capture them all. Triton's interpreter runs them
on a CPU for tests (TRITON_INTERPRET=1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from demo.kernels.runtime import HAVE_TRITON, triton_on

if HAVE_TRITON:
    import triton
    import triton.language as tl

MIN_PART = 16  # the narrowest block tl.dot takes
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Tiles:
    """How a projection is split among programs and steps. Every width runs the same tiles, and a
    row's arithmetic never depends on the rows beside it, so widths agree row for row whatever these
    are (block_k sets the order of the sums, and block_m may pick another tensor-core instruction:
    other tiles give other bits, alike at every width). A small target's projections have few output
    columns and a short input, so a program's time is its serial walk over the input; a wide
    verification runs more row tiles, each reading the same weights (the head's 56 MB for the
    default target, once per 16 rows). The defaults are the quickest in the decoding loop on a GPU:
    128-column input steps, at most three a program, so that a small projection's input is split
    among programs; the head, too wide to split, 64 columns a program, so that a wide verification
    reads its rows half as often (docs/PERFORMANCE.md, "Fused kernels")."""

    block_m: int = 16  # rows a program takes
    block_n: int = 32  # output columns a fused_linear program takes
    head_split: int = 1  # programs per q/k/v head in norm_qkv_rope, each taking 1/split of both halves
    num_warps: int = 4
    block_k: int = 128  # the input step (the norm's sum of squares and the multiply's)
    num_stages: int = 3  # Triton's software pipelining of the input loop
    steps: int = 3  # at most this many input steps a program (0: the whole input); a split input's
    # partial sums are added in split order by the tile's last program (input_splits, SPLIT_BELOW)
    wide_block_n: int = 64  # output columns a program takes in a projection too wide to split (the head)
    unroll_norm: int = 1  # 1: the norm's sum of squares unrolled over the input's steps, its loads issued at
    # once (the input's width compiled in; 7 % off a forward on the H200); 0: a loop. The same sums in the same order

    def __str__(self) -> str:
        default = Tiles()
        changed = [f"{k}={getattr(self, k)}" for k in self.__dataclass_fields__
                   if getattr(self, k) != getattr(default, k)]
        return ":".join(changed) or "default"


TILES = Tiles()  # the grid every launch reads (the bench's tile sweeps put others here, demo/bench/tools/perf_forward.py)
COUNTERS_AT_LEAST = 8192  # a weight's split counters: tiles enough for a 2,048-row prefill of the default target
SPLIT_BELOW = 256  # a projection of fewer column tiles than this splits its input (Tiles.steps): not the head


def fused_runs(x: torch.Tensor, act) -> bool:
    """Whether a layer over x ([B, q, H]) with activation `act` takes the fused kernels."""
    return triton_on(x) and x.dtype in DTYPES and act is F.silu


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [R, K] with a contiguous last dim (a view when it can be)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def norm_linear(x: torch.Tensor, norm, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K]; norm: an RMSNorm module (weight [K], variance_epsilon); weight [N, K]; bias [N] or
    None -> [..., N]: linear(rms_norm(x)), as demo.layers computes them."""
    out = torch.ops.speclens.fused_linear(_rows(x), norm.weight, float(norm.variance_epsilon), weight, bias, None, False)
    return out.view(*x.shape[:-1], weight.shape[0])


def norm_gated(x: torch.Tensor, norm, gate_up: torch.Tensor) -> torch.Tensor:
    """x [..., K]; gate_up [2N, K] (gate rows, then up rows) -> [..., N]: silu(gate(n)) * up(n), n = rms_norm(x)."""
    out = torch.ops.speclens.fused_linear(_rows(x), norm.weight, float(norm.variance_epsilon), gate_up, None, None, True)
    return out.view(*x.shape[:-1], gate_up.shape[0] // 2)


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x [..., K]; weight [N, K]; residual [..., N] -> residual + linear(x)."""
    out = torch.ops.speclens.fused_linear(_rows(x), None, 0.0, weight, None, _rows(residual), False)
    return out.view(residual.shape)


def rope_fits(head_dim: int, q_norm) -> bool:
    """Whether norm_qkv_rope takes a layer: RoPE over two halves of a power-of-two head of at least 32
    (``tl.dot`` takes 16-wide blocks), and no per-head q/k norms (Qwen3's) between projection and RoPE."""
    return q_norm is None and head_dim >= 32 and head_dim & (head_dim - 1) == 0


def norm_qkv_rope(x: torch.Tensor, norm, weight: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor,
                  sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int) -> torch.Tensor:
    """The attention's input in one launch: rms_norm(x) through the stacked q/k/v weight, RoPE on q
    and k, k and v written into the caches at `slots`. x [B, q, H]; weight [(nh + 2 nkv) hd, H];
    cos, sin [B, 1, q, hd]; slots [B, q]; k_cache, v_cache [B, nkv, S, hd] (written in place)
    -> q [B, q, nh, hd], rotated."""
    B, M, _ = x.shape
    hd = k_cache.shape[-1]
    q = torch.ops.speclens.norm_qkv_rope(_rows(x), norm.weight, float(norm.variance_epsilon), weight, bias,
                                         cos.reshape(B * M, hd), sin.reshape(B * M, hd), slots.reshape(-1),
                                         k_cache, v_cache, num_heads, M)
    return q.view(B, M, num_heads, hd)


def launch_qkv_rope(x, norm_weight, eps, weight, bias, cos, sin, slots, k_cache, v_cache, num_heads, rows_per_batch,
                    kernel) -> torch.Tensor:
    """One launch of `kernel` (``_qkv_rope``): shapes as norm_qkv_rope's, rows flattened -> q [R, nh, hd]."""
    R, K = x.shape
    nkv, hd = k_cache.shape[1], k_cache.shape[3]
    q = torch.empty(R, num_heads, hd, dtype=x.dtype, device=x.device)
    split = max(1, min(TILES.head_split, hd // 2 // MIN_PART))
    tiles = (triton.cdiv(R, TILES.block_m), (num_heads + 2 * nkv) * split)
    splits, chunk = input_splits(K, tiles[1])
    if splits > 1:  # each split's sums of the stacked q/k/v columns, and a count per tile of the splits done
        partial = torch.empty(splits, R, weight.shape[0], dtype=torch.float32, device=x.device)
        done = split_counters(weight, tiles[0] * tiles[1])
    else:
        partial, done = q, q  # unused
    kernel[(*tiles, splits)](x, norm_weight, weight, x if bias is None else bias, cos, sin, slots, k_cache, v_cache,
                             q, partial, done, R, K, chunk, eps, rows_per_batch, num_heads, nkv, x.stride(0),
                             weight.stride(0), cos.stride(0), sin.stride(0), k_cache.stride(0), k_cache.stride(1),
                             k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                             BIAS=bias is not None, HALF=hd // 2, PART=hd // 2 // split, SPLITS=splits,
                             BLOCK_M=TILES.block_m, BLOCK_K=TILES.block_k, IEEE=x.dtype == torch.float32,
                             NORM_K=K * TILES.unroll_norm, num_warps=TILES.num_warps, num_stages=TILES.num_stages)
    return q


def input_splits(K: int, column_tiles: int) -> tuple[int, int]:
    """(splits, chunk): how many programs share a tile's input of K columns, and the columns each takes
    (a multiple of block_k): one, unless Tiles.steps asks for fewer steps a program and a row of tiles
    holds fewer than SPLIT_BELOW. The rows never count: a split sums in another order, so a 97-row
    verification that did not split (it has enough tiles without) would round its rows otherwise
    than a 1-row step that does."""
    steps = triton.cdiv(K, TILES.block_k)
    splits = triton.cdiv(steps, TILES.steps) if TILES.steps and column_tiles < SPLIT_BELOW else 1
    chunk = triton.cdiv(steps, splits) * TILES.block_k
    return triton.cdiv(K, chunk), chunk


def split_counters(weight: torch.Tensor, tiles: int) -> torch.Tensor:
    """[tiles] int32 zeros: how many of a tile's splits are done, for a launch over `weight` whose
    input is split. Each tile's last split sets its count back to zero (``_last_split``), so the
    buffer kept beside the weight is zeros again after every launch, and a step launches no memset
    for it (a zeroing launch per split projection was 121 of a verification's 316 launches on the
    default target). Launches over one weight run one after another on a stream, as one model's
    steps do (its caches allow no other). A buffer is never freed while its weight lives: captured
    graphs keep its address. A new one while torch.compile traces (its tensors are not the ones
    that run), and while a capture is under way if none kept is large enough (an allocation there
    would live in the graph's pool)."""
    if torch.compiler.is_compiling():
        return torch.zeros(tiles, dtype=torch.int32, device=weight.device)
    kept = getattr(weight, "_speclens_split_counters", None)
    if kept and kept[-1].numel() >= tiles:
        return kept[-1][:tiles]
    if weight.is_cuda and torch.cuda.is_current_stream_capturing():
        return torch.zeros(tiles, dtype=torch.int32, device=weight.device)
    if kept is None:
        kept = weight._speclens_split_counters = []
    kept.append(torch.zeros(max(tiles, COUNTERS_AT_LEAST), dtype=torch.int32, device=weight.device))
    return kept[-1][:tiles]


def launch_fused_linear(x, norm_weight, eps, weight, bias, residual, gated, kernel) -> torch.Tensor:
    """One launch of `kernel` (``_fused_linear``, jitted or interpreted): x [R, K]; norm_weight [K] or
    None; weight [N or 2N, K]; bias [N] or None; residual [R, N] or None -> [R, N] of x's dtype."""
    R, K = x.shape
    N = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty(R, N, dtype=x.dtype, device=x.device)
    wide = triton.cdiv(N, TILES.block_n) >= SPLIT_BELOW  # too wide to split its input (the head): its own tiles
    block_n = TILES.wide_block_n if wide else TILES.block_n
    tiles = (triton.cdiv(R, TILES.block_m), triton.cdiv(N, block_n))
    splits, chunk = input_splits(K, triton.cdiv(N, TILES.block_n))
    if splits > 1:  # each split's partial sums, and a count per tile of the splits done
        partial = torch.empty(splits, R, 2 * N if gated else N, dtype=torch.float32, device=x.device)
        done = split_counters(weight, tiles[0] * tiles[1])
    else:
        partial, done = out, out  # unused
    kernel[(*tiles, splits)](x, x if norm_weight is None else norm_weight, weight, x if bias is None else bias,
                             x if residual is None else residual, out, partial, done, R, K, N, chunk, eps,
                             x.stride(0), weight.stride(0), 0 if residual is None else residual.stride(0),
                             out.stride(0), NORM=norm_weight is not None, BIAS=bias is not None, GATED=gated,
                             RESIDUAL=residual is not None, SPLITS=splits, BLOCK_M=TILES.block_m,
                             BLOCK_N=block_n, BLOCK_K=TILES.block_k, IEEE=x.dtype == torch.float32,
                             NORM_K=K * TILES.unroll_norm if norm_weight is not None else 0,
                             num_warps=TILES.num_warps, num_stages=TILES.num_stages)
    return out


if HAVE_TRITON:
    @triton.jit
    def _inv_rms(x_rows, live, K, eps: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                 NORM_K: tl.constexpr):
        """[BLOCK_M] 1 / the RMS of each row, its sum of squares taken in fp32 in BLOCK_K steps, in a
        loop, or unrolled where NORM_K (= K) is given: a step's loads then wait for no earlier step."""
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if NORM_K > 0:
            for start in tl.static_range(0, NORM_K, BLOCK_K):
                k = start + tl.arange(0, BLOCK_K)
                xv = tl.load(x_rows + k[None, :], mask=live[:, None] & (k < NORM_K)[None, :], other=0.0).to(tl.float32)
                squares += tl.sum(xv * xv, axis=1)
        else:
            for start in range(0, K, BLOCK_K):
                k = start + tl.arange(0, BLOCK_K)
                xv = tl.load(x_rows + k[None, :], mask=live[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
                squares += tl.sum(xv * xv, axis=1)
        return tl.rsqrt(squares / K + eps)

    @triton.jit
    def _normed(xv, norm_ptr, k, inside, inv):
        """rms_norm of a [BLOCK_M, BLOCK_K] block: (x / RMS) cast to x's dtype, times the weight, rounded."""
        nw = tl.load(norm_ptr + k, mask=inside, other=0.0).to(tl.float32)
        return (nw[None, :] * (xv.to(tl.float32) * inv[:, None]).to(xv.dtype).to(tl.float32)).to(xv.dtype)

    @triton.jit
    def _weight_tile(w_ptr, cols, w_stride, k, mask):
        """Columns `cols` and inputs `k` of a [N, K] weight, as a [BLOCK_K, cols] tile for x @ W^T."""
        return tl.load(w_ptr + cols[None, :] * w_stride + k[:, None], mask=mask, other=0.0)

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        """a @ b accumulated in fp32; fp32 inputs multiplied as fp32 (not TF32)."""
        if IEEE:
            out = tl.dot(a, b, input_precision="ieee")
        else:
            out = tl.dot(a, b)
        return out

    @triton.jit
    def _fused_linear(x_ptr, norm_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, partial_ptr, done_ptr, R, K, N, chunk,
                      eps: tl.constexpr, x_stride, w_stride, res_stride, out_stride,
                      NORM: tl.constexpr, BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                      SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      IEEE: tl.constexpr, NORM_K: tl.constexpr):
        _linear_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2),
                     tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), x_ptr, norm_ptr, w_ptr, bias_ptr,
                     res_ptr, out_ptr, partial_ptr, done_ptr, R, K, N, chunk, eps, x_stride, w_stride, res_stride,
                     out_stride, NORM, BIAS, GATED, RESIDUAL, SPLITS, BLOCK_M, BLOCK_N, BLOCK_K, IEEE, NORM_K)

    @triton.jit
    def _linear_tile(row_tile, col_tile, split, tile, x_ptr, norm_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, partial_ptr,
                     done_ptr, R, K, N, chunk, eps: tl.constexpr, x_stride, w_stride, res_stride, out_stride,
                     NORM: tl.constexpr, BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                     SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     IEEE: tl.constexpr, NORM_K: tl.constexpr):
        """One program's share of a fused projection: rows `row_tile`, columns `col_tile`, the input's
        split `split` ([split * chunk, (split + 1) * chunk)); `tile` indexes its split counter. What
        _fused_linear's program (row_tile, col_tile, split) does, and demo.kernels.persistent's tasks."""
        rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        live = rows < R
        used = cols < N
        x_rows = x_ptr + rows[:, None] * x_stride
        if NORM:  # the whole row's sum of squares, whatever part of the input this program takes
            inv = _inv_rms(x_rows, live, K, eps, BLOCK_M, BLOCK_K, NORM_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(split * chunk, tl.minimum(split * chunk + chunk, K), BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            inside = k < K
            xv = tl.load(x_rows + k[None, :], mask=live[:, None] & inside[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            if NORM:
                xv = _normed(xv, norm_ptr, k, inside, inv)
            tile_mask = used[None, :] & inside[:, None]
            acc += _dot(xv, _weight_tile(w_ptr, cols, w_stride, k, tile_mask), IEEE)
            if GATED:  # the up half of the stacked gate/up weight
                up += _dot(xv, _weight_tile(w_ptr, N + cols, w_stride, k, tile_mask), IEEE)
        if SPLITS == 1:
            _finish(acc, up, rows, cols, live, used, bias_ptr, res_ptr, out_ptr, res_stride, out_stride,
                    BIAS, GATED, RESIDUAL)
        else:  # leave this split's sums; the tile's last split to finish adds them all, in split order
            width = 2 * N if GATED else N
            at = partial_ptr + rows[:, None] * width + cols[None, :]  # split 0's [BLOCK_M, BLOCK_N]
            where = live[:, None] & used[None, :]
            tl.store(at + split * R * width, acc, mask=where)
            if GATED:
                tl.store(at + split * R * width + N, up, mask=where)
            if _last_split(done_ptr, tile, SPLITS):
                acc = _split_sum(at, R * width, where, SPLITS)
                if GATED:
                    up = _split_sum(at + N, R * width, where, SPLITS)
                _finish(acc, up, rows, cols, live, used, bias_ptr, res_ptr, out_ptr, res_stride, out_stride,
                        BIAS, GATED, RESIDUAL)

    @triton.jit
    def _last_split(done_ptr, tile, SPLITS: tl.constexpr):
        """Called once a program has stored its split's sums for `tile`: whether it is the last of
        the tile's splits to get here (done_ptr counts them per tile, from zero), and so may read
        them all. The last sets the count back to zero for the next launch (split_counters): every
        split of the tile has counted by then, and the launch ends before the next one reads it."""
        tl.debug_barrier()  # every thread's stores before the count
        last = tl.atomic_add(done_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
        if last:
            tl.atomic_xchg(done_ptr + tile, 0, sem="relaxed", scope="gpu")
        tl.debug_barrier()  # the count read before any thread reads the others' sums
        return last

    @triton.jit
    def _split_sum(ptrs, split_stride, mask, SPLITS: tl.constexpr):
        """The splits' sums at ptrs (split s's at ptrs + s * split_stride), added in split order."""
        total = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        for s in range(1, SPLITS):
            total += tl.load(ptrs + s * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
        return total

    @triton.jit
    def _finish(acc, up, rows, cols, live, used, bias_ptr, res_ptr, out_ptr, res_stride, out_stride,
                BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr):
        """A tile's output from its fp32 sums: + bias, rounded; silu(gate) * up; + residual; stored."""
        dt = out_ptr.dtype.element_ty
        if BIAS:
            acc += tl.load(bias_ptr + cols, mask=used, other=0.0).to(tl.float32)[None, :]
        y = acc.to(dt).to(tl.float32)
        if GATED:  # silu(gate) * up, each rounded to the dtype as eager rounds it
            act = (y / (1.0 + tl.exp(-y))).to(dt).to(tl.float32)
            y = (act * up.to(dt).to(tl.float32)).to(dt).to(tl.float32)
        if RESIDUAL:
            r = tl.load(res_ptr + rows[:, None] * res_stride + cols[None, :], mask=live[:, None] & used[None, :],
                        other=0.0).to(tl.float32)
            y = r + y
        tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], y.to(dt), mask=live[:, None] & used[None, :])

    @triton.jit
    def _qkv_rope(x_ptr, norm_ptr, w_ptr, bias_ptr, cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, q_ptr, partial_ptr,
                  done_ptr, R, K, chunk, eps: tl.constexpr, M, NH, NKV, x_stride, w_stride, cos_stride, sin_stride,
                  k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                  BIAS: tl.constexpr, HALF: tl.constexpr, PART: tl.constexpr, SPLITS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, NORM_K: tl.constexpr):
        _qkv_rope_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2),
                       tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), x_ptr, norm_ptr, w_ptr, bias_ptr,
                       cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, q_ptr, partial_ptr, done_ptr, R, K, chunk, eps, M,
                       NH, NKV, x_stride, w_stride, cos_stride, sin_stride, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                       BIAS, HALF, PART, SPLITS, BLOCK_M, BLOCK_K, IEEE, NORM_K)

    @triton.jit
    def _qkv_rope_tile(row_tile, head_part, split, tile, x_ptr, norm_ptr, w_ptr, bias_ptr, cos_ptr, sin_ptr, slot_ptr,
                       k_ptr, v_ptr, q_ptr, partial_ptr, done_ptr, R, K, chunk, eps: tl.constexpr, M, NH, NKV,
                       x_stride, w_stride, cos_stride, sin_stride, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                       BIAS: tl.constexpr, HALF: tl.constexpr, PART: tl.constexpr, SPLITS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, NORM_K: tl.constexpr):
        """One program's share of norm_qkv_rope: rows `row_tile`, part `head_part` of a head (q heads,
        then k, then v), the input's split `split`; `tile` indexes its split counter. What
        _qkv_rope's program (row_tile, head_part, split) does, and demo.kernels.persistent's tasks."""
        rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        head = head_part // (HALF // PART)  # q heads, then k heads, then v heads: the stacked weight's order
        half = (head_part % (HALF // PART)) * PART + tl.arange(0, PART)  # this program's columns of a half
        live = rows < R
        first = head * 2 * HALF + half  # the same columns of the head's two halves
        second = first + HALF
        x_rows = x_ptr + rows[:, None] * x_stride
        inv = _inv_rms(x_rows, live, K, eps, BLOCK_M, BLOCK_K, NORM_K)
        a = tl.zeros((BLOCK_M, PART), dtype=tl.float32)
        b = tl.zeros((BLOCK_M, PART), dtype=tl.float32)
        for start in range(split * chunk, tl.minimum(split * chunk + chunk, K), BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            inside = k < K
            xv = _normed(tl.load(x_rows + k[None, :], mask=live[:, None] & inside[None, :], other=0.0), norm_ptr, k,
                         inside, inv)
            a += _dot(xv, _weight_tile(w_ptr, first, w_stride, k, inside[:, None]), IEEE)
            b += _dot(xv, _weight_tile(w_ptr, second, w_stride, k, inside[:, None]), IEEE)
        if SPLITS == 1:
            _rope_store(a, b, rows, half, first, second, live, head, bias_ptr, cos_ptr, sin_ptr, slot_ptr, k_ptr,
                        v_ptr, q_ptr, M, NH, NKV, cos_stride, sin_stride, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                        BIAS, HALF)
        else:  # leave this split's sums; the tile's last split to finish adds them all, in split order
            width = (NH + 2 * NKV) * 2 * HALF
            at = partial_ptr + rows[:, None] * width  # split 0's rows
            tl.store(at + split * R * width + first[None, :], a, mask=live[:, None])
            tl.store(at + split * R * width + second[None, :], b, mask=live[:, None])
            if _last_split(done_ptr, tile, SPLITS):
                a = _split_sum(at + first[None, :], R * width, live[:, None], SPLITS)
                b = _split_sum(at + second[None, :], R * width, live[:, None], SPLITS)
                _rope_store(a, b, rows, half, first, second, live, head, bias_ptr, cos_ptr, sin_ptr, slot_ptr, k_ptr,
                            v_ptr, q_ptr, M, NH, NKV, cos_stride, sin_stride, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                            BIAS, HALF)

    @triton.jit
    def _rope_store(a, b, rows, half, first, second, live, head, bias_ptr, cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr,
                    q_ptr, M, NH, NKV, cos_stride, sin_stride, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                    BIAS: tl.constexpr, HALF: tl.constexpr):
        """A head's two halves from their fp32 sums: + bias, rounded; RoPE on q and k; q stored, k and v
        written into the caches at the rows' slots."""
        dt = q_ptr.dtype.element_ty
        if BIAS:
            a += tl.load(bias_ptr + first).to(tl.float32)[None, :]
            b += tl.load(bias_ptr + second).to(tl.float32)[None, :]
        a = a.to(dt).to(tl.float32)  # the projection's output, rounded as eager rounds it
        b = b.to(dt).to(tl.float32)
        if head < NH + NKV:  # RoPE (rotate-half): [a, b] * cos + [-b, a] * sin, each product and sum rounded
            c1 = tl.load(cos_ptr + rows[:, None] * cos_stride + half[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + rows[:, None] * cos_stride + HALF + half[None, :], mask=live[:, None],
                         other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + rows[:, None] * sin_stride + half[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + rows[:, None] * sin_stride + HALF + half[None, :], mask=live[:, None],
                         other=0.0).to(tl.float32)
            ra = ((a * c1).to(dt).to(tl.float32) + (-b * s1).to(dt).to(tl.float32)).to(dt)
            rb = ((b * c2).to(dt).to(tl.float32) + (a * s2).to(dt).to(tl.float32)).to(dt)
        else:
            ra = a.to(dt)
            rb = b.to(dt)
        if head < NH:
            out = q_ptr + (rows[:, None] * NH + head) * 2 * HALF + half[None, :]
            tl.store(out, ra, mask=live[:, None])
            tl.store(out + HALF, rb, mask=live[:, None])
        else:
            slot = tl.load(slot_ptr + rows, mask=live, other=0)
            batch = rows // M
            if head < NH + NKV:
                out = k_ptr + batch[:, None] * k_sb + (head - NH) * k_sh + slot[:, None] * k_ss + half[None, :]
            else:
                out = v_ptr + batch[:, None] * v_sb + (head - NH - NKV) * v_sh + slot[:, None] * v_ss + half[None, :]
            tl.store(out, ra, mask=live[:, None])
            tl.store(out + HALF, rb, mask=live[:, None])

    @torch.library.custom_op("speclens::norm_qkv_rope", mutates_args=("k_cache", "v_cache"))
    def _qkv_rope_op(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                     bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, rows_per_batch: int) -> torch.Tensor:
        return launch_qkv_rope(x, norm_weight, eps, weight, bias, cos, sin, slots, k_cache, v_cache, num_heads,
                               rows_per_batch, _qkv_rope)

    @_qkv_rope_op.register_fake
    def _qkv_rope_fake(x, norm_weight, eps, weight, bias, cos, sin, slots, k_cache, v_cache, num_heads, rows_per_batch):
        return x.new_empty(x.shape[0], num_heads, k_cache.shape[-1])

    @torch.library.triton_op("speclens::fused_linear", mutates_args=())
    def _fused_linear_op(x: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, weight: torch.Tensor,
                         bias: torch.Tensor | None, residual: torch.Tensor | None, gated: bool) -> torch.Tensor:
        return launch_fused_linear(x, norm_weight, eps, weight, bias, residual, gated,
                                   torch.library.wrap_triton(_fused_linear))
