"""Top-k of each row of a vocabulary-wide table, in launches a captured step can afford.

``torch.topk`` over a row of tens of thousands of entries takes CUDA's multi-block radix select,
about ten kernels a call, four of them scans and memsets (on the H200, about 380 of the 871 us the
compiled drafting of a tree of depth 7 and top-8 spent on its kernels went to its seven calls). The
top k of each CHUNK-wide slice of a row, then the top k of those, takes the single-block select
twice: three or four kernels. It is exact: each of a row's k largest entries is among the k
largest of its own slice. Ties may come out in another order than ``torch.topk``'s, which leaves
the order of equal entries unspecified too. On a CPU, where a top-k is one loop over the row and
the slices cost twice to four times as much, ``torch.topk`` runs as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 512  # slice width: torch.topk keeps to its single-block select for up to 799-wide slices


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] -> (values [R, k], indices [R, k] int64): each row's k largest, largest first."""
    if x.device.type == "cuda" and x.shape[1] > 2 * CHUNK and k <= CHUNK:
        return chunked_topk(x, k)
    top = x.topk(k, dim=-1)
    return top.values, top.indices


def chunked_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """row_topk over slices (any device; rows wider than 2 * CHUNK, k at most CHUNK)."""
    R, V = x.shape
    pad = -V % CHUNK
    if pad:  # padding never beats a real entry: at least 2 * CHUNK > k real ones per row
        x = F.pad(x, (0, pad), value=float("-inf"))
    C = x.shape[1] // CHUNK
    part = x.view(R, C, CHUNK).topk(k, dim=-1, sorted=False)  # [R, C, k] each slice's k largest
    offsets = torch.arange(C, device=x.device).view(1, C, 1) * CHUNK
    values, pick = part.values.reshape(R, C * k).topk(k, dim=-1)  # [R, k]
    indices = (part.indices + offsets).reshape(R, C * k).gather(1, pick)  # [R, k]
    return values, indices.clamp(max=V - 1)  # clamp: a row with fewer than k finite entries
