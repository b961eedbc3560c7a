"""demo/tree_lookup.py on a GPU: the copy and the graft read nothing back to the host, so both are
captured in a CUDA graph as they stand, eager and compiled, and a replay over new histories and
lengths gives eager's tree. (A 0-dim tensor used as an index reads the host and breaks a capture.)

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import random

import pytest
import torch

from demo.tree_lookup import graft_branch, lookup_continuation

pytestmark = pytest.mark.cuda

DEPTH, SIZE, NODES = 7, 16, 64


def _tree(rng):
    tokens, parents, depths = [5], [0], [0]
    for i in range(1, NODES + 1):
        parent = rng.choice([j for j in range(i) if depths[j] < DEPTH])
        taken = {tokens[j] for j in range(1, i) if parents[j] == parent}
        tokens.append(rng.choice([x for x in range(12) if x not in taken]))
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return [torch.tensor(x, device="cuda") for x in (tokens, parents, depths)]


def _branch(history, length, tokens, parents, depths):
    copied, found = lookup_continuation(history, length, DEPTH + SIZE, 4)
    return (*graft_branch(tokens, parents, depths, copied, DEPTH, SIZE), found)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_lookup_branch_is_captured_as_it_stands_and_replays_as_eager_runs(compiled):
    from demo.bench.timing import capture_alone
    rng = random.Random(0)
    history = torch.randint(0, 8, (2048,), device="cuda")
    length = torch.tensor(1024, device="cuda")
    tree = _tree(rng)
    fn = torch.compile(_branch) if compiled else _branch
    out = []
    graph = capture_alone(lambda: out.__setitem__(slice(None), fn(history, length, *tree)))
    for _ in range(20):
        history.copy_(torch.tensor([rng.randrange(rng.randint(2, 8)) for _ in range(2048)]))
        length.fill_(rng.randint(1, 2048))
        graph.replay()
        want = _branch(history, length, *tree)
        for got, ref in zip(out, want):
            assert torch.equal(got, ref)
