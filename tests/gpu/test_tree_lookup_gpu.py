"""demo/proposers/ngram.py on a GPU: the copy and the graft read nothing back to the host, so both are
captured in a CUDA graph as they stand, eager and compiled, and a replay over new histories and
lengths gives eager's tree. (A 0-dim tensor used as an index reads the host and breaks a capture.)
In the engine, a lookup tree's graph mode gives eager's tokens, greedy and point-mass, and with the
fused kernels in bf16 the one-row target-only reply.

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import random

import pytest
import torch

from demo.config import GenerationConfig, TreeShape
from demo.engine import Engine
from demo.target import Target
from demo.proposers.ngram import graft_branch, lookup_continuation
from tests.engine.test_tree_lookup import random_tree
from tests.gpu.helpers import reply_tokens
from tests.tiny import corrupted_oracle, tiny_drafter, tiny_hf

pytestmark = pytest.mark.cuda

DEPTH, SIZE, NODES = 7, 16, 64


def _branch(history, length, tokens, parents, depths):
    copied, found = lookup_continuation(history, length, DEPTH + SIZE, 4)
    return (*graft_branch(tokens, parents, depths, copied, DEPTH, SIZE), found)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_lookup_branch_is_captured_as_it_stands_and_replays_as_eager_runs(compiled):
    from demo.bench.tools.timing import capture_alone
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lookup_trees_graph_mode_gives_eagers_tokens_greedy_and_pointmass(dtype):
    hf = tiny_hf("llama", vocab_size=8).to("cuda", dtype)  # replies that repeat: the branch is accepted
    target = Target(hf)
    drafter = tiny_drafter("eagle3", target)
    prompt, tree = [1, 2, 3, 4, 5], TreeShape(3, 10, 12)
    outs, steps = {}, {}
    for mode in ("eager", "cudagraph"):
        engine = Engine(target, drafter, mode=mode, max_context=256)
        for name, extra in (("greedy", {}), ("pointmass", dict(temperature=0.8, seed=3, draft_sampling="pointmass"))):
            events = list(engine.generate(prompt, GenerationConfig(max_new_tokens=120, num_spec_tokens=3, tree=tree,
                                                                   stop_token_ids=(), **extra)))
            outs[mode, name] = [t for e in events for t in e.token_ids]
            steps[mode, name] = [e.num_accepted for e in events]
    for name in ("greedy", "pointmass"):
        assert outs["cudagraph", name] == outs["eager", name], name
        assert steps["cudagraph", name] == steps["eager", name], name  # and accepts as much
    assert max(steps["eager", "greedy"]) > 3  # past the drafter's depth


@pytest.mark.parametrize("oracle", [False, True], ids=["random-drafter", "oracle"])
def test_with_fused_layers_a_bf16_lookup_tree_gives_one_row_target_onlys_tokens(oracle):
    hf = tiny_hf("llama", vocab_size=2000, num_attention_heads=2, num_key_value_heads=1).to("cuda", torch.bfloat16)
    target = Target(hf, kernels="fused")
    for seed in range(3):
        body = torch.randint(3, 2000, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        prompt = body + body[:4]  # a prompt that repeats: the branch copies from it
        for mode in ("eager", "cudagraph"):
            ref = reply_tokens(Engine(target, None, mode=mode, max_context=200), prompt, max_new_tokens=96,
                               stop_token_ids=())
            drafter = corrupted_oracle(prompt + ref, target) if oracle else tiny_drafter("eagle3", target)
            engine = Engine(target, drafter, mode=mode, max_context=200)
            spec = reply_tokens(engine, prompt, max_new_tokens=96, num_spec_tokens=5, tree=TreeShape(3, 12, 16),
                                stop_token_ids=())
            assert spec == ref, (seed, mode)
