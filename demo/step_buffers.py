"""A draft shape's persistent step buffers: every tensor a decoding step reads or writes, allocated
once per shape, so that the same step functions run eagerly or replay CUDA graphs captured over them
(demo/capture.py). Nothing here is ever rebound once allocated: a step writes into these tensors.

- ``StepBuffers``: the verification's rows (the target's last token, then the drafts), the packed
  result (demo/step_result.py), the acceptance test's draws, the prompt's staging, the token history
  a lookup reads, the proposer's own state (``draft``: demo/proposers/) and, for a tree, ``tree``;
- ``TreeBuffers``: what a tree's verification and acceptance test read (its slots, mask, parents,
  depths, log q, and q where drafts are sampled).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from demo.config import DraftShape
from demo.sampling import Draws
from demo.step_result import packed_size


@dataclass
class TreeBuffers:
    """A tree step's own persistent tensors (N draft nodes, a lookup branch's included; W = N + 1 verified)."""

    root_token: torch.Tensor  # [1] int64: the last emitted token, the tree's root
    root_slot: torch.Tensor  # [1] int64: its position, and the slot where the tree starts
    verify_slots: torch.Tensor  # [1, W] int64: root_slot + node index
    verify_mask: torch.Tensor  # [1, 1, W, S] bool (tree_attention_mask), or int32 in slot order (Target.ordered_masks)
    parents: torch.Tensor  # [W] int64
    depths: torch.Tensor  # [W] int64
    draft_logq: torch.Tensor  # [W] float32: log q of each node's token at its parent
    q_row: torch.Tensor  # [W] int64: the row of q each node was drawn from (sampled drafts)
    q: torch.Tensor | None  # [R, V] float32: the proposer's q over the target vocabulary (sampled drafts)
    uniforms: torch.Tensor | None  # the draws of sampled drafts, made before the step: [D, K*K] float32 (i.i.d.), [D, K, Vd] (wor)
    draft_to_target: torch.Tensor | None  # [Vd] int64: target id of every draft id; None: the same ids


@dataclass
class StepBuffers:
    """Persistent tensors of one draft shape: every graph input and output lives here. A chain uses
    the verify_* fields as they are; a tree (``tree`` set) stages its root in ``tree.root_*`` and
    builds verify_* each step."""

    shape: DraftShape
    verify_tokens: torch.Tensor  # [1, W] int64, W = shape.width: the target's last token, then the drafts
    verify_positions: torch.Tensor  # [1, W] int64
    result: torch.Tensor  # [packed_size(R, N)] float64: demo/step_result.py's layout (R: shape.reach, N: shape.verified)
    draws: Draws  # T > 0: the acceptance test's draws, made before the step: u [D] (a chain) or [N], noise [V]
    temperature: torch.Tensor  # [1] float32: the request's at T > 0 (a buffer: the graphs replay any)
    prefill_ids: torch.Tensor  # [1, C] int64: the prompt, padded to its bucket (C: the context)
    prefill_positions: torch.Tensor  # [1, C] int64: 0..C-1
    prefill_last: torch.Tensor  # [1] int64: the prompt's last row
    # [C + R + 2] int64: the prompt and every emitted token, by position, which a lookup copies from (a tree's
    # lookup branch, the ngram method); None: none reads it. Written by the prefill and each acceptance test,
    # past the accepted tokens too: a position's entry is final once the text reaches it.
    history: torch.Tensor | None = None
    draft: object | None = None  # the proposer's own persistent tensors (Proposer.allocate), None: none
    tree: TreeBuffers | None = None
    replicas: dict = field(default_factory=dict)  # graph mode: attend bucket -> its two alternating steps [Replica]
    graphs: dict = field(default_factory=dict)  # name -> CapturedStep
    capture: object | None = None  # graph mode: what later captures of more buckets reuse (CaptureState)

    @property
    def k(self) -> int:
        return self.shape.depth


def state_tensors(b: StepBuffers) -> list[torch.Tensor]:
    """Every persistent tensor of a shape's step (its own, its tree's and its proposer's)."""
    parts = [b] + [p for p in (b.tree, b.draft) if p is not None]
    return [t for part in parts for f in fields(part) if isinstance(t := getattr(part, f.name), torch.Tensor)]


def allocate(shape: DraftShape, target, proposer, max_context: int, dtype: torch.dtype) -> StepBuffers:
    """The persistent buffers of a draft shape, in the state every step function starts from; the
    proposer's own (``draft``) in `dtype`, the dtype it computes in."""
    shape.check()
    dev, t, k, reach = target.device, target, shape.depth, shape.reach
    zeros = lambda *s, dtype=torch.int64: torch.zeros(*s, dtype=dtype, device=dev)  # noqa: E731
    b = StepBuffers(
        shape=shape,
        verify_tokens=zeros(1, shape.width),
        verify_positions=torch.arange(shape.width, device=dev).view(1, -1),
        result=zeros(packed_size(reach, shape.verified), dtype=torch.float64),
        # noise of ones: a capture's runs over them divide by it
        draws=Draws(zeros(shape.width - 1 if shape.tree else k, dtype=torch.float32),
                    torch.ones(t.config.vocab_size, device=dev)),
        temperature=torch.ones(1, device=dev),
        prefill_ids=zeros(1, max_context),
        prefill_positions=torch.arange(max_context, device=dev).view(1, -1),
        prefill_last=zeros(1),
        history=zeros(max_context + reach + 2) if k and (shape.lookup or proposer.reads_history) else None,
        draft=proposer.allocate(shape, target, dtype) if k else None,
    )
    if shape.tree:
        w, r, vd = shape.width, 1 + (k - 1) * shape.topk, proposer.drafting_vocab
        to_target = proposer.to_target(torch.arange(vd, device=dev))  # [Vd]
        same_ids = vd == t.config.vocab_size and bool((to_target == torch.arange(vd, device=dev)).all())
        b.tree = TreeBuffers(
            root_token=zeros(1), root_slot=zeros(1), verify_slots=torch.arange(w, device=dev).view(1, -1),
            verify_mask=zeros(1, 1, w, t.cache.capacity, dtype=torch.int32 if t.ordered_masks(w) else torch.bool),
            parents=zeros(w), depths=zeros(w),
            draft_logq=zeros(w, dtype=torch.float32), q_row=zeros(w),
            q=zeros(r, t.config.vocab_size, dtype=torch.float32) if shape.sampled else None,
            uniforms=(zeros(*((k, shape.topk, vd) if shape.without_replacement else (k, shape.topk ** 2)),
                            dtype=torch.float32) if shape.sampled else None),
            draft_to_target=None if same_ids else to_target)
    return b
