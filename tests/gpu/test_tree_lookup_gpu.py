"""demo/tree_lookup.py on a GPU: the copy and the graft read nothing back to the host, so both are
captured in a CUDA graph as they stand, eager and compiled, and a replay over new histories and
lengths gives eager's tree. (A 0-dim tensor used as an index reads the host and breaks a capture.)

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import random

import pytest
import torch

from demo.tree_lookup import graft_branch, lookup_continuation
from tests.engine.test_tree_lookup import random_tree

pytestmark = pytest.mark.cuda

DEPTH, SIZE, NODES = 7, 16, 64


def _branch(history, length, tokens, parents, depths):
    copied, found = lookup_continuation(history, length, DEPTH + SIZE, 4)
    return (*graft_branch(tokens, parents, depths, copied, DEPTH, SIZE), found)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_lookup_branch_is_captured_as_it_stands_and_replays_as_eager_runs(compiled):
    from demo.bench.timing import capture_alone
    rng = random.Random(0)
    history = torch.randint(0, 8, (2048,), device="cuda")
    length = torch.tensor(1024, device="cuda")
    tree = random_tree(rng, DEPTH, NODES, 12, "cuda")
    fn = torch.compile(_branch) if compiled else _branch
    out = []

    def step():  # the captured call's outputs are the tensors every replay rewrites
        out[:] = fn(history, length, *tree)
    graph = capture_alone(step)
    for _ in range(20):
        history.copy_(torch.tensor([rng.randrange(rng.randint(2, 8)) for _ in range(2048)]))
        length.fill_(rng.randint(1, 2048))
        graph.replay()
        want = _branch(history, length, *tree)
        for got, ref in zip(out, want):
            assert torch.equal(got, ref)
