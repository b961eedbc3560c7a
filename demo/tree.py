"""Draft trees: what a step drafts when it drafts more than a chain (EAGLE-2 / EAGLE-3 dynamic trees).

The shape follows SGLang's flags: ``depth`` draft steps (``--speculative-num-steps``), ``topk``
children expanded per node per step (``--speculative-eagle-topk``) and ``num_draft_tokens``
tokens verified per step, the root included (``--speculative-num-draft-tokens``). A step:

1. The root is the last emitted token; the drafter's catch-up left its logits (``root_logits``).
   Its top-k tokens are the depth-1 candidates, scored by log q.
2. Each further step runs the drafter once over the frontier (the k best nodes of the last depth),
   each frontier node attending to the committed text and to its own ancestors only; each node's
   top-k children become candidates scored by cumulative log q, and the k best become the frontier.
   Drafter K/V of frontier nodes go to scratch slots past the context (``TREE_SCRATCH``), so the
   committed cache is never touched; the next catch-up rewrites the accepted path's rows.
3. The ``num_draft_tokens - 1`` best candidates overall are verified (ranked as a stable sort ranks
   them: a parent scores at least its child and comes first on a tie, so every kept node's ancestors
   are kept; ``best_in_order``), in
   candidate order, which puts parents before children and siblings in the drafter's order.
4. The target verifies all nodes in one forward: node i is written at slot root + i, with RoPE
   position root + depth(i), and sees the committed text, the root and its own ancestors only
   (``tree_attention_mask``; in slot order, as the Triton attention takes it, ``tree_seen_slots``).
   The rules of demo/tree_verify.py pick the accepted path; the engine then moves the path's target
   K/V to the slots right after the root (``compact_path``).

Sampled drafts (``sampled``: the q and wor rules at T > 0): children are drawn from the drafter's q
at the target's temperature, on uniforms drawn before the step: i.i.d. by inverse CDF (q), or without
replacement by the Gumbel-top-k trick (wor: the K largest of log q + Gumbel noise, largest first, are
K draws in turn without replacement). Their rules are exact only if the children a node keeps are
the first of its draws, however many, and how many is decided without looking at them. So a sampled
node is scored as the drafter's top choice of the same rank would be (its parent's score plus the
r-th largest log q at the parent), never by its own token: a parent scores at least its children,
an earlier draw at least a later one, and the frontier and the pruning both rank candidates as a
stable sort does (``best_in_order``). Then whether a candidate is kept depends only on candidates
ranked before it, none of them itself, its later siblings or anything below them (a best-first
search over the same scores, which looks at each draw only after keeping it, keeps the same set),
and a tree pruned to num_draft_tokens stays exact.

A chain is a tree with topk = 1; ``DraftShape`` says which machinery a step runs. Every function
here runs on the device over static shapes without host syncs, so it is captured as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from demo.config import DraftShape
from demo.kernels.topk import row_topk


@dataclass
class DraftTree:
    """One step's tree as the event carries it (host lists): nodes 1..N, node 0 being the root."""

    tokens: list[int]  # [N] target ids of the draft nodes
    parents: list[int]  # [N] parent node of each (0: the root)
    draft_probs: list[float] | None  # [N] q: the drafter's probability of the node's token at its parent
    target_probs: list[float]  # [N] p: the target's probability of it there
    path: list[int]  # accepted nodes by depth (node ids 1..N)
    copied: int = 0  # the last `copied` nodes are a prompt-lookup branch's (demo/proposers/ngram.py): q 0, not drafted

    def is_copied(self, node: int) -> bool:
        """Whether node `node` (1..N) was copied from the text, not drafted by the drafter."""
        return node > len(self.tokens) - self.copied

    @property
    def depths(self) -> list[int]:
        depth = [0]
        for parent in self.parents:
            depth.append(depth[parent] + 1)
        return depth[1:]


@dataclass
class TreeDraft:
    """The drafted tree on the device: verify_tokens [N+1] (root first), parents, depths [N+1],
    draft_logq [N+1] (log q of each node's token at its parent; 0 at the root), q_row [N+1] (row of
    the step's q table each node was drawn from) and q [R, Vd] (sampled drafts only)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_logq: torch.Tensor
    q_row: torch.Tensor
    q: torch.Tensor | None


CDF_BLOCK = 256  # inverse_cdf's block: a scan of 256 and one of V / 256, never one of V


def inverse_cdf(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """q: [F, V] probabilities (rows need not sum to 1), u: [F, K] uniforms in [0, 1) -> [F, K] int64:
    the token whose cumulative mass first passes u * sum(q), one draw of q per uniform.

    The cumulative sum is taken in two levels (within blocks of CDF_BLOCK tokens, then over the
    blocks' totals) and searched block first: the same inverse CDF, but no scan over the whole
    vocabulary, which inductor (torch 2.11) splits and then fails to generate code for on a GPU."""
    F, V = q.shape
    pad = (-V) % CDF_BLOCK
    within = torch.nn.functional.pad(q, (0, pad)).view(F, -1, CDF_BLOCK).cumsum(-1)  # [F, nb, B]
    totals = within[..., -1].cumsum(-1)  # [F, nb] mass up to each block's end
    nb = totals.shape[-1]
    mass = u * totals[:, -1:]  # [F, K]
    block = torch.searchsorted(totals, mass, right=True).clamp(max=nb - 1)  # [F, K]
    before = torch.where(block > 0, totals.gather(1, (block - 1).clamp(min=0)), 0.0)  # [F, K] mass before it
    rows = within.gather(1, block[..., None].expand(-1, -1, CDF_BLOCK))  # [F, K, B] its running mass
    at = torch.searchsorted(rows, (mass - before)[..., None], right=True).squeeze(-1)  # [F, K]
    return (block * CDF_BLOCK + at.clamp(max=CDF_BLOCK - 1)).clamp(max=V - 1)


def draft_tree(drafter, shape: DraftShape, root_token: torch.Tensor, root_logits: torch.Tensor,
               root_hidden: torch.Tensor, draft_position: torch.Tensor, scratch_base: int,
               uniforms: torch.Tensor | None = None, temperature: torch.Tensor | None = None) -> TreeDraft:
    """Expand and prune one step's tree. No blocking CPU operation (captured as it stands).

    root_token: [1] int64; root_logits: [Vd] the drafter's logits at the root; root_hidden: [Hd]
    its hidden output there; draft_position: [] int64, the drafter position of the depth-1 rows
    (committed drafter rows are the slots before it); scratch_base: the first scratch slot (the
    drafter attends over the slots below scratch_base + (depth - 1) * topk, its scratch included);
    uniforms in [0, 1): [D, K*K] for i.i.d. draws, [D, K, Vd] for draws without replacement (depth 1
    uses the first row's first K, or its first row), and temperature: [1], for sampled drafts (q is
    the drafter's softmax at the target's temperature)."""
    D, K = shape.depth, shape.topk
    dev = root_logits.device
    cand_ids, cand_score, cand_logq, cand_parent, cand_qrow, cand_depth = [], [], [], [], [], []  # per depth
    q_rows = []  # [Vd] drafter distributions of expanded nodes (sampled drafts)

    def children(logits: torch.Tensor, d: int):
        """logits [F, Vd] at depth d -> (ids [F, K] draft ids, log q [F, K] of each, score [F, K]):
        the top k (scored by their log q), or k draws from q (scored by the k largest log q)."""
        if not shape.sampled:  # log q of the k largest logits: no [F, Vd] log-softmax written, and on
            # a GPU the logsumexp taken in the top-k's own two launches
            logq, ids = row_topk(logits, K, log_probs=True)
            return ids, logq, logq
        F = logits.shape[0]
        x = logits.float() / temperature  # [F, Vd]
        q = torch.softmax(x, dim=-1)  # [F, Vd]
        q_rows.append(q)
        if shape.without_replacement:  # Gumbel-top-k: x - log(-log u) is log q + Gumbel noise, up to a constant.
            # The draws and the scores come from one top-k over both tables stacked ([2F, Vd]): a
            # row's log-softmax shift leaves its order alone, so the perturbed rows' picks are the
            # draws, and a step launches one top-k a depth, not two.
            both = torch.cat((x - (-uniforms[d, :F].log()).log(), x))  # [2F, Vd]
            top, picks = row_topk(both, K, log_probs=True)  # [2F, K] each
            ids, score = picks[:F], top[F:]  # [F, K] distinct draws in draw order; the r-th top log q
        else:
            ids = inverse_cdf(q, uniforms[d, :F * K].view(F, K))  # [F, K]
            score = row_topk(x, K, log_probs=True)[0]  # [F, K] the r-th draw scored as the r-th top choice
        return ids, q.gather(1, ids).clamp(min=1e-30).log(), score

    ids, logq, score = children(root_logits.view(1, -1), 0)  # [1, K]
    cand_ids.append(ids.view(K))
    cand_logq.append(logq.view(K))
    cand_score.append(score.view(K))
    cand_parent.append(torch.full((K,), -1, dtype=torch.int64, device=dev))
    cand_qrow.append(torch.zeros(K, dtype=torch.int64, device=dev))
    cand_depth.append(torch.ones(K, dtype=torch.int64, device=dev))
    frontier = torch.arange(K, device=dev)  # [K] candidate index of each frontier node
    f_ids = ids.view(K)  # [K] its draft id
    f_score = score.view(K)  # [K]
    f_hidden = root_hidden.reshape(1, -1).expand(K, -1)  # [K, Hd] drafter input of each frontier row
    capacity = scratch_base + (D - 1) * K  # the drafter slots attended over
    slot_ids = torch.arange(capacity, device=dev)  # [S]
    f_seen = (slot_ids[None, :] == scratch_base + torch.arange(K, device=dev)[:, None])  # [K, S] own slot
    for d in range(1, D):
        start = K + (d - 1) * K * K  # candidate index of this expansion's first child
        tokens = drafter.to_target(f_ids).view(1, K)  # [1, K]
        positions = (draft_position + d - 1).view(1, 1).expand(1, K)  # [1, K]
        slots = (scratch_base + (d - 1) * K + torch.arange(K, device=dev)).view(1, K)  # [1, K]
        mask = ((slot_ids < draft_position)[None, :] | f_seen).view(1, 1, K, capacity)  # [1, 1, K, S]
        logits, hidden = drafter.forward(tokens, positions, f_hidden.reshape(1, K, -1), slots=slots, mask=mask,
                                         attend=capacity)
        ids, logq, score = children(logits[0], d)  # [K, K] each
        scores = (f_score[:, None] + score).view(K * K)  # [K*K] cumulative log q (by rank if sampled)
        cand_ids.append(ids.view(K * K))
        cand_logq.append(logq.view(K * K))
        cand_score.append(scores)
        cand_parent.append(frontier.repeat_interleave(K))
        cand_qrow.append((1 + (d - 1) * K + torch.arange(K, device=dev)).repeat_interleave(K))
        cand_depth.append(torch.full((K * K,), d + 1, dtype=torch.int64, device=dev))
        if d < D - 1:  # the next frontier: the k best children (sampled: ties to the first, as the pruning)
            best = best_in_order(scores, K) if shape.sampled else row_topk(scores.view(1, K * K), K)[1].view(K)  # [K]
            parent = best // K  # [K] which frontier row each came from
            frontier = start + best
            f_ids = ids.view(K * K)[best]
            f_score = scores[best]
            f_hidden = hidden[0, parent]  # [K, Hd]
            own = slot_ids[None, :] == scratch_base + d * K + torch.arange(K, device=dev)[:, None]  # [K, S]
            f_seen = f_seen[parent] | own
    all_ids = torch.cat(cand_ids)  # [M]
    scores = torch.cat(cand_score)
    if shape.nodes < shape.candidates:  # keep the best N (stable: a parent ranks before its children)
        keep = best_in_order(scores, shape.nodes)  # [N]
    else:
        keep = torch.arange(shape.candidates, device=dev)
    node_of = torch.zeros(shape.candidates + 1, dtype=torch.int64, device=dev).scatter(  # candidate + 1 -> node
        0, keep + 1, torch.arange(1, shape.nodes + 1, device=dev))  # (out of place: torch.vmap maps it over draws)
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    parents = torch.cat((zero, node_of[torch.cat(cand_parent)[keep] + 1]))  # [N+1]
    depths = torch.cat((zero, torch.cat(cand_depth)[keep]))  # [N+1]
    tokens = torch.cat((root_token.view(1), drafter.to_target(all_ids[keep])))  # [N+1]
    logq = torch.cat((torch.zeros(1, device=dev), torch.cat(cand_logq)[keep]))  # [N+1]
    q_row = torch.cat((zero, torch.cat(cand_qrow)[keep]))  # [N+1]
    q = torch.cat(q_rows) if shape.sampled else None  # [R, Vd]
    return TreeDraft(tokens, parents, depths, logq, q_row, q)


RANK_MAX_CANDIDATES = 2048  # above this, best_in_order sorts (its rank compares M x M pairs)


def best_in_order(scores: torch.Tensor, n: int) -> torch.Tensor:
    """scores [M] -> [n] int64: the indices of the n largest scores, in index order; among equal
    scores the lower index wins (what the first n of a stable descending sort keep). Each index's
    rank is the number of indices that sort before it, so no sort runs: a compiled step makes it
    one reduction, a cumulative sum and a scatter (a sort of a few hundred scores is one slow
    single-program launch on a GPU)."""
    M = scores.shape[0]
    at = torch.arange(M, device=scores.device)
    if M > RANK_MAX_CANDIDATES:
        return torch.sort(torch.argsort(scores, descending=True, stable=True)[:n]).values
    other, this = scores[None, :], scores[:, None]
    before = (other > this) | ((other == this) & (at[None, :] < at[:, None]))  # [M, M]: j sorts before i
    kept = before.sum(1) < n  # [M]
    place = torch.where(kept, kept.cumsum(0) - 1, n)  # [M] its place among the kept; n: dropped
    return torch.zeros(n + 1, dtype=torch.int64, device=scores.device).scatter(0, place, at)[:n]


def ancestors(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """parents: [N+1] (parents[0] = 0) -> [N+1, N+1] bool: [i, j] iff j is i or an ancestor of i.
    Each node's chain of ancestors is `depth` gathers of a vector (the root's parent is the root), then
    one comparison: compiled, one or two kernels, where squaring the relation took one a level."""
    at = torch.arange(parents.shape[0], device=parents.device)
    chain = [at]
    for _ in range(depth):
        chain.append(parents[chain[-1]])
    chain = torch.stack(chain, dim=1)  # [N+1, depth+1]: the node, its parent, its grandparent, ...
    return (chain[:, :, None] == at[None, None, :]).any(dim=1)


def tree_attention_mask(parents: torch.Tensor, depth: int, root_slot: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The target's mask for a tree written at slots root_slot .. root_slot + N: each node sees the
    slots before the root and its own ancestors-or-self. parents: [N+1]; root_slot: [] int64 ->
    [1, 1, N+1, S] bool."""
    anc = ancestors(parents, depth)  # [N+1, N+1]
    n = parents.shape[0]
    rel = torch.arange(num_slots, device=parents.device) - root_slot  # [S]
    in_tree = (rel >= 0) & (rel < n)
    seen = anc[:, rel.clamp(0, n - 1)] & in_tree[None, :]  # [N+1, S]
    return (seen | (rel < 0)[None, :]).view(1, 1, n, num_slots)


def tree_seen_slots(parents: torch.Tensor, depths: torch.Tensor, depth: int, root_slot: torch.Tensor,
                    num_slots: int) -> torch.Tensor:
    """``demo.kernels.attend.seen_slots(tree_attention_mask(...))`` without the mask: each node's seen slots
    in order are the slots before the root, then its ancestors-or-self at root_slot + their node id,
    by depth (node ids grow with depth), then -1. Gathers and comparisons only (no cumulative sum or
    scatter): compiled, one kernel. parents, depths: [N+1] int64; root_slot: [] int64 -> [1, 1, N+1, S]
    int32."""
    at = torch.arange(parents.shape[0], device=parents.device)
    chain = [at]
    for _ in range(depth):
        chain.append(parents[chain[-1]])
    chain = torch.stack(chain, dim=1)  # [N+1, depth+1]: the node, its parent, its grandparent, ...
    slots = torch.arange(num_slots, device=parents.device)[None, :]  # [1, S]
    j = slots - root_slot  # [1, S]: the place past the root (0: the root itself)
    d = depths[:, None]  # [N+1, 1]
    node = chain.gather(1, (d - j).clamp(0, depth))  # [N+1, S]: the ancestor at depth j (d - j steps up)
    order = torch.where(j < 0, slots, torch.where(j <= d, root_slot + node, -1))
    return order.to(torch.int32).view(1, 1, *order.shape)


def compact_path(cache, root_slot: torch.Tensor, path: torch.Tensor) -> None:
    """Move the accepted path's K/V (every layer) to the slots right after the root, in depth
    order; entries past the accepted count copy junk into slots no query sees before they are
    rewritten. cache: KVCache ([L, B, nkv, S, hd] each); root_slot: [] int64; path: [D] node ids."""
    src = root_slot + path  # [D]
    dst = root_slot + 1 + torch.arange(path.shape[0], device=path.device)  # [D]
    for t in (cache.k, cache.v):
        t.index_copy_(3, dst, t.index_select(3, src))  # gather first: src and dst may overlap
