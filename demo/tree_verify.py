"""Tree verification: which root-to-node path of a draft tree the target accepts, and its own token.

One decoding step verifies a tree of N+1 nodes (EAGLE-2 / EAGLE-3 dynamic trees; SGLang's
``speculative_eagle_topk`` / ``num_steps`` / ``num_draft_tokens``):

- node 0 is the root, the last emitted token (already correct); nodes 1..N are drafts;
- ``tokens`` [N+1] int64: target vocabulary ids, tokens[0] the root token;
- ``parents`` [N+1] int64: parents[i] < i for i >= 1, parents[0] = 0;
- ``depths`` [N+1] int64: depths[0] = 0, depths[i] = depths[parents[i]] + 1 <= D (a Python int);
- a node's children appear in increasing index order, the order they are TRIED in (the drafter's
  preference, or the order they were drawn in). Siblings are distinct tokens in point-mass (top-k)
  trees and in trees drawn without replacement; in i.i.d. q-sampled trees they may repeat;
- row i of ``probs`` [N+1, V] (or ``logits`` for T = 0) is the target's distribution of the token
  AFTER node i, already processed by ``demo.sampling.target_probs``;
- q-sampled trees add ``q`` [R, V], the drafter's distributions over the target vocabulary, and
  ``q_row`` [N+1] int64, the row node i was drawn from (its parent's; q_row[0] unused). A node's
  children may be any prefix of its draws, its length decided without looking at them (demo/tree.py
  prunes so): dropping the later draws of a sequence leaves a sequence drawn the same way.

Every rule returns ``(num_accepted: [] int64, path: [D] int64, out_tokens: [D+1] int64)``: path[j]
is the accepted node at depth j+1 for j < num_accepted (0 after); out_tokens[:num_accepted] are the
accepted drafts and out_tokens[num_accepted] the target's own token (the correction after a
rejection, or the bonus drawn at the deepest accepted node); entries after it are 0.

The rules, each exact (the emitted tokens are distributed as the target's):

- T = 0 (``verify_tree_greedy``): from the root, follow the child equal to the target's argmax;
  emit the argmax at the deepest node reached.
- T > 0, deterministic drafts (``verify_tree_pointmass``; EAGLE's sibling rule, i.e. Leviathan et
  al. 2023 with q = one-hot, repeated over siblings): at a node with target p, try its children in
  order, accepting child x with probability p(x); after a rejection set p(x) = 0, renormalise and try
  the next sibling; when every child fails (or there is none) sample from what is left of p. The
  residual masses are deterministic, so all siblings are decided at once: the i-th child is accepted
  iff u_i * (1 - sum_{j<i} p(x_j)) < p(x_i), the first such i wins.
- T > 0, drafts sampled from q (``verify_tree_q``; SpecInfer's multi-step speculative sampling,
  Miao et al. 2024, Algorithm 2 / Theorem 4.2; on a chain the standard rule of Leviathan et al.
  2023): try the children in order, accepting x with probability min(1, p(x) / q(x)); after a
  rejection set p <- max(0, p - q) renormalised (q unchanged) and try the next sibling; when every
  child fails sample from the last residual; at a node with no children sample p (the bonus).
  Exact when a node's children are i.i.d. draws from q.
- T > 0, drafts drawn from q without replacement (``verify_tree_wor``; recursive rejection sampling,
  Jeon et al. 2024, "Recursive Speculative Decoding"; on a chain the standard rule again): try the
  children in order, accepting x with probability min(1, p_r(x) / q_r(x)); after a rejection set
  p_{r+1} = max(0, p_r - q_r) renormalised and q_{r+1} = q_r with x removed, renormalised; when every
  child fails sample from the last p. Exact when a node's children x_1, x_2, ... are drawn in turn
  from q_1 = q, q_2, ... (``tree_wor_rule`` has the argument).
Zero-mass edge cases: a residual with no mass left falls back to the distribution it came from
(only float rounding gets there: a mass-1 set of children is accepted with probability 1), and
q(x) = 0 never divides (acceptance is tested as u * q(x) < p(x)).

No blocking CPU operations: no ``.item()``, ``.tolist()``, branching on tensor values or
data-dependent shapes, so every rule can be captured in a CUDA graph. The loops run over the Python
ints D and max_children. Random draws come from the ``torch.Generator`` passed in; the ``*_rule``
functions take the draws as arguments (pure, so tests can vmap them over many draws).
"""

from __future__ import annotations

import torch


def verify_tree_greedy(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                       logits: torch.Tensor, D: int):
    """tokens, parents, depths: [N+1] int64; logits: [N+1, V] -> (num_accepted: [], path: [D],
    out_tokens: [D+1]). A draft is accepted iff it equals the argmax of its parent's row and its
    parent is accepted; the first such sibling wins if two are equal (only in repeated-token trees)."""
    target_ids = logits.argmax(-1)  # [N+1]
    match = tokens == target_ids[parents]  # [N+1] bool
    chosen = _first_among_siblings(match, _earlier_siblings(parents))  # [N+1] bool
    num_accepted, path, deepest = _accepted_path(chosen, parents, depths, D)
    token = target_ids.index_select(0, deepest.view(1)).squeeze(0)  # [] the argmax there
    return num_accepted, path, _emit(tokens, path, num_accepted, token)


def verify_tree_pointmass(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                          probs: torch.Tensor, D: int, generator: torch.Generator | None):
    """tokens, parents, depths: [N+1] int64; probs: [N+1, V] float32 -> (num_accepted: [],
    path: [D], out_tokens: [D+1]). EAGLE's sibling rule for deterministic drafts; on a chain it makes
    the same draws in the same order as demo.sampling.verify_sampled, so it returns the same tokens."""
    n_drafts = tokens.shape[0] - 1
    u = torch.rand(n_drafts, generator=generator, device=probs.device)  # [N] one per draft
    noise = torch.empty_like(probs[0]).exponential_(generator=generator)  # [V]
    return tree_pointmass_rule(tokens, parents, depths, probs, D, u, noise)


def tree_pointmass_rule(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                        probs: torch.Tensor, D: int, u: torch.Tensor, noise: torch.Tensor):
    """verify_tree_pointmass with its draws given: u [N] uniforms in [0, 1), one per draft (node i
    uses u[i-1]), noise [V] Exp(1) for the exponential race of the target's own token."""
    idx = torch.arange(tokens.shape[0], device=tokens.device)  # [N+1]
    u = torch.cat((u.new_ones(1), u))  # [N+1]; the root's entry is never used
    earlier = _earlier_siblings(parents)  # [N+1, N+1] bool: j is an earlier sibling of i
    repeat = (earlier & (tokens[None, :] == tokens[:, None])).any(1)  # [N+1] token already tried
    p_x = probs[parents, tokens] * (~repeat).to(probs.dtype)  # [N+1] p_parent(x_i); 0 once removed
    tried = (earlier.to(probs.dtype) * p_x[None, :]).sum(1)  # [N+1] mass of the earlier siblings
    left = (1.0 - tried).clamp(min=0.0)  # [N+1] mass still in p when child i is tried
    accept = (p_x > 0) & (u * left < p_x)  # [N+1] accept with p(x) / left, given the earlier failed
    chosen = _first_among_siblings(accept, earlier)  # [N+1] bool
    num_accepted, path, deepest = _accepted_path(chosen, parents, depths, D)
    p = probs.index_select(0, deepest.view(1)).squeeze(0)  # [V] the deepest accepted node's row
    kids = ((parents == deepest) & (idx >= 1)).to(p.dtype)  # [N+1] its children, all rejected
    removed = torch.zeros_like(p).index_add(0, tokens, kids) > 0  # [V] their tokens
    residual = _or_fallback(p.masked_fill(removed, 0.0), p)  # [V] unnormalised
    token = (residual / noise).argmax()  # [] exponential race: a sample from residual / sum
    return num_accepted, path, _emit(tokens, path, num_accepted, token)


def verify_tree_q(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                  probs: torch.Tensor, q: torch.Tensor, q_row: torch.Tensor, D: int,
                  generator: torch.Generator | None, max_children: int | None = None):
    """tokens, parents, depths, q_row: [N+1] int64; probs: [N+1, V] float32; q: [R, V] float32 ->
    (num_accepted: [], path: [D], out_tokens: [D+1]). SpecInfer's multi-step speculative sampling.

    max_children: a Python int >= the most children of any node (SGLang's topk); the residuals are
    iterated that many times. None: N, always enough."""
    u, noise = _draws(tokens, probs, generator)
    return tree_q_rule(tokens, parents, depths, probs, q, q_row, D, u, noise, max_children)


def verify_tree_wor(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                    probs: torch.Tensor, q: torch.Tensor, q_row: torch.Tensor, D: int,
                    generator: torch.Generator | None, max_children: int | None = None):
    """tokens, parents, depths, q_row: [N+1] int64; probs: [N+1, V] float32; q: [R, V] float32 ->
    (num_accepted: [], path: [D], out_tokens: [D+1]). Recursive rejection sampling over siblings
    drawn without replacement; max_children as verify_tree_q's."""
    u, noise = _draws(tokens, probs, generator)
    return tree_wor_rule(tokens, parents, depths, probs, q, q_row, D, u, noise, max_children)


def tree_q_rule(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                probs: torch.Tensor, q: torch.Tensor, q_row: torch.Tensor, D: int,
                u: torch.Tensor, noise: torch.Tensor, max_children: int | None = None):
    """verify_tree_q with its draws given: u [N] uniforms in [0, 1), one per draft (node i uses
    u[i-1]), noise [V] Exp(1) for the exponential race of the target's own token. After r rejections
    at a node its residual is max(0, p_r - q) renormalised, q unchanged (_sampled_tree_rule)."""
    return _sampled_tree_rule(tokens, parents, depths, probs, q, q_row, D, u, noise, max_children, False)


def tree_wor_rule(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                  probs: torch.Tensor, q: torch.Tensor, q_row: torch.Tensor, D: int,
                  u: torch.Tensor, noise: torch.Tensor, max_children: int | None = None):
    """verify_tree_wor with its draws given: u [N] uniforms in [0, 1), one per draft (node i uses
    u[i-1]), noise [V] Exp(1) for the exponential race of the target's own token.

    Why it is exact. At a node with target p and drafter q, children x_1, x_2, ... are drawn in
    turn, x_r from q_r (q_1 = q; q_{r+1} is q_r without x_r, renormalised: sampling without
    replacement). Claim: started at child r with p_r, the rule emits y with probability p_r(y),
    whatever x_1..x_{r-1} were. Past the last child it samples p_r itself. Otherwise x_r ~ q_r is
    accepted with probability min(1, p_r(x_r) / q_r(x_r)), so y is accepted with probability
    min(q_r(y), p_r(y)); after a rejection, which happens with probability
    1 - sum_y min(p_r, q_r) = sum_y max(0, p_r - q_r), the rest emits p_{r+1} = max(0, p_r - q_r)
    normalised (by the claim at r + 1: p_{r+1} does not depend on x_r). In all, y comes out with
    probability min(q_r(y), p_r(y)) + max(0, p_r(y) - q_r(y)) = p_r(y). At r = 1 that is p: the
    token after the node is the target's. An accepted child's own children were drawn from the
    drafter at that child, after it and apart from its siblings' draws, so the same holds one depth
    down, and by induction for every token the step emits. With one child per node (a chain) this
    is Leviathan et al.'s rule; with q_r left unchanged it would be SpecInfer's, which is exact
    only for i.i.d. siblings. A sibling's presence may depend on anything but its own draw and the
    later ones (a prefix of the draws, demo/tree.py's pruning): the claim at r holds whether the
    rule tries x_r or samples p_r there.

    A child with q_r(x) = 0 (a draw past the drafter's support, or float underflow) is never
    accepted and leaves p as it was; a residual with no mass left falls back to the distribution
    it came from (only float rounding gets there: then p_r <= q_r everywhere, so p_r = q_r and the
    child was accepted)."""
    return _sampled_tree_rule(tokens, parents, depths, probs, q, q_row, D, u, noise, max_children, True)


def _sampled_tree_rule(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                   probs: torch.Tensor, q: torch.Tensor, q_row: torch.Tensor, D: int,
                   u: torch.Tensor, noise: torch.Tensor, max_children: int | None,
                   without_replacement: bool):
    """The q and wor rules (their docstrings), every node at once. What child r of a node is tried
    against (p_r, and q_r for wor) depends only on that node's p, q and earlier children, never on
    which path the walk takes, so round r computes the r-th residual of every node together
    ([N+1, V] per round, max_children rounds) instead of walking D depths of max_children residuals
    one [V] at a time: a step's acceptance test is max_children dependent passes over the tree, not
    D x max_children. The walk itself is then the greedy rule's: the first accepted child of each
    node, followed from the root."""
    n_nodes = tokens.shape[0]  # N+1
    max_children = n_nodes - 1 if max_children is None else max_children
    idx = torch.arange(n_nodes, device=tokens.device)  # [N+1]
    u = torch.cat((u.new_ones(1), u))  # [N+1]; the root's entry is never used
    earlier = _earlier_siblings(parents)  # [N+1, N+1] bool
    rank = earlier.sum(1)  # [N+1] position among its siblings: the draw order
    # The residuals live in q's rows: q row j is the distribution one node's children were drawn
    # from, so only R nodes (the expanded ones, fewer than N+1 in a tree) have residuals to update.
    drawn_from = (q_row[None, :] == torch.arange(q.shape[0], device=q.device)[:, None]) & (idx[None, :] >= 1)  # [R, N+1]
    node_of_row = (drawn_from * parents[None, :]).amax(1)  # [R] the node whose children row j drew (0 if none kept)
    p = probs.index_select(0, node_of_row)  # [R, V] p_1 at each expanded node
    qv = q  # [R, V] q_1: what its children came from
    columns = torch.arange(q.shape[1], device=q.device)[None, :]  # [1, V]
    p_at = torch.zeros_like(probs[:, 0])  # [N+1] p_r(x_r): what child r is tried against, at its parent
    q_at = torch.zeros_like(p_at)  # [N+1] q_r(x_r): the probability it was drawn with
    for r in range(max_children):
        this = drawn_from & (rank[None, :] == r)  # [R, N+1] each row's r-th child, if it has one
        has = this.any(1, keepdim=True)  # [R, 1]
        x = (this * tokens[None, :]).sum(1, keepdim=True)  # [R, 1] its token (0 if none)
        p_at = torch.where(rank == r, p.gather(1, x).squeeze(1)[q_row], p_at)
        q_at = torch.where(rank == r, qv.gather(1, x).squeeze(1)[q_row], q_at)
        residual = (p - qv).clamp(min=0.0)  # [R, V] p_{r+1} unnormalised; one row sum serves both the
        total = residual.sum(-1, keepdim=True)  # normalising and the fallback to p where no mass is left
        p = torch.where(has & (total > 0), residual / total, p)  # p_{r+1}
        if without_replacement:  # q_{r+1}: x_r cannot come again; what is left sums to 1 - q_r(x_r)
            left = 1.0 - qv.gather(1, x)  # [R, 1]
            q_next = torch.where(columns == x, 0.0, qv) / torch.where(left > 0, left, 1.0)  # (pointwise: no scatter)
            qv = torch.where(has, torch.where(left > 0, q_next, 0.0), qv)
    accept = (idx >= 1) & (u * q_at < p_at)  # [N+1] min(1, p_r(x) / q_r(x)) without dividing
    if without_replacement:
        accept = accept & (q_at > 0)
    chosen = _first_among_siblings(accept, earlier)  # [N+1] bool
    num_accepted, path, deepest = _accepted_path(chosen, parents, depths, D)
    # every child of the deepest accepted node failed (p is what they left in its row) or it has
    # none (p is its own target row)
    kids = (parents == deepest) & (idx >= 1)  # [N+1]
    row = (kids * q_row).amax()  # [] its q row, if it has children
    final = torch.where(kids.any(), p.index_select(0, row.view(1)), probs.index_select(0, deepest.view(1))).squeeze(0)
    token = (final / noise).argmax()  # [] exponential race
    return num_accepted, path, _emit(tokens, path, num_accepted, token)


def _draws(tokens: torch.Tensor, probs: torch.Tensor, generator: torch.Generator | None):
    """A sampled rule's draws: u [N] uniforms, one per draft, and noise [V] Exp(1) for the
    exponential race of the target's own token (tokens [N+1], probs [N+1, V])."""
    u = torch.rand(tokens.shape[0] - 1, generator=generator, device=probs.device)  # [N]
    noise = torch.empty_like(probs[0]).exponential_(generator=generator)  # [V]
    return u, noise


def _earlier_siblings(parents: torch.Tensor) -> torch.Tensor:
    """parents: [N+1] -> [N+1, N+1] bool: [i, j] iff j is a draft sibling of draft i with j < i."""
    idx = torch.arange(parents.shape[0], device=parents.device)  # [N+1]
    same_parent = parents[:, None] == parents[None, :]
    return same_parent & (idx[None, :] < idx[:, None]) & (idx[None, :] >= 1)


def _first_among_siblings(flag: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """flag: [N+1] bool; earlier: [N+1, N+1] bool -> [N+1] bool: flag[i] and no earlier sibling
    of i is flagged."""
    return flag & ~(earlier & flag[None, :]).any(1)


def _accepted_path(chosen: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, D: int):
    """chosen: [N+1] bool, at most one per parent -> (num_accepted: [], path: [D], deepest: []).
    A node is accepted iff it and all its ancestors below the root are chosen."""
    idx = torch.arange(parents.shape[0], device=parents.device)  # [N+1]
    on = chosen | (idx == 0)  # [N+1]
    for _ in range(D):  # after D rounds each node has looked at all its ancestors
        on = on & on[parents]
    levels = torch.arange(1, D + 1, device=parents.device)  # [D]
    at_level = on[None, :] & (depths[None, :] == levels[:, None])  # [D, N+1] one node per level at most
    path = (at_level * idx[None, :]).sum(1)  # [D]
    num_accepted = at_level.any(1).sum()  # []
    deepest = (on & (depths == num_accepted)) * idx  # [N+1] nonzero only at the deepest node
    return num_accepted, path, deepest.sum()


def _emit(tokens: torch.Tensor, path: torch.Tensor, num_accepted: torch.Tensor,
          token: torch.Tensor) -> torch.Tensor:
    """tokens: [N+1], path: [D], num_accepted: [], token: [] -> out_tokens: [D+1]."""
    j = torch.arange(path.shape[0] + 1, device=path.device)  # [D+1]
    drafts = tokens[torch.cat((path, path.new_zeros(1)))]  # [D+1]
    drafts = torch.where(j < num_accepted, drafts, 0)
    return torch.where(j == num_accepted, token, drafts)


def _or_fallback(p: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """p, fallback: [..., V] -> p, or fallback in each row where p has no mass left."""
    return torch.where(p.sum(-1, keepdim=True) > 0, p, fallback)
