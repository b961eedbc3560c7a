"""The elementwise half of the EAGLE-3 head loss, fused: one chunk of logits [c, V] becomes its
gradient in place, and each row's loss and argmax come back.

Per row n (p = softmax(source row), lse = logsumexp(logits row), t = top[n], w = row_weight[n]):
    loss[n]   = w x (lse - sum_v p_v l_v + top1_weight x (lse - l_t))
    grad[n]   = w x (softmax(l) x (1 + top1_weight) - p - top1_weight x onehot(t))
    picks[n]  = argmax_v l_v (the first of equal maxima)

`torch` is the reference, in eager PyTorch: ~10 full passes over [c, V] in fp32. `triton` reads the
logits and the source rows twice (statistics, then the gradient) and writes the gradient once, in
the logits' dtype: at V = 49,152 the eager passes are most of a training step (`training.train
--profile`; docs/PERFORMANCE.md). tests/training/test_head_loss_kernel.py holds the two equal on
random inputs.
"""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU wheels of torch come without Triton: the reference serves
    triton = None

BACKEND_ENV = "SPECLENS_HEAD_LOSS"  # "torch" forces the reference on a GPU


def available() -> bool:
    return triton is not None


def backend_for(device: torch.device | str) -> str:
    """What backend="auto" picks on this device: "triton" on a CUDA device with Triton installed,
    unless SPECLENS_HEAD_LOSS=torch; else "torch"."""
    cuda = torch.device(device).type == "cuda"
    return "triton" if available() and cuda and os.environ.get(BACKEND_ENV, "auto") != "torch" else "torch"


def soft_ce_grad_(logits: torch.Tensor, source: torch.Tensor, rows_b: torch.Tensor, rows_s: torch.Tensor,
                  top: torch.Tensor | None, top1_weight: float, row_weight: torch.Tensor | None,
                  backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """logits [c, V] (overwritten by dL/dlogits, same dtype); source [B, S, V] target logits, row n
    at (rows_b[n], rows_s[n]); top [c] int64 or None; row_weight [c] or None. Returns (loss [c]
    fp32, picks [c] int64). backend: "auto" (Triton on a CUDA device when installed), "torch",
    "triton"."""
    backend = backend_for(logits.device) if backend == "auto" else backend
    fn = _triton_soft_ce_grad_ if backend == "triton" else _torch_soft_ce_grad_
    return fn(logits, source, rows_b, rows_s, top if top1_weight else None, float(top1_weight), row_weight)


def _torch_soft_ce_grad_(logits, source, rows_b, rows_s, top, top1_weight, row_weight):
    lf = logits.float()  # [c, V] (the logits themselves when they are fp32)
    picks = lf.argmax(-1)
    lse = torch.logsumexp(lf, -1)  # [c]
    p = torch.softmax(source[rows_b, rows_s].float(), -1)  # [c, V]
    loss = lse - (p * lf).sum(-1)
    if top is not None:
        loss += top1_weight * (lse - lf.gather(1, top[:, None])[:, 0])
    g = lf.sub_(lse[:, None]).exp_().mul_(1 + top1_weight).sub_(p)
    if top is not None:
        g[torch.arange(len(top), device=g.device), top] -= top1_weight
    if row_weight is not None:
        wc = row_weight.float()
        loss *= wc
        g.mul_(wc[:, None])
    if g.data_ptr() != logits.data_ptr():
        logits.copy_(g)
    return loss, picks


def _triton_soft_ce_grad_(logits, source, rows_b, rows_s, top, top1_weight, row_weight):
    c, V = logits.shape
    assert source.shape[-1] == V and source.stride(-1) == 1 and logits.stride(-1) == 1
    offsets = rows_b * source.stride(0) + rows_s * source.stride(1)  # [c] int64 element offset of each source row
    loss = torch.empty(c, dtype=torch.float32, device=logits.device)
    picks = torch.empty(c, dtype=torch.int64, device=logits.device)
    if c == 0:
        return loss, picks
    block = min(4096, triton.next_power_of_2(V))
    _soft_ce_grad_kernel[(c,)](
        logits, logits.stride(0), source, offsets, top if top is not None else offsets,
        row_weight if row_weight is not None else loss, loss, picks, top1_weight, V=V,
        HAS_TOP=top is not None, HAS_WEIGHT=row_weight is not None, BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return loss, picks


if triton is not None:
    @triton.jit
    def _soft_ce_grad_kernel(logits_ptr, logits_stride, source_ptr, offsets_ptr, top_ptr, weight_ptr,
                             loss_ptr, picks_ptr, top1_weight, V: tl.constexpr,
                             HAS_TOP: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        l_row = logits_ptr + row * logits_stride
        s_row = source_ptr + tl.load(offsets_ptr + row)
        cols0 = tl.arange(0, BLOCK)
        neg_inf = float("-inf")
        # pass 1: running max and sum of exp for the logits and the source, sum_v exp(s_v - max) l_v, argmax
        m_l = tl.zeros([], dtype=tl.float32) + neg_inf
        d_l = tl.zeros([], dtype=tl.float32)
        m_s = tl.zeros([], dtype=tl.float32) + neg_inf
        d_s = tl.zeros([], dtype=tl.float32)
        a_sl = tl.zeros([], dtype=tl.float32)
        best = tl.zeros([], dtype=tl.float32) + neg_inf
        best_i = tl.zeros([], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            cols = start + cols0
            mask = cols < V
            l = tl.load(l_row + cols, mask=mask, other=neg_inf).to(tl.float32)
            s = tl.load(s_row + cols, mask=mask, other=neg_inf).to(tl.float32)
            b_max = tl.max(l, 0)
            b_arg = tl.argmax(l, 0).to(tl.int32) + start
            best_i = tl.where(b_max > best, b_arg, best_i)  # strictly greater: the first maximum wins
            best = tl.maximum(best, b_max)
            new_l = tl.maximum(m_l, b_max)
            d_l = d_l * tl.exp(m_l - new_l) + tl.sum(tl.exp(l - new_l), 0)
            m_l = new_l
            new_s = tl.maximum(m_s, tl.max(s, 0))
            scale = tl.exp(m_s - new_s)
            e = tl.exp(s - new_s)  # 0 where masked
            d_s = d_s * scale + tl.sum(e, 0)
            a_sl = a_sl * scale + tl.sum(e * tl.where(mask, l, 0.0), 0)
            m_s = new_s
        lse_l = m_l + tl.log(d_l)
        lse_s = m_s + tl.log(d_s)
        loss = lse_l - a_sl / d_s
        if HAS_TOP:
            t = tl.load(top_ptr + row)
            loss += top1_weight * (lse_l - tl.load(l_row + t).to(tl.float32))
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + row).to(tl.float32)
            loss = loss * w
        tl.store(loss_ptr + row, loss)
        tl.store(picks_ptr + row, best_i.to(tl.int64))
        # pass 2: the gradient, over the logits in place
        for start in range(0, V, BLOCK):
            cols = start + cols0
            mask = cols < V
            l = tl.load(l_row + cols, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(s_row + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(l - lse_l) * (1 + top1_weight) - tl.exp(s - lse_s)
            if HAS_TOP:
                g = tl.where(cols == t, g - top1_weight, g)
            if HAS_WEIGHT:
                g = g * w
            tl.store(l_row + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)
