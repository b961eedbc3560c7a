"""A static KV cache whose slots are token positions.

Allocated once for a capacity and never grown or copied inside a decoding step. Because K/V are
written at explicit positions, rolling back a rejected draft costs nothing: the engine moves its
next write position (``StepBuffers.verify_positions``) back to one past the last emitted token; the
stale slots of rejected drafts are hidden by the causal slot mask (a query at position p sees slots
0..p) until later tokens overwrite them.
"""

from __future__ import annotations

import torch


class CacheInUse(RuntimeError):
    """A generation asked for a KV cache that another generation still holds (Target.hold_cache)."""


class KVCache:
    """K/V tensors of shape [layers, B, nkv, S, hd], S = capacity in positions."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, batch, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        """Number of position slots."""
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V views of layer i, each [B, nkv, S, hd]."""
        return self.k[i], self.v[i]
