"""What one decoding step leaves for the host: the packed step result, one float64 tensor on the
device read with one host sync (token ids below 2**53 are exact), the host's reading of it, and the
``StepEvent`` the engine yields.

Layout: [accepted n, emitted tokens (D+1), their target probabilities (D+1), accepted path (D node
ids), draft node tokens (N), their parents (N), q (N; -1: not computed), p (N), the target's top ids
and p at each emitted position (2 x (D+1) x TOP_SHOWN), a chain proposer's top ids and q at each
draft position (2 x D x TOP_SHOWN; q -1: not kept)]. A chain of k is the tree whose node i+1 hangs
from node i (D = N = k).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from demo.metrics import AcceptanceStats
from demo.tree import DraftTree

TOP_SHOWN = 5  # candidates per position an event carries for inspection (the target's, a chain proposer's)


@dataclass
class StepEvent:
    """What one decoding step did. Step 0 is the prefill, which emits the target's first token."""

    step: int
    draft_ids: list[int]  # the drafts verified (target vocabulary): a chain's k, or a tree's nodes; []: none
    num_accepted: int  # drafts the target confirmed, along the accepted path
    token_ids: list[int]  # emitted: accepted drafts, then the target's own token (cut at stop/budget)
    token_probs: list[float]  # each emitted token's probability under the target's distribution
    resampled: bool  # T > 0 and the target's own token was drawn after a rejection
    draft_ms: float
    verify_ms: float  # prefill time at step 0
    stats: AcceptanceStats  # running totals after this step (a snapshot)
    finished: bool = False
    finish_reason: str | None = None  # "stop" (a stop token), "length" or "time" (gen.max_time_s)
    tree: DraftTree | None = None  # the step's drafts as a tree (a chain is a path), with q, p and the accepted path
    # what a step inspector shows: per emitted token, the target's TOP_SHOWN best (token, p) at its
    # position; per chain draft position, the proposer's (token, q) (trees: the tree's siblings are its candidates)
    target_top: list[list[tuple[int, float]]] = field(default_factory=list)
    draft_top: list[list[tuple[int, float]]] | None = None



def packed_size(depth: int, nodes: int) -> int:
    return 1 + 2 * (depth + 1) + depth + 4 * nodes + 2 * TOP_SHOWN * (2 * depth + 1)


def pack_result(n: torch.Tensor, tokens: torch.Tensor, token_probs: torch.Tensor, path: torch.Tensor,
                nodes: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                target_top_ids: torch.Tensor, target_top_p: torch.Tensor, draft_top_ids: torch.Tensor,
                draft_top_q: torch.Tensor) -> torch.Tensor:
    """n: []; tokens, token_probs: [D+1]; path: [D]; nodes, parents, draft_probs, target_probs: [N];
    target_top_*: [D+1, TOP_SHOWN]; draft_top_*: [D, TOP_SHOWN] -> [packed_size(D, N)] float64 (on the device)."""
    parts = (n.view(1), tokens, token_probs, path, nodes, parents, draft_probs, target_probs,
             target_top_ids, target_top_p, draft_top_ids, draft_top_q)
    return torch.cat([p.reshape(-1).double() for p in parts])


def unpack_result(packed: list[float], depth: int, nodes: int, copied: int = 0):
    """The host's reading of pack_result: (accepted n, the n+1 emitted tokens, their probabilities, the
    tree, the target's top (token, p) per emitted position, a chain drafter's top (token, q) per draft
    position or None). depth: the most a step accepts (DraftShape.reach); nodes: its verified ones, of
    which the last `copied` are a lookup branch's."""
    D, N = depth, nodes
    n = int(packed[0])
    at = 1
    def take(count):  # noqa: E306
        nonlocal at
        part = packed[at:at + count]
        at += count
        return part
    tokens = [int(t) for t in take(D + 1)][: n + 1]
    probs = take(D + 1)[: n + 1]
    path = [int(i) for i in take(D)][:n]
    node_tokens = [int(t) for t in take(N)]
    parents = [int(i) for i in take(N)]
    q = take(N)
    tree = DraftTree(node_tokens, parents, None if any(x < 0 for x in q) else q, take(N), path, copied)
    def tops(rows):  # noqa: E306
        ids, values = take(rows * TOP_SHOWN), take(rows * TOP_SHOWN)
        return [[(int(t), v) for t, v in zip(ids[r * TOP_SHOWN:(r + 1) * TOP_SHOWN], values[r * TOP_SHOWN:(r + 1) * TOP_SHOWN])]
                for r in range(rows)]
    target_top = tops(D + 1)[: n + 1]
    draft_top = tops(D)
    if not draft_top or any(v < 0 for row in draft_top for _, v in row):
        draft_top = None
    return n, tokens, probs, tree, target_top, draft_top


def cut(tokens: list[int], stop: set[int], budget: int) -> tuple[list[int], str | None]:
    """Cut emitted tokens after the first stop token or at the token budget."""
    for i, t in enumerate(tokens[:budget]):
        if t in stop:
            return tokens[: i + 1], "stop"
    if len(tokens) >= budget:
        return tokens[:budget], "length"
    return tokens, None
