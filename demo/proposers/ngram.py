"""Prompt lookup, the model-free n-gram method (vLLM's ``ngram``: ``prompt_lookup_min``,
``prompt_lookup_max``, ``num_speculative_tokens``): the draft is copied from where the text's last n
tokens (n from a max down to a min) appeared before, and goes on with what followed them there. No
drafter is loaded and nothing is learned, so it pays where the text repeats itself (code, lists,
quoting the prompt) and costs a wider verification where it does not.

On the device, over a static token history (``StepBuffers.history``: the prompt and every emitted
token by position, which the engine writes), with no host read, so it is captured as it stands:

- ``lookup_continuation``: the copy;
- ``NgramProposer``: the copy as a chain of k drafts, the ``ngram`` method;
- ``graft_branch``: a copy hung on another proposer's tree (an EAGLE tree's lookup branch,
  ``TreeShape.lookup``), at the deepest node whose path it repeats, so the branch extends an agreeing
  path instead of duplicating it, and a node's children stay distinct tokens (what greedy and
  point-mass verification assume: demo/tree_verify.py).

Greedy verification keeps any candidate set exact, so a copy changes how many forwards a reply
takes, never its tokens; at T > 0 a copied draft is a point mass (accepted with the target's p, the
``pointmass`` rule), exact too.
"""

from __future__ import annotations

import torch

from demo.config import LOOKUP_NGRAM
from demo.step_result import TOP_SHOWN

NGRAM_MIN = 1  # prompt_lookup_min: the shortest suffix that counts as a match
NGRAM_MAX = LOOKUP_NGRAM  # prompt_lookup_max: the longest suffix looked up (the longest found wins)


def lookup_continuation(history: torch.Tensor, length: torch.Tensor, count: int, max_ngram: int = NGRAM_MAX,
                        min_ngram: int = NGRAM_MIN):
    """The `count` tokens a prompt lookup drafts after history[:length]: what followed the latest
    earlier occurrence of its longest suffix of min_ngram to max_ngram tokens, going on as the repeat it
    is where the copy reaches the end (``demo.bench.tools.lookup.continuation``, which this matches).

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
        if n < min_ngram:
            continue
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


def copy_source(text: list[int], max_ngram: int = NGRAM_MAX, min_ngram: int = NGRAM_MIN) -> tuple[int, int] | None:
    """Where a lookup after `text` copies from, on the host (lookup_continuation's rule, for a step
    inspector): (the index in `text` of the first token copied, the length of the suffix it matched
    there), or None where nothing repeats."""
    last, found = len(text) - 1, None
    for n in range(min_ngram, min(max_ngram, last) + 1):
        suffix = text[-n:]
        end = next((e for e in range(last - 1, n - 2, -1) if text[e - n + 1:e + 1] == suffix), None)
        if end is not None:  # its latest earlier occurrence; a longer suffix found wins
            found = (end + 1, n)
    return found


class NgramProposer:
    """The ``ngram`` method: a chain of k drafts copied from the text (vLLM's NgramProposer, on the
    device). Reads no target feature and loads nothing."""

    method = "ngram"
    features = None  # it reads no target feature ...
    reads_history = True  # ... only the token history
    copies = True  # its drafts are copies of the text, not a model's
    trees = False  # a chain of the copy
    samples_drafts = False  # a copy is a point mass: the three rules coincide on it

    def __init__(self, min_ngram: int = NGRAM_MIN, max_ngram: int = NGRAM_MAX):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"an n-gram lookup needs 1 <= min <= max, not {min_ngram} and {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.drafting_vocab = 0  # the target's (bind)

    def bind(self, target, max_context: int, dtype=None, int8=False) -> None:
        self.drafting_vocab = target.config.vocab_size

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids  # it copies the target's own ids

    def allocate(self, shape, target, dtype=None) -> None:
        return None

    def stack_weights(self) -> None:
        pass

    def prefill(self, b, ids, positions, features, rows: int, attend) -> None:
        pass

    def first(self, b, token: torch.Tensor, prompt_length: int) -> None:
        pass

    def phases(self, b, attend) -> dict:
        return {"draft": lambda: self.propose(b, attend)}

    def propose(self, b, attend=None) -> None:
        """The copy after the text so far (up to the last emitted token, at verify_positions[0, 0]) as
        the chain's k drafts."""
        k = b.shape.depth
        length = b.verify_positions[0, 0] + 1  # [] the text's length: the last emitted token's position + 1
        tokens, _ = lookup_continuation(b.history, length, k, self.max_ngram, self.min_ngram)  # [k]
        b.verify_tokens[0, 1:k + 1].copy_(tokens)

    def accepted(self, b, tokens, positions, n, features) -> None:
        pass  # the engine's token history is all a lookup reads

    def chain_candidates(self, b):
        """A copy is a point mass: q 1 for each draft, no other candidate."""
        k, dev = b.shape.depth, b.verify_tokens.device
        return (torch.ones(k, device=dev), torch.zeros(k, TOP_SHOWN, dtype=torch.int64, device=dev),
                torch.full((k, TOP_SHOWN), -1.0, device=dev))
