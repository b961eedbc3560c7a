"""Every decoder layer of a decoding step's forward in one persistent launch (``demo.kernels.runtime``
"persistent").

The fused path (``demo.kernels.fused``, ``demo.kernels.attend``) runs a layer as five or six
launches: the default target's 8-row verification is 196 kernels, each too small to fill the GPU,
with a gap between each two. Here one grid of programs, resident for the whole forward, walks all
the layers: each stage of a layer (norm + q/k/v + RoPE + the cache write; attention; o_proj +
residual; norm + gate/up + SiLU; down + residual; where attention takes several slot splits,
their combination) is a list of tasks, task t taken by program t mod G, and the programs meet at
a barrier (a counter in global memory) before the next stage reads what the last one wrote. A task
is exactly one program of the fused path's launch, the same ``@triton.jit`` function with the same
tiles (``_linear_tile``, ``_qkv_rope_tile``, ``_attend_tile``, ``_combine_row``), so each row's
arithmetic, and with it every bit, is the fused path's: rows alike at any width (a bf16 tree emits
1-row target-only's tokens), logits equal to the fused path's (tests/kernels/test_persistent.py).

Programs wait for each other, so all of them must be resident at once: the grid is one program a
multiprocessor (``Grid.per_sm``: more, never more than the multiprocessors hold together by the
compiled kernel's registers, threads and shared memory, ``resident``), and no more than the widest
stage has tasks (a program without a task only waits). A kernel running beside it on another
stream only delays the programs it keeps off a multiprocessor until its own end. Triton's
interpreter runs the programs one after another: there the grid is one program, which
takes every task in order and never waits.

The layers' weights are read from stacked [L, ...] tensors (``LayerStack``): each layer's modules
keep views of them, so nothing is stored twice and a layer's weights sit at base + layer x stride,
aligned as the kernels' vector loads need. A layer is five stages, five barriers, and six where
attention takes several slot splits (a cache of more than 128 slots): their combination is a stage.

Only forwards that attend in slot order take it (a decoding step's, at most
``demo.kernels.attend.ORDERED_ROWS`` rows); a prefill runs the fused layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from demo.kernels import attend as attend_kernels
from demo.kernels import fused
from demo.kernels.runtime import HAVE_TRITON, INTERPRETED

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from demo.kernels.attend import _attend_tile, _combine_row
    from demo.kernels.fused import _linear_tile, _qkv_rope_tile

COUNTERS = 8192  # split counters: enough tiles for 256 rows (16 row tiles) of a projection 16,384 columns wide


@dataclass(frozen=True)
class Grid:
    """How the persistent launch runs. `per_sm`: programs a multiprocessor, at most (0: as many as it
    holds at once), never more than it holds; the interpreter always runs one program. One, the
    default: more measured within 2 % of it at 1 and 8 rows (docs/runs/2026-12-06-persistent-stages.md).
    `prefetch` 1: as a layer starts, each program asks L2 for its share of the next layer's weights
    (the first layer's as the launch starts), so that a stage's chain of dependent weight reads
    waits on L2, not on memory (a layer of the default target is 7 MB of L2's 50; 6 % off a 1-row
    forward, 3 % off 8 rows on the H100); 2: the next layer's attended K/V slots too (the attention
    stage 4.8 to 4.5 us). No value changes.
    `max_rows`: a forward of more rows runs the fused kernels, which were quicker at 64 tree rows
    (their programs spread a wide stage over the whole GPU; here a program takes its tasks in turn).
    `trace` 1 (the bench's): every program's clock at each stage's end and barrier, kept in TRACES."""

    per_sm: int = 1
    prefetch: int = 2
    max_rows: int = 16
    trace: int = 0

    def __str__(self) -> str:
        default = Grid()
        changed = [f"{k}={getattr(self, k)}" for k in self.__dataclass_fields__
                   if getattr(self, k) != getattr(default, k)]
        return ":".join(changed) or "default"


GRID = Grid()  # the grid every launch reads (the bench may set another)


@dataclass
class LayerStack:
    """The decoder layers' weights stacked layer by layer, each layer's modules viewing its slice."""

    norm1: torch.Tensor  # [L, H] input_layernorm
    qkv: torch.Tensor  # [L, (nh + 2 nkv) hd, H] q, k and v stacked
    qkv_bias: torch.Tensor | None  # [L, (nh + 2 nkv) hd]
    o: torch.Tensor  # [L, H, nh hd]
    norm2: torch.Tensor  # [L, H] post_attention_layernorm
    gate_up: torch.Tensor  # [L, 2 I, H] gate rows, then up rows
    down: torch.Tensor  # [L, H, I]
    eps1: float
    eps2: float
    counters: torch.Tensor  # [COUNTERS] int32 zeros: the split counts (each stage's last splits reset theirs)
    barrier: torch.Tensor  # [1] int32 zero: the stage barrier's count (the launch's last program resets it)


def stack_layers(layers: list[dict]) -> LayerStack:
    """Stack the layers' weights and point each layer's tensors at their slice. `layers`: per layer a
    dict of norm1, qkv (a demo.layers.StackedLinear), o, norm2, gate_up (a StackedLinear), down, the
    norms as RMSNorm modules and o and down as Linear modules."""
    first = layers[0]
    qkv_bias = first["qkv"].bias is not None
    with torch.inference_mode(False), torch.no_grad():
        stack = LayerStack(
            norm1=torch.stack([p["norm1"].weight for p in layers]),
            qkv=torch.stack([p["qkv"].weight for p in layers]),
            qkv_bias=torch.stack([p["qkv"].bias for p in layers]) if qkv_bias else None,
            o=torch.stack([p["o"].weight for p in layers]),
            norm2=torch.stack([p["norm2"].weight for p in layers]),
            gate_up=torch.stack([p["gate_up"].weight for p in layers]),
            down=torch.stack([p["down"].weight for p in layers]),
            eps1=float(first["norm1"].variance_epsilon), eps2=float(first["norm2"].variance_epsilon),
            counters=torch.zeros(COUNTERS, dtype=torch.int32, device=first["o"].weight.device),
            barrier=torch.zeros(1, dtype=torch.int32, device=first["o"].weight.device))
        for i, p in enumerate(layers):
            p["norm1"].weight.data = stack.norm1[i]
            p["norm2"].weight.data = stack.norm2[i]
            p["o"].weight.data = stack.o[i]
            p["down"].weight.data = stack.down[i]
            p["qkv"].rehome(stack.qkv[i], stack.qkv_bias[i] if qkv_bias else None)
            p["gate_up"].rehome(stack.gate_up[i], None)
    return stack


def stack_current(stack: LayerStack, layers: dict[int, dict]) -> bool:
    """Whether the layers still read their weights from `stack` (a ``.to()`` or a replaced ``.data``
    gives a module new storage). `layers`: layer id -> its parts as stack_layers takes them, for the
    layers to check (the first and the last say whether the model's weights moved)."""
    for i, p in layers.items():
        pairs = ((p["norm1"].weight, stack.norm1[i]), (p["norm2"].weight, stack.norm2[i]), (p["o"].weight, stack.o[i]),
                 (p["down"].weight, stack.down[i]), (p["qkv"].weight, stack.qkv[i]),
                 (p["gate_up"].weight, stack.gate_up[i]))
        if any(a.data_ptr() != b.data_ptr() or a.dtype != b.dtype for a, b in pairs) or not p["qkv"].current() \
                or not p["gate_up"].current():
            return False
    return True


def fits(stack: LayerStack, rows: int, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether a forward of `rows` query rows takes the persistent launch over `stack`: at most
    Grid.max_rows of them, the attention's rows in slot order (one query row's heads in one program),
    and the split counters enough for every stage's tiles."""
    if rows > min(GRID.max_rows, attend_kernels.ORDERED_ROWS) or num_heads // num_kv_heads > attend_kernels.BLOCK_M:
        return False
    t = fused.TILES
    row_tiles = -(-rows // t.block_m)
    widest = max(stack.gate_up.shape[1] // 2, stack.o.shape[1], stack.down.shape[1])
    heads = (num_heads + 2 * num_kv_heads) * max(1, min(t.head_split, head_dim // 2 // fused.MIN_PART))
    return row_tiles * max(-(-widest // t.block_n), heads) <= COUNTERS


def persistent_layers(x: torch.Tensor, stack: LayerStack, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Every layer over x [B, q, H] in one launch. cos, sin [B, 1, q, hd]; slots [B, q] (where each
    row's K/V is written); k_cache, v_cache [L, B, nkv, S, hd], written in place (S: the slots
    attended over, a view of the cache's first ones); mask [B, 1, q, S] int32, each row's seen slots
    in order (demo.kernels.attend.seen_slots) -> [L, B, q, H], the residual stream each layer leaves."""
    B, M, H = x.shape
    hd = k_cache.shape[-1]
    out = torch.ops.speclens.layers(
        x.reshape(B * M, H), stack.norm1, stack.qkv, stack.qkv_bias, stack.o, stack.norm2, stack.gate_up, stack.down,
        stack.counters, stack.barrier, cos.reshape(B * M, hd), sin.reshape(B * M, hd), slots.reshape(-1),
        k_cache, v_cache, mask if mask.stride(-1) == 1 else mask.contiguous(), num_heads, stack.eps1, stack.eps2, M)
    return out.view(stack.o.shape[0], B, M, H)


def resident(compiled, device: torch.device) -> int:
    """How many programs of a compiled Triton kernel one multiprocessor of `device` holds at once, by
    its registers (allocated 8 a thread at a time), its threads and its shared memory (with the 1 KB
    the driver reserves a program)."""
    props = torch.cuda.get_device_properties(device)
    compiled._init_handles()  # loads the binary: n_regs is known from then on
    threads = 32 * compiled.metadata.num_warps
    by_regs = props.regs_per_multiprocessor // (-(-max(compiled.n_regs, 1) // 8) * 8 * threads)
    by_threads = props.max_threads_per_multi_processor // threads
    by_shared = props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024)
    return max(1, min(by_regs, by_threads, by_shared, 32))


def programs(kernel, args: tuple, kwargs: dict, device: torch.device, tasks: int) -> int:
    """The persistent grid: as many programs as the multiprocessors hold together (at most
    Grid.per_sm each) and the widest stage has tasks; one in the interpreter."""
    if INTERPRETED:
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if GRID.per_sm == 1:  # a program a multiprocessor always fits: no need to ask the compiled kernel
        return max(1, min(tasks, sms))
    compiled = kernel.warmup(*args, grid=(1,), **kwargs)  # the binary these arguments launch (compiled once)
    if id(compiled) not in _RESIDENT:
        _RESIDENT[id(compiled)] = (compiled, resident(compiled, device))  # the kernel kept: its id stays its own
    held = _RESIDENT[id(compiled)][1]
    per_sm = min(held, GRID.per_sm) if GRID.per_sm else held
    return max(1, min(tasks, per_sm * sms))


def prefetching(k_cache: torch.Tensor, v_cache: torch.Tensor, *weights: torch.Tensor) -> int:
    """What the launch prefetches of each next layer (Grid.prefetch): 0 nothing, 1 its weights, 2 its
    weights and its attended K/V; on a GPU, where four layers of these stacked [L, ...] weights fit in
    its L2 (an 8B model's layer, 436 MB, would only push the current one's out), the K/V where a
    head's slots lie in one run ([L, B, nkv, S, hd], hd contiguous)."""
    if not GRID.prefetch or INTERPRETED:
        return 0
    layer = sum(w[0].numel() * w.element_size() for w in weights)
    if 4 * layer > torch.cuda.get_device_properties(weights[0].device).L2_cache_size:
        return 0
    runs = all(c.stride(3) == c.shape[4] and c.stride(4) == 1 for c in (k_cache, v_cache))
    return GRID.prefetch if runs else 1


TRACES: list[torch.Tensor] = []  # Grid.trace's records, [G, stages + 1, 2] int64 a launch (demo.bench.tools.perf_forward)
_NO_TRACE: dict[torch.device, torch.Tensor] = {}  # the trace argument of an untraced launch, a device
_RESIDENT: dict[int, tuple] = {}  # id of a compiled kernel -> (it, programs a multiprocessor holds)
_PF_BLOCK = 512  # cache lines a program asks L2 for at once


def stage_names(layers: int, stages: int) -> list[str]:
    """The name of each stage of a launch of `stages` over `layers` layers, in order (a combination
    stage in each layer where the attention took several slot splits)."""
    one = ["q/k/v", "attention", "o_proj", "gate/up", "down"]
    if stages == 6 * layers:
        one.insert(2, "combination")
    return one * layers


def launch_layers(x, norm1, qkv, qkv_bias, o, norm2, gate_up, down, counters, barrier, cos, sin, slots, k_cache,
                  v_cache, mask, num_heads, eps1, eps2, rows_per_batch, kernel) -> torch.Tensor:
    """One launch of `kernel` (``_layers``): shapes as persistent_layers' with the rows flattened
    (x [R, H], cos, sin [R, hd], slots [R]) -> [L, R, H]."""
    R, H = x.shape
    L, NQKV, _ = qkv.shape
    I = gate_up.shape[1] // 2
    _, B, nkv, _, hd = k_cache.shape
    S = mask.shape[-1]  # the slots attended over (k_cache may hold more)
    M = rows_per_batch
    t = fused.TILES
    split = max(1, min(t.head_split, hd // 2 // fused.MIN_PART))
    nhd = num_heads * hd

    def cols(N):  # the fused path's output tiles of a projection N wide (a head-wide one takes wide tiles)
        return t.wide_block_n if triton.cdiv(N, t.block_n) >= fused.SPLIT_BELOW else t.block_n

    qkv_splits, qkv_chunk = fused.input_splits(H, (num_heads + 2 * nkv) * split)
    o_splits, o_chunk = fused.input_splits(nhd, triton.cdiv(H, t.block_n))
    gu_splits, gu_chunk = fused.input_splits(H, triton.cdiv(I, t.block_n))
    down_splits, down_chunk = fused.input_splits(I, triton.cdiv(H, t.block_n))
    width = max(qkv_splits * NQKV, o_splits * H, gu_splits * 2 * I, down_splits * H)
    partial = torch.empty(R * width, dtype=torch.float32, device=x.device)
    attn_splits = triton.cdiv(S, attend_kernels.SPLIT)
    attn_partial = torch.empty(R * num_heads * attn_splits * hd, dtype=torch.float32, device=x.device)
    attn_stats = torch.empty(R * num_heads * attn_splits * 2, dtype=torch.float32, device=x.device)
    out = torch.empty(L, R, H, dtype=x.dtype, device=x.device)
    mid = torch.empty(R, H, dtype=x.dtype, device=x.device)
    q = torch.empty(R, num_heads, hd, dtype=x.dtype, device=x.device)
    heads = torch.empty(R, nhd, dtype=x.dtype, device=x.device)
    act = torch.empty(R, I, dtype=x.dtype, device=x.device)
    group = num_heads // nkv
    sharing = attend_kernels.rows_sharing(group)
    row_tiles = triton.cdiv(R, t.block_m)
    tasks = max(row_tiles * (num_heads + 2 * nkv) * split * qkv_splits, B * nkv * M * attn_splits, R * num_heads,
                row_tiles * triton.cdiv(H, cols(H)) * max(o_splits, down_splits),
                row_tiles * triton.cdiv(I, cols(I)) * gu_splits)  # the widest stage's
    args = (x, out, mid, q, heads, act, partial, attn_partial, attn_stats, counters, barrier,
            norm1, qkv, qkv if qkv_bias is None else qkv_bias, o, norm2, gate_up, down,
            cos, sin, slots, k_cache, v_cache, mask,
            L, R, M, S, B, nkv, H, NQKV, I, qkv_chunk, o_chunk, gu_chunk, down_chunk, attn_splits,
            cos.stride(0), sin.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3), mask.stride(0), mask.stride(2))
    stages = L * (5 if attn_splits == 1 else 6)  # a program's trace: its start, then each stage's end
    if GRID.trace:
        trace = torch.empty(max(tasks, 1), stages + 1, 2, dtype=torch.int64, device=x.device)
    else:  # never written: one shared placeholder, no allocation a forward
        if x.device not in _NO_TRACE:
            _NO_TRACE[x.device] = torch.empty(1, dtype=torch.int64, device=x.device)
        trace = _NO_TRACE[x.device]
    args += (trace,)
    kwargs = dict(
        eps1=eps1, eps2=eps2, qk_scale=math.log2(math.e) / math.sqrt(hd), NH=num_heads,
        BIAS=qkv_bias is not None, HALF=hd // 2, PART=hd // 2 // split, QKV_SPLITS=qkv_splits,
        O_SPLITS=o_splits, GU_SPLITS=gu_splits, DOWN_SPLITS=down_splits, O_BN=cols(H), GU_BN=cols(I),
        BLOCK_M=t.block_m, BLOCK_K=t.block_k, IEEE=x.dtype == torch.float32, GROUP=group, HD=hd,
        A_BLOCK_M=attend_kernels.BLOCK_M, A_BLOCK_N=attend_kernels.BLOCK_N, A_SPLIT=attend_kernels.SPLIT,
        ONE_SPLIT=attn_splits == 1, ROWS=sharing, ROWS_P2=triton.next_power_of_2(sharing),
        NORM_K=H * t.unroll_norm, PREFETCH=prefetching(k_cache, v_cache, qkv, o, gate_up, down),
        LINE=128 // x.element_size(), PF_BLOCK=_PF_BLOCK, TRACE=bool(GRID.trace) and not INTERPRETED,
        TRACE_N=stages + 1, num_warps=t.num_warps, num_stages=t.num_stages)
    G = programs(kernel, args, kwargs, x.device, tasks)
    kernel[(G,)](*args, **kwargs)
    if GRID.trace and not INTERPRETED:
        TRACES.append(trace[:G])
    return out


if HAVE_TRITON:
    @triton.jit
    def _clock():
        """The GPU's global nanosecond timer (one clock for every multiprocessor)."""
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

    @triton.jit
    def _wait_all(bar_ptr, count, trace_ptr, TRACE: tl.constexpr):
        """Arrive at the barrier and wait until `count` arrivals have been counted (the count grows
        through the launch: barrier j of G programs waits for j x G). Every thread's stores come
        before the arrival; the acquiring read makes the others' visible after it. TRACE: the clock
        at the arrival and at the leaving into trace_ptr[0:2]."""
        tl.debug_barrier()
        if TRACE:
            tl.store(trace_ptr, _clock())
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        while seen < count:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        if TRACE:
            tl.store(trace_ptr + 1, _clock())

    @triton.jit
    def _prefetch(ptr, n, pid, G, LINE: tl.constexpr, PF_BLOCK: tl.constexpr):
        """Ask L2 to fetch program pid's share (1/G, in whole 128-byte lines of LINE elements) of the
        n elements at ptr; nothing waits for them."""
        lines = tl.cdiv(n, LINE)
        share = tl.cdiv(lines, G)
        end = tl.minimum(pid * share + share, lines)
        for j in range(pid * share, end, PF_BLOCK):
            line = tl.minimum(j + tl.arange(0, PF_BLOCK), end - 1)  # past the end: the last line again
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                      [ptr + line.to(tl.int64) * LINE], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _prefetch_layer(layer, pid, G, qkv_ptr, o_ptr, gu_ptr, down_ptr, H, NQKV, NHD, I, k_ptr, v_ptr, k_sl, k_sb,
                        k_sh, v_sl, v_sb, v_sh, B, NKV, S, HD: tl.constexpr, PREFETCH: tl.constexpr,
                        LINE: tl.constexpr, PF_BLOCK: tl.constexpr):
        """Program pid's share of one layer's projection weights into L2 (the norms' and bias's are a
        few lines, read by every program); PREFETCH 2: of its K/V, S slots of each batch row's heads."""
        _prefetch(qkv_ptr + layer * NQKV * H, NQKV * H, pid, G, LINE, PF_BLOCK)
        _prefetch(o_ptr + layer * H * NHD, H * NHD, pid, G, LINE, PF_BLOCK)
        _prefetch(gu_ptr + layer * 2 * I * H, 2 * I * H, pid, G, LINE, PF_BLOCK)
        _prefetch(down_ptr + layer * H * I, H * I, pid, G, LINE, PF_BLOCK)
        if PREFETCH == 2:
            for bh in range(B * NKV):
                _prefetch(k_ptr + layer * k_sl + (bh // NKV) * k_sb + (bh % NKV) * k_sh, S * HD, pid, G, LINE,
                          PF_BLOCK)
                _prefetch(v_ptr + layer * v_sl + (bh // NKV) * v_sb + (bh % NKV) * v_sh, S * HD, pid, G, LINE,
                          PF_BLOCK)

    @triton.jit
    def _layers(x_ptr, out_ptr, mid_ptr, q_ptr, heads_ptr, act_ptr, partial_ptr, attn_partial_ptr, attn_stats_ptr,
                done_ptr, bar_ptr, norm1_ptr, qkv_ptr, bias_ptr, o_ptr, norm2_ptr, gu_ptr, down_ptr,
                cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, mask_ptr,
                L, R, M, S, B, NKV, H, NQKV, I, qkv_chunk, o_chunk, gu_chunk, down_chunk, attn_splits,
                cos_stride, sin_stride, k_sl, k_sb, k_sh, k_ss, v_sl, v_sb, v_sh, v_ss, mask_sb, mask_sm, trace_ptr,
                eps1: tl.constexpr, eps2: tl.constexpr, qk_scale: tl.constexpr, NH: tl.constexpr,
                BIAS: tl.constexpr, HALF: tl.constexpr, PART: tl.constexpr, QKV_SPLITS: tl.constexpr,
                O_SPLITS: tl.constexpr, GU_SPLITS: tl.constexpr, DOWN_SPLITS: tl.constexpr,
                O_BN: tl.constexpr, GU_BN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                IEEE: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr, A_BLOCK_M: tl.constexpr,
                A_BLOCK_N: tl.constexpr, A_SPLIT: tl.constexpr, ONE_SPLIT: tl.constexpr, ROWS: tl.constexpr,
                ROWS_P2: tl.constexpr, NORM_K: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
                PF_BLOCK: tl.constexpr, TRACE: tl.constexpr, TRACE_N: tl.constexpr):
        pid = tl.program_id(0)
        G = tl.num_programs(0)
        row_tiles = tl.cdiv(R, BLOCK_M)
        qkv_cols = (NH + 2 * NKV) * (HALF // PART)
        o_cols = tl.cdiv(H, O_BN)
        gu_cols = tl.cdiv(I, GU_BN)
        NHD = NH * HD
        waits = 0
        trace_ptr += pid * TRACE_N * 2  # this program's [TRACE_N, 2]: its start, then each stage's end
        if TRACE:
            start = _clock()
            tl.store(trace_ptr, start)
            tl.store(trace_ptr + 1, start)
        if PREFETCH:
            _prefetch_layer(tl.cast(0, tl.int64), pid, G, qkv_ptr, o_ptr, gu_ptr, down_ptr, H, NQKV, NHD, I, k_ptr,
                            v_ptr, k_sl, k_sb, k_sh, v_sl, v_sb, v_sh, B, NKV, S, HD, PREFETCH, LINE, PF_BLOCK)
        for i in range(L):
            layer = tl.cast(i, tl.int64)  # an 8B model's stacked gate/up passes 2**31 elements by its 19th layer
            if PREFETCH:
                if i + 1 < L:
                    _prefetch_layer(layer + 1, pid, G, qkv_ptr, o_ptr, gu_ptr, down_ptr, H, NQKV, NHD, I, k_ptr,
                                    v_ptr, k_sl, k_sb, k_sh, v_sl, v_sb, v_sh, B, NKV, S, HD, PREFETCH, LINE,
                                    PF_BLOCK)
            if i == 0:
                src = x_ptr
            else:
                src = out_ptr + (layer - 1) * R * H
            dst = out_ptr + layer * R * H
            k_layer = k_ptr + layer * k_sl
            v_layer = v_ptr + layer * v_sl
            # norm + q/k/v + RoPE; k and v into the cache, q into q_ptr [R, nh, hd]
            for t in range(pid, row_tiles * qkv_cols * QKV_SPLITS, G):
                tile = t // QKV_SPLITS
                _qkv_rope_tile(tile // qkv_cols, tile % qkv_cols, t % QKV_SPLITS, tile, src, norm1_ptr + layer * H,
                               qkv_ptr + layer * NQKV * H, bias_ptr + layer * NQKV, cos_ptr, sin_ptr, slot_ptr,
                               k_layer, v_layer, q_ptr, partial_ptr, done_ptr, R, H, qkv_chunk, eps1, M, NH, NKV,
                               H, H, cos_stride, sin_stride, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                               BIAS, HALF, PART, QKV_SPLITS, BLOCK_M, BLOCK_K, IEEE, NORM_K)
            waits += 1
            _wait_all(bar_ptr, waits * G, trace_ptr + waits * 2, TRACE)
            # attention: (batch and KV head, query row, slot split), into heads_ptr [B, q, nh, hd]
            for t in range(pid, B * NKV * M * attn_splits, G):
                row = t // attn_splits
                _attend_tile(row // M, row % M, t % attn_splits, attn_splits, q_ptr, k_layer, v_layer, mask_ptr,
                             heads_ptr, attn_partial_ptr, attn_stats_ptr, M, S, NKV, qk_scale, M * NHD, HD, NHD,
                             k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, mask_sb, mask_sm, GROUP, HD, A_BLOCK_M, A_BLOCK_N,
                             A_SPLIT, ONE_SPLIT, True, IEEE, ROWS, ROWS_P2)
            waits += 1
            _wait_all(bar_ptr, waits * G, trace_ptr + waits * 2, TRACE)
            if not ONE_SPLIT:  # the slot splits weighed together, a task a row and head, as the fused
                # path's second launch does (the last task of a row group weighing its rows instead was slower
                # from 8 rows on: one program took up to 15 rows and heads in turn)
                for t in range(pid, B * M * NH, G):
                    _combine_row(t, attn_partial_ptr, attn_stats_ptr, heads_ptr, attn_splits, HD)
                waits += 1
                _wait_all(bar_ptr, waits * G, trace_ptr + waits * 2, TRACE)
            # o_proj + residual: mid = src + heads @ Wo^T
            for t in range(pid, row_tiles * o_cols * O_SPLITS, G):
                tile = t // O_SPLITS
                _linear_tile(tile // o_cols, tile % o_cols, t % O_SPLITS, tile, heads_ptr, norm1_ptr,
                             o_ptr + layer * H * NHD, o_ptr, src, mid_ptr, partial_ptr, done_ptr, R, NHD, H, o_chunk,
                             0.0, NHD, NHD, H, H, False, False, False, True, O_SPLITS, BLOCK_M, O_BN, BLOCK_K, IEEE, 0)
            waits += 1
            _wait_all(bar_ptr, waits * G, trace_ptr + waits * 2, TRACE)
            # norm + gate/up + SiLU-and-multiply: act = silu(gate(n)) * up(n), n = norm2(mid)
            for t in range(pid, row_tiles * gu_cols * GU_SPLITS, G):
                tile = t // GU_SPLITS
                _linear_tile(tile // gu_cols, tile % gu_cols, t % GU_SPLITS, tile, mid_ptr, norm2_ptr + layer * H,
                             gu_ptr + layer * 2 * I * H, gu_ptr, mid_ptr, act_ptr, partial_ptr, done_ptr, R, H, I,
                             gu_chunk, eps2, H, H, 0, I, True, False, True, False, GU_SPLITS, BLOCK_M, GU_BN,
                             BLOCK_K, IEEE, NORM_K)
            waits += 1
            _wait_all(bar_ptr, waits * G, trace_ptr + waits * 2, TRACE)
            # down + residual: dst = mid + act @ Wd^T
            for t in range(pid, row_tiles * o_cols * DOWN_SPLITS, G):
                tile = t // DOWN_SPLITS
                _linear_tile(tile // o_cols, tile % o_cols, t % DOWN_SPLITS, tile, act_ptr, norm2_ptr,
                             down_ptr + layer * H * I, down_ptr, mid_ptr, dst, partial_ptr, done_ptr, R, I, H,
                             down_chunk, 0.0, I, I, H, H, False, False, False, True, DOWN_SPLITS, BLOCK_M, O_BN,
                             BLOCK_K, IEEE, 0)
            if i < L - 1:
                waits += 1
                _wait_all(bar_ptr, waits * G, trace_ptr + waits * 2, TRACE)
        # the last arrival sets the count back to zero for the next launch: no program waits on it now
        tl.debug_barrier()
        if TRACE:
            end = _clock()
            tl.store(trace_ptr + (waits + 1) * 2, end)
            tl.store(trace_ptr + (waits + 1) * 2 + 1, end)
        if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == (waits + 1) * G - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")

    @torch.library.custom_op("speclens::layers", mutates_args=("k_cache", "v_cache"))
    def _layers_op(x: torch.Tensor, norm1: torch.Tensor, qkv: torch.Tensor, qkv_bias: torch.Tensor | None,
                   o: torch.Tensor, norm2: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   counters: torch.Tensor, barrier: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                   num_heads: int, eps1: float, eps2: float, rows_per_batch: int) -> torch.Tensor:
        return launch_layers(x, norm1, qkv, qkv_bias, o, norm2, gate_up, down, counters, barrier, cos, sin, slots,
                             k_cache, v_cache, mask, num_heads, eps1, eps2, rows_per_batch, _layers)

    @_layers_op.register_fake
    def _layers_fake(x, norm1, qkv, qkv_bias, o, norm2, gate_up, down, counters, barrier, cos, sin, slots, k_cache,
                     v_cache, mask, num_heads, eps1, eps2, rows_per_batch):
        return x.new_empty(qkv.shape[0], x.shape[0], x.shape[1])
