"""The ceiling of a rule: the target drafting for itself (q = p), what each acceptance rule reaches
with a perfect drafter (``python -m demo.bench --ceiling``). A drafter's mean acceptance length is
then read as a share of its rule's ceiling on the same prompts and shape, which tells drafter
quality apart from rule quality: at T = 0 every greedy draft is accepted (k + 1 a step); at T > 0
the pointmass rule still rejects the target's top choice with probability 1 - p(x), while q and
wor accept the first draft of every node (p / q = 1): their ceiling is the deepest path a step keeps.

A measurement drafter, not a product one: it runs the whole target for every draft row.
"""

from __future__ import annotations

import torch
from torch import nn

from demo.drafter_common import EAGLE1, DrafterConfig
from demo.target import Target


class TargetDrafter(nn.Module):
    """The drafter contract (demo/drafter_common.py) over the target's own weights and a cache of its
    own. The engine's drafter row at position i pairs token x[i+1] with feature h[i] and predicts
    x[i+2]; here that row is the target's row of x[i+1], at position i + 1 and cache slot + 1, so
    its logits are the target's p there. Slot 0 holds the prompt's first token, which no drafter
    row carries: its K/V are copied from the target's cache (the same weights wrote them) before
    every pass. The weights are borrowed without being registered, so the engine's .to(dtype) of
    its drafter never converts the target."""

    feature = "hidden"
    head_in_int8 = False
    layer_in_int8 = False

    def __init__(self, target: Target):
        super().__init__()
        c = target.config
        self.cfg = DrafterConfig(method=EAGLE1, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                                 num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, vocab_size=c.vocab_size)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "inner", Target(target.hf, kernels=target.kernels))  # its own cache and RoPE tables
        self.drafting_vocab = c.vocab_size

    def share_target(self, target) -> None:
        pass  # built over it

    def stack_weights(self) -> None:
        self.inner.stack_weights()

    def setup_cache(self, capacity: int, batch: int = 1):
        return self.inner.setup_cache(capacity + 1, batch)  # slot 0 more: the prompt's first token

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features  # [B, q, H]: unused, the target reads its own tokens

    def forward(self, tokens, positions, hidden, slots=None, mask=None, logits=True, attend=None):
        """tokens, positions, slots: [1, q] int64; mask: [1, 1, q, S] bool over the engine's drafter
        slots -> (logits [1, q, V] or None, hidden [1, q, H]): the target's, one position on."""
        for own, theirs in ((self.inner.cache.k, self.target.cache.k), (self.inner.cache.v, self.target.cache.v)):
            own[:, :, :, :1].copy_(theirs[:, :, :, :1])
        slots = (positions if slots is None else slots) + 1
        if mask is not None:  # every row sees slot 0 too
            mask = torch.cat((mask.new_ones(*mask.shape[:-1], 1), mask), dim=-1)
        out = self.inner.forward(tokens, positions + 1, slots=slots, mask=mask, last_logits_only=not logits,
                                 attend=None if attend is None else attend + 1)
        return (out.logits if logits else None), out.hidden

    def select(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids
