"""Attention of a few query rows over a static KV cache with a boolean mask, in launches a captured
step can afford.

Every forward of a decoding step attends 1 to a few hundred query rows (a token, a chain's
verification, a tree's nodes, a drafter's frontier) over the cache's first `attend` slots, as a
boolean mask allows: causal over slots, or a tree's ancestors at scattered slots. PyTorch's
``scaled_dot_product_attention`` takes such a mask through cuDNN at a cost of tens of microseconds a
call, and a verification of the default target pays it once a layer.

``attend`` runs split-slot attention in Triton on a GPU instead, unless the target's kernels are
"torch" (``demo.kernels.runtime``; flash-decoding's scheme): a program takes BLOCK_M query rows of one KV head
(GQA's query heads of a KV head packed as rows, so each K/V block is read once for all of them) and
SPLIT slots, keeps an online softmax over BLOCK_N-slot blocks, and writes its unnormalised sum with
its running max and total; a second kernel weighs the splits together, one after another (an empty
split adds exact zeros, so a wider bucket gives the same bits). Over one split the first kernel
writes the output itself. A row's result depends on its own query, mask row, the cache and SPLIT
only, never on how many rows run beside it.

A decoding step's forwards pass their masks in slot order (``seen_slots``, ``causal_seen_slots``:
each row's seen slots, in increasing order): a program then takes one query row's heads and walks
that row's seen slots side by side, so a tree node whose ancestors lie scattered over the tree's
slots sums them in the blocks and lanes where target-only, decoding that path one token at a time,
finds them at contiguous slots. A split that several consecutive rows all see whole (the text
before a tree or a chain: the n-th seen slot is slot n for each) is the same keys in the same lanes
for each of them, so the first of a group of rows takes it for the group, their heads packed as
rows, and the others skip it (``rows_sharing``): a tree's rows read the text's K/V once a group
instead of once a row. Target-only's steps and a chain's verification attend in slot order
too (``ORDERED_ROWS``): the packed and the slot-order kernels, compiled apart, may round a row
differently on the same keys, so every row a decoding step computes goes through the one kernel. With every
other kernel computing a row alike at any width (``demo.kernels.fused``), each node's logits are
target-only's, bit for bit, and a bf16 tree emits target-only's tokens (tests/kernels/test_fused.py in
Triton's interpreter; tests/gpu/test_attend_gpu.py on a GPU). A prefill's rows, wider, are packed.

The output comes back as a [B, nh, q, hd] view of a [B, q, nh, hd] tensor, the layout the output
projection reads. The op is a ``torch.library.triton_op``: torch.compile sees its kernels and CUDA
graphs capture them (and Triton's interpreter runs them on a CPU, for tests). Without Triton, on a
CPU, for head sizes ``tl.dot`` cannot take, or for a target whose kernels are "torch", SDPA runs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from demo.kernels.runtime import HAVE_TRITON, triton_on

if HAVE_TRITON:
    import triton
    import triton.language as tl

ORDERED_ROWS = 256  # forwards of at most this many query rows (every decoding step's) attend in slot order
BLOCK_M = 16  # query rows a program takes (fixed: a row's arithmetic never depends on its neighbours)
BLOCK_N = 64  # slots per inner step
SPLIT = 128  # slots per program (a multiple of BLOCK_N)


def rows_sharing(group: int) -> int:
    """Query rows whose heads one slot-order program packs, over a split they all see whole."""
    return max(1, BLOCK_M // group)


def triton_runs(q: torch.Tensor) -> bool:
    """Whether `attend` takes the Triton kernels for queries like q ([B, nh, q, hd])."""
    return _triton_takes(q, q.shape[-1])


def _triton_takes(x: torch.Tensor, hd: int) -> bool:
    return (triton_on(x) and 16 <= hd <= 256 and hd & (hd - 1) == 0
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16))


def orders_slots(x: torch.Tensor, head_dim: int, group: int) -> bool:
    """Whether `attend` takes a mask in slot order (``seen_slots``) as it is, for a model of this head
    size and query heads per KV head, its activations like x: the Triton kernels run, and one query
    row's heads fit one program."""
    return _triton_takes(x, head_dim) and group <= BLOCK_M


def seen_slots(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, 1, q, S] bool -> [B, 1, q, S] int32: each row's seen slots in increasing order, then -1.
    Attending over a row's seen slots placed side by side is what a causal row computes when the same
    keys lie at contiguous slots: a tree node whose ancestors are scattered over the tree's slots (in
    depth order, as node ids grow with depth) sums them as target-only sums that path."""
    S = mask.shape[-1]
    place = torch.where(mask, mask.to(torch.int32).cumsum(-1) - 1, S)  # [B, 1, q, S]: where each seen slot goes
    slots = torch.arange(S, dtype=torch.int32, device=mask.device).expand(mask.shape)
    order = torch.full((*mask.shape[:-1], S + 1), -1, dtype=torch.int32, device=mask.device)
    return order.scatter_(-1, place.long(), slots)[..., :S]  # column S took the unseen slots


def causal_seen_slots(positions: torch.Tensor, num_slots: int) -> torch.Tensor:
    """``seen_slots(causal_slot_mask(positions, num_slots))`` without the mask: a query at position p
    sees slots 0..p. positions [B, q] -> [B, 1, q, S] int32."""
    slots = torch.arange(num_slots, dtype=torch.int32, device=positions.device)
    return torch.where(slots[None, None, None, :] <= positions[:, None, :, None], slots, -1)


def mask_of(order: torch.Tensor) -> torch.Tensor:
    """``seen_slots``' inverse: [B, 1, q, S] int32 -> [B, 1, q, S] bool."""
    seen = torch.zeros(*order.shape[:-1], order.shape[-1] + 1, dtype=torch.bool, device=order.device)
    return seen.scatter_(-1, torch.where(order >= 0, order, order.shape[-1]).long(), True)[..., :-1]


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
           triton: bool = True) -> torch.Tensor:
    """q: [B, nh, q, hd]; k_cache, v_cache: [B, nkv, S, hd] (nh a multiple of nkv; last dim contiguous);
    mask: [B, 1, q, S] bool (True: the query row sees the slot; slots contiguous), or int32, each row's
    seen slots in order (``seen_slots``) -> [B, nh, q, hd]. `triton`: the Triton kernels where they
    run (False: SDPA, the "torch" kernels' reference)."""
    ordered = mask.dtype == torch.int32
    if ordered and not (triton and orders_slots(q, q.shape[-1], q.shape[1] // k_cache.shape[1])):
        mask, ordered = mask_of(mask), False
    if triton and triton_runs(q):
        q = q if q.stride(-1) == 1 else q.contiguous()
        mask = mask if mask.stride(-1) == 1 else mask.contiguous()
        return torch.ops.speclens.attend(q, k_cache, v_cache, mask).transpose(1, 2)
    return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask,
                                          enable_gqa=q.shape[1] != k_cache.shape[1])


def split_attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                 split_kernel, combine_kernel, split: int = SPLIT) -> torch.Tensor:
    """The kernels' launches (jitted, or interpreted in tests); shapes as `attend`'s, but the output
    is [B, q, nh, hd] (contiguous)."""
    B, nh, M, hd = q.shape
    nkv, S = k_cache.shape[1], k_cache.shape[2]
    group = nh // nkv
    rows = group * M  # packed query rows of one KV head
    splits = triton.cdiv(S, split)
    out = torch.empty(B, M, nh, hd, dtype=q.dtype, device=q.device)  # the layout o_proj reads
    if splits == 1:
        partial, stats = out, out  # unused: the one split writes the output
    else:
        partial = torch.empty(B, M, nh, splits, hd, dtype=torch.float32, device=q.device)
        stats = torch.empty(B, M, nh, splits, 2, dtype=torch.float32, device=q.device)  # (max, total), log2 units
    ordered = mask.dtype == torch.int32  # each row's seen slots in order: one query row a program,
    sharing = rows_sharing(group)  # or this many over a split they all see whole
    grid = (B * nkv, M if ordered else triton.cdiv(rows, BLOCK_M), splits)
    split_kernel[grid](
        q, k_cache, v_cache, mask, out, partial, stats, M, S, nkv, math.log2(math.e) / math.sqrt(hd),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), mask.stride(0), mask.stride(2),
        GROUP=group, HD=hd, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SPLIT=split, ONE_SPLIT=splits == 1,
        ORDERED=ordered, IEEE=q.dtype == torch.float32, ROWS=sharing, ROWS_P2=triton.next_power_of_2(sharing))
    if splits > 1:
        combine_kernel[(B * M * nh,)](partial, stats, out, splits, HD=hd)
    return out


if HAVE_TRITON:
    @triton.jit
    def _attend_split(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, partial_ptr, stats_ptr, M, S, NKV, qk_scale: tl.constexpr,
                      q_sb, q_sh, q_sm, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, mask_sb, mask_sm,
                      GROUP: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLIT: tl.constexpr, ONE_SPLIT: tl.constexpr, ORDERED: tl.constexpr, IEEE: tl.constexpr,
                      ROWS: tl.constexpr, ROWS_P2: tl.constexpr):
        _attend_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(2), q_ptr, k_ptr, v_ptr,
                     mask_ptr, out_ptr, partial_ptr, stats_ptr, M, S, NKV, qk_scale, q_sb, q_sh, q_sm, k_sb, k_sh,
                     k_ss, v_sb, v_sh, v_ss, mask_sb, mask_sm, GROUP, HD, BLOCK_M, BLOCK_N, SPLIT, ONE_SPLIT, ORDERED,
                     IEEE, ROWS, ROWS_P2)

    @triton.jit
    def _attend_tile(bk, part, split, splits, q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, partial_ptr, stats_ptr, M, S,
                     NKV, qk_scale: tl.constexpr, q_sb, q_sh, q_sm, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, mask_sb,
                     mask_sm, GROUP: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     SPLIT: tl.constexpr, ONE_SPLIT: tl.constexpr, ORDERED: tl.constexpr, IEEE: tl.constexpr,
                     ROWS: tl.constexpr, ROWS_P2: tl.constexpr):
        """One program of _attend_split: batch and KV head `bk`, query row (or row tile) `part`, slot
        split `split` of `splits`; also demo.kernels.persistent's attention tasks."""
        b = bk // NKV
        kv = bk % NKV
        nh = NKV * GROUP
        lo = split * SPLIT
        hi = tl.minimum(lo + SPLIT, S)
        if ORDERED:  # one query row's heads; n below counts its seen slots, in order
            r = tl.arange(0, BLOCK_M)
            # A split that every row of this row's group sees whole (the text before a tree or a
            # chain) is the same keys in the same lanes for each: the group's first row takes it
            # for all of them, their heads packed as rows, and the others skip it. A split where
            # the rows part stays one row a program, so no program walks more blocks than before.
            lead = part - part % ROWS
            g = tl.arange(0, ROWS_P2)
            last = tl.load(mask_ptr + b * mask_sb + (lead + g) * mask_sm + hi - 1, mask=(g < ROWS) & (lead + g < M),
                           other=-2)
            shared = tl.sum(((last != hi - 1) & (last != -2)).to(tl.int32), axis=0) == 0
            m = tl.where(shared, lead + r // GROUP, part + r * 0)
            packed = (r < ROWS * GROUP) & (m < M) & (part == lead)
            live = tl.where(shared, packed.to(tl.int32), (r < GROUP).to(tl.int32)) != 0
        else:  # packed rows: query row r // GROUP, head kv * GROUP + r % GROUP; n is the slot
            r = part * BLOCK_M + tl.arange(0, BLOCK_M)
            m = r // GROUP
            live = m < M
        h = kv * GROUP + r % GROUP
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + b * q_sb + h[:, None] * q_sh + m[:, None] * q_sm + d[None, :], mask=live[:, None], other=0.0)
        acc = tl.zeros((BLOCK_M, HD), dtype=tl.float32)
        top = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max of the scores (log2 units)
        total = tl.zeros((BLOCK_M,), dtype=tl.float32)
        k_base = k_ptr + b * k_sb + kv * k_sh
        v_base = v_ptr + b * v_sb + kv * v_sh
        mask_base = mask_ptr + b * mask_sb + m[:, None] * mask_sm
        if ORDERED:  # the row's seen slots come first: stop after the last block holding one (a block
            # that sees nothing would add exact zeros, and a split past the row's last slot does nothing)
            ahead = lo + tl.arange(0, SPLIT)
            order = tl.load(mask_ptr + b * mask_sb + part * mask_sm + ahead, mask=ahead < S, other=-1)
            seen_here = tl.sum((order >= 0).to(tl.int32), axis=0)
            hi = tl.minimum(hi, lo + (seen_here + BLOCK_N - 1) // BLOCK_N * BLOCK_N)
            hi = tl.where(shared & (part != lead), lo, hi)  # the group's first row takes this split
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            inside = n < S
            if ORDERED:  # the n-th seen slot of this row (-1: past its last)
                slot = tl.load(mask_ptr + b * mask_sb + part * mask_sm + n, mask=inside, other=-1)
                inside = slot >= 0
                seen = live[:, None] & inside[None, :]
            else:
                slot = n
                seen = tl.load(mask_base + n[None, :], mask=live[:, None] & inside[None, :], other=0) != 0
            k = tl.load(k_base + slot[None, :] * k_ss + d[:, None], mask=inside[None, :], other=0.0)  # [HD, BLOCK_N]
            if IEEE:
                s = tl.dot(q, k, input_precision="ieee")
            else:
                s = tl.dot(q, k)
            s = tl.where(seen, s * qk_scale, float("-inf"))  # [BLOCK_M, BLOCK_N]
            new_top = tl.maximum(top, tl.max(s, axis=1))
            shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row that has seen nothing yet
            p = tl.exp2(s - shift[:, None])
            scale = tl.exp2(top - shift)
            total = total * scale + tl.sum(p, axis=1)
            v = tl.load(v_base + slot[:, None] * v_ss + d[None, :], mask=inside[:, None], other=0.0)  # [BLOCK_N, HD]
            if IEEE:
                acc = acc * scale[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * scale[:, None] + tl.dot(p.to(v.dtype), v)
            top = new_top
        at = (b * M + m) * nh + h  # the row's index in [B, q, nh]
        if ONE_SPLIT:
            result = acc / tl.where(total > 0, total, 1.0)[:, None]
            tl.store(out_ptr + at[:, None] * HD + d[None, :], result.to(out_ptr.dtype.element_ty), mask=live[:, None])
        else:
            tl.store(partial_ptr + (at[:, None] * splits + split) * HD + d[None, :], acc, mask=live[:, None])
            tl.store(stats_ptr + (at * splits + split) * 2, top, mask=live)
            tl.store(stats_ptr + (at * splits + split) * 2 + 1, total, mask=live)

    @triton.jit
    def _attend_combine(partial_ptr, stats_ptr, out_ptr, splits, HD: tl.constexpr):
        """The splits weighed together one after another, in split order: empty splits (past the
        row's last seen slot) add exact zeros, so a wider bucket gives the same bits."""
        _combine_row(tl.program_id(0), partial_ptr, stats_ptr, out_ptr, splits, HD)

    @triton.jit
    def _combine_row(row, partial_ptr, stats_ptr, out_ptr, splits, HD: tl.constexpr):
        """_attend_combine for one row of [B, q, nh] (its program, or a persistent task)."""
        d = tl.arange(0, HD)
        best = tl.load(stats_ptr + row * splits * 2)
        for s in range(1, splits):
            best = tl.maximum(best, tl.load(stats_ptr + (row * splits + s) * 2))
        shift = tl.where(best == float("-inf"), 0.0, best)
        weight = tl.exp2(tl.load(stats_ptr + row * splits * 2) - shift)  # 0 for an empty split
        norm = weight * tl.load(stats_ptr + row * splits * 2 + 1)
        acc = weight * tl.load(partial_ptr + row * splits * HD + d)  # [HD]
        for s in range(1, splits):
            weight = tl.exp2(tl.load(stats_ptr + (row * splits + s) * 2) - shift)
            norm += weight * tl.load(stats_ptr + (row * splits + s) * 2 + 1)
            acc += weight * tl.load(partial_ptr + (row * splits + s) * HD + d)
        result = acc / tl.where(norm > 0, norm, 1.0)
        tl.store(out_ptr + row * HD + d, result.to(out_ptr.dtype.element_ty))

    @torch.library.triton_op("speclens::attend", mutates_args=())
    def _attend_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return split_attend(q, k_cache, v_cache, mask, torch.library.wrap_triton(_attend_split),
                            torch.library.wrap_triton(_attend_combine))
