"""The prompt-lookup branch on the device (demo/proposers/ngram.py): the copy is the bench estimate's,
on any history; grafted on a tree it extends the path it repeats, keeps the tree a tree with
distinct siblings, and greedy verification accepts along it past the drafter's depth."""

from __future__ import annotations

import random

import pytest
import torch

from demo.bench.tools.lookup import continuation
from demo.proposers.ngram import graft_branch, lookup_continuation
from demo.tree_verify import verify_tree_greedy


@pytest.mark.parametrize("max_ngram", [1, 2, 4])
def test_the_device_copy_is_the_reference_lookup_on_any_history(max_ngram):
    rng = random.Random(max_ngram)
    for _ in range(300):
        vocab, S = rng.randint(2, 6), 48
        history = [rng.randrange(vocab) for _ in range(S)]
        length = rng.randint(1, S)
        tokens, found = lookup_continuation(torch.tensor(history), torch.tensor(length), 9, max_ngram)
        want = continuation(history[:length], 9, max_ngram)
        assert bool(found) == bool(want), (history[:length], max_ngram)
        if want:
            assert tokens.tolist() == want, (history[:length], max_ngram)


def test_the_device_copy_ignores_what_lies_past_the_history():
    history = torch.tensor([3, 4, 5, 3, 4, 9, 9, 9])
    tokens, found = lookup_continuation(history, torch.tensor(5), 4, 4)  # [3, 4, 5, 3, 4]: [3, 4] repeats
    assert bool(found) and tokens.tolist() == [5, 3, 4, 5]


def _tree():
    """root 5; 1: 10 and 2: 11 under it; 3: 12 and 4: 13 under 1; 5: 14 under 3 (depth 3)."""
    tokens = torch.tensor([5, 10, 11, 12, 13, 14])
    parents = torch.tensor([0, 0, 0, 1, 1, 3])
    depths = torch.tensor([0, 1, 1, 2, 2, 3])
    return tokens, parents, depths


@pytest.mark.parametrize("branch, parent, first", [
    ([10, 12, 14, 20, 21, 22], 5, 20),  # the whole drafted path repeated: the branch goes on below its leaf
    ([10, 99, 98, 97, 96, 95], 1, 99),  # one node agrees: the branch leaves the tree there
    ([77, 76, 75, 74, 73, 72], 0, 77),  # none agrees: a new child of the root
])
def test_a_branch_hangs_below_the_deepest_node_whose_path_it_repeats(branch, parent, first):
    tokens, parents, depths = _tree()
    t, p, d = graft_branch(tokens, parents, depths, torch.tensor(branch), 3, 3)
    assert t[:6].tolist() == tokens.tolist() and p[:6].tolist() == parents.tolist()
    assert p[6:].tolist() == [parent, 6, 7] and t[6] == first
    assert d[6:].tolist() == [int(depths[parent]) + 1 + i for i in range(3)]


def random_tree(rng: random.Random, depth: int, nodes: int, vocab: int, device: str = "cpu"):
    """A draft tree as demo/tree_verify.py takes it: (tokens, parents, depths) [N+1] int64, root
    first, each node after its parent, depths at most `depth`, siblings distinct tokens (N may
    stop short of `nodes` where a parent has used up the vocabulary)."""
    tokens, parents, depths = [rng.randrange(vocab)], [0], [0]
    for i in range(1, nodes + 1):
        parent = rng.choice([j for j in range(i) if depths[j] < depth])
        taken = {tokens[j] for j in range(1, i) if parents[j] == parent}
        free = [x for x in range(vocab) if x not in taken]
        if not free:
            break
        tokens.append(rng.choice(free))
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return [torch.tensor(x, device=device) for x in (tokens, parents, depths)]


def test_a_grafted_tree_stays_a_tree_with_distinct_siblings():
    rng = random.Random(0)
    for _ in range(200):
        D, size = rng.randint(1, 4), rng.randint(1, 5)
        tree = random_tree(rng, D, rng.randint(1, 12), 6)
        branch = torch.tensor([rng.randrange(6) for _ in range(D + size)])
        t, p, d = (x.tolist() for x in graft_branch(*tree, branch, D, size))
        for i in range(1, len(t)):
            assert p[i] < i and d[i] == d[p[i]] + 1
        for i in range(1, len(t)):
            assert [t[j] for j in range(1, len(t)) if p[j] == p[i]].count(t[i]) == 1


def test_greedy_verification_accepts_along_the_branch_past_the_drafters_depth():
    tokens, parents, depths = _tree()
    branch = torch.tensor([10, 12, 14, 20, 21, 22])  # the target's greedy text after the root
    t, p, d = graft_branch(tokens, parents, depths, branch, 3, 3)
    V = 100
    logits = torch.zeros(len(t), V)
    following = {0: 10, 1: 12, 3: 14, 5: 20, 6: 21, 7: 22, 8: 23}  # the target's argmax after each node
    for node, token in following.items():
        logits[node, token] = 1.0
    n, path, out = verify_tree_greedy(t, p, d, logits, 3 + 3)
    assert int(n) == 6 and path.tolist() == [1, 3, 5, 6, 7, 8]
    assert out.tolist() == [10, 12, 14, 20, 21, 22, 23]
