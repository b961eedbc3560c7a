"""A prompt-lookup branch for a draft tree, on the device: what `TreeShape.lookup` adds to a step (demo/engine.py).

Prompt lookup (vLLM's n-gram proposer) drafts by copying: it finds the latest earlier
occurrence of the text's last few tokens and proposes what followed it. Beside an EAGLE tree it costs
no drafter pass, so it reaches past the tree's depth where the text repeats itself; `python -m
demo.bench.lookup` estimates what that adds. Here are the two device halves of such a step:

- ``lookup_continuation``: the copy, over a static token history, with no host read;
- ``graft_branch``: the copy hung on the drafter's tree at the deepest node whose path it repeats, so
  the branch extends an agreeing path instead of duplicating it, and a node's children stay distinct
  tokens (what greedy and point-mass verification assume: demo/tree_verify.py).

Greedy verification keeps any candidate set exact, so the branch changes how many forwards a reply
takes, never its tokens. Drafts sampled from q (the q and wor rules) are exact only for draws, so
the branch is for deterministic trees.
"""

from __future__ import annotations

import torch


def lookup_continuation(history: torch.Tensor, length: torch.Tensor, count: int, max_ngram: int):
    """The `count` tokens a prompt lookup drafts after history[:length]: what followed the latest
    earlier occurrence of its longest suffix of at most max_ngram tokens, going on as the repeat it
    is where the copy reaches the end (``demo.bench.lookup.continuation``, which this matches).

    history: [S] int64 (entries from `length` on are ignored); length: [] int64, at least 1 ->
    (tokens [count] int64, found [] bool); where nothing repeats, found is False and the tokens are
    the last token repeated (any token is safe to verify). Static shapes, no host read."""
    S = history.shape[0]
    at = torch.arange(S, device=history.device)  # [S] the end index of a candidate occurrence
    last = length - 1
    match = torch.ones(S, dtype=torch.bool, device=history.device)
    end = torch.full((), -1, dtype=torch.int64, device=history.device)
    for n in range(1, max_ngram + 1):
        i = n - 1  # compare the n-th token from the end
        nth = history.index_select(0, (last - i).clamp(min=0).view(1))  # [1] (a 0-dim index would read the host)
        match = match & (at >= i) & (history[(at - i).clamp(min=0)] == nth)
        ok = match & (at <= last - 1)  # an earlier occurrence: it ends before the last token
        latest = torch.where(ok, at, -1).max()  # []
        end = torch.where((latest >= 0) & (n <= last), latest, end)  # a longer suffix wins
    found = end >= 0
    start = end + 1
    period = (length - start).clamp(min=1)
    t = torch.arange(count, device=history.device)
    tokens = history[torch.where(found, start + t % period, last)]  # [count]
    return tokens, found


def graft_branch(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, branch: torch.Tensor,
                 depth: int, size: int):
    """Hang `size` nodes of a lookup branch on a tree: walk down from the root while a child's token
    is the branch's next one (the first such child: the drafter's order), then append the branch's
    next `size` tokens as a chain under the node reached.

    tokens, parents, depths: [N+1] int64 (demo/tree_verify.py's tree: root first, parents before
    children, distinct siblings, depths at most `depth`); branch: [depth + size] int64 ->
    (tokens, parents, depths): [N+1+size] each, the same tree first. The new chain's first token
    differs from every child of the node it hangs on (the walk stopped there, or that node is at
    `depth`, which has none), so siblings stay distinct; its nodes reach depth + size at most."""
    n = tokens.shape[0]
    idx = torch.arange(n, device=tokens.device)  # [N+1]
    node = torch.zeros((), dtype=torch.int64, device=tokens.device)  # the root
    walked = torch.zeros((), dtype=torch.int64, device=tokens.device)
    going = torch.ones((), dtype=torch.bool, device=tokens.device)
    for d in range(depth):
        child = (parents == node) & (tokens == branch[d]) & (idx >= 1)  # [N+1] at most one (distinct siblings)
        going = going & child.any()
        node = torch.where(going, torch.where(child, idx, n).min(), node)
        walked = walked + going.long()
    new = torch.arange(size, device=tokens.device)  # [size]
    new_tokens = branch[walked + new]
    new_parents = torch.where(new == 0, node, n + new - 1)
    new_depths = depths.index_select(0, node.view(1)) + 1 + new  # [size]
    return torch.cat((tokens, new_tokens)), torch.cat((parents, new_parents)), torch.cat((depths, new_depths))
