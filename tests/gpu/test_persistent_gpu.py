"""demo.kernels.persistent on a GPU: one program a multiprocessor, the programs meeting at a barrier
between stages. At the default target's shape (random weights, bf16) the persistent launch gives the
fused path's logits, EAGLE-3's streams and the cache bit for bit, eager and replayed from a CUDA
graph, launch after launch; and bf16 speculation through it, in graph mode, gives 1-row
target-only's tokens.

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import pytest
import torch

from demo.config import TreeShape
from demo.engine import Engine
from demo.target import Target
from tests.gpu.helpers import reply_tokens
from tests.tiny import corrupted_oracle, tiny_drafter, tiny_hf

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("attend", [128, 512], ids=["one-slot-split", "four-slot-splits"])
def test_the_persistent_launch_gives_the_fused_paths_bits_at_the_default_targets_shape(attend, monkeypatch):
    from demo.bench.tools.perf_forward import random_target
    from demo.kernels import persistent
    from demo.tree import tree_attention_mask

    monkeypatch.setattr(persistent, "GRID", persistent.Grid(max_rows=64))  # 64 rows too (the default: fused)

    target = random_target("smollm2-135m", "cuda", torch.bfloat16, 1024)
    context = 40 if attend == 128 else 300
    g = torch.Generator().manual_seed(attend)
    prompt = torch.randint(3, 49152, (1, context), generator=g).cuda()
    parents = torch.tensor([0, 0, 0, 1, 1, 2, 3, 5, 6], device="cuda")
    depth = torch.tensor([[0, 1, 1, 2, 2, 2, 3, 3, 4]], device="cuda")
    mask = tree_attention_mask(parents, 4, torch.tensor(context, device="cuda"), 1024)
    cases = {W: torch.randint(3, 49152, (1, W), generator=g).cuda() for W in (1, 8, 64, 9)}

    def forward(W):
        tokens = cases[W]
        if W == 9:  # a tree: its nodes' ancestors at scattered slots
            return target.forward(tokens, context + depth, attend=attend, mask=mask, aux_layers=(2, 15, 27),
                                  slots=(context + torch.arange(9, device="cuda")).view(1, -1))
        positions = (context + torch.arange(W, device="cuda")).view(1, -1)
        return target.forward(tokens, positions, attend=attend, aux_layers=(2, 15, 27))

    with torch.inference_mode():
        target.forward(prompt, torch.arange(context, device="cuda").view(1, -1), attend=attend)
        saved = target.cache.k.clone(), target.cache.v.clone()
        results = {}
        for kernels in ("fused", "persistent"):
            target.kernels = kernels
            for W in cases:
                for how in ("eager", "graph", "graph again"):
                    target.cache.k.copy_(saved[0])
                    target.cache.v.copy_(saved[1])
                    if how == "eager":
                        out = forward(W)
                    else:
                        if how == "graph":
                            graph = torch.cuda.CUDAGraph()
                            forward(W)  # warm: compile, allocate
                            target.cache.k.copy_(saved[0])
                            target.cache.v.copy_(saved[1])
                            with torch.cuda.graph(graph):
                                captured = forward(W)
                        graph.replay()
                        out = captured
                    results[kernels, W, how] = (out.logits.clone(), out.aux.clone(), target.cache.k.clone())
        assert not target.layer_stack().barrier.any() and not target.layer_stack().counters.any()
    for W in cases:
        for how in ("eager", "graph", "graph again"):
            for name, a, b in zip(("logits", "streams", "cache"), results["fused", W, "eager"],
                                  results["persistent", W, how]):
                assert torch.equal(a, b), (W, how, name)


@pytest.mark.parametrize("tree", [None, TreeShape(4, 16)], ids=["chain", "tree"])
def test_bf16_speculation_through_the_persistent_launch_gives_one_row_target_onlys_tokens(tree, monkeypatch):
    from demo.kernels import persistent

    monkeypatch.setattr(persistent, "GRID", persistent.Grid(max_rows=64))  # the tree's verification too
    hf = tiny_hf("llama", vocab_size=2000, num_attention_heads=2, num_key_value_heads=1).to("cuda", torch.bfloat16)
    target = Target(hf, kernels="persistent")
    for seed in range(3):
        prompt = torch.randint(3, 2000, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = reply_tokens(Engine(target, None, mode="cudagraph", max_context=160), prompt, max_new_tokens=96,
                           stop_token_ids=())
        for drafter in (tiny_drafter("eagle3", target), corrupted_oracle(prompt + ref, target)):
            engine = Engine(target, drafter, mode="cudagraph", max_context=160)
            spec = reply_tokens(engine, prompt, max_new_tokens=96, num_spec_tokens=7, tree=tree, stop_token_ids=())
            assert spec == ref, seed
    fused = reply_tokens(Engine(Target(hf, kernels="fused"), None, mode="cudagraph", max_context=160), prompt,
                         max_new_tokens=96, stop_token_ids=())
    assert fused == ref
    assert target._stack is not None


def test_a_traced_launch_keeps_the_bits_and_times_every_stage_in_order(monkeypatch):
    """Grid.trace (the bench's stage profile): the same logits, and each program's clock rises through
    its start, every stage's arrival and leaving, and its end."""
    from demo.bench.tools.perf_forward import random_target, stage_profile
    from demo.kernels import persistent

    target = random_target("smollm2-135m", "cuda", torch.bfloat16, 512)
    tokens, positions = torch.randint(3, 49152, (1, 8)).cuda(), (200 + torch.arange(8, device="cuda")).view(1, -1)
    with torch.inference_mode():
        prompt = torch.randint(3, 49152, (1, 200)).cuda()
        target.forward(prompt, torch.arange(200, device="cuda").view(1, -1), attend=512)
        target.kernels = "persistent"
        saved = target.cache.k.clone(), target.cache.v.clone()
        plain = target.forward(tokens, positions, attend=512).logits.clone()
        target.cache.k.copy_(saved[0])
        target.cache.v.copy_(saved[1])
        monkeypatch.setattr(persistent, "GRID", persistent.Grid(trace=1))
        persistent.TRACES.clear()
        traced = target.forward(tokens, positions, attend=512).logits
    assert torch.equal(plain, traced)
    trace = persistent.TRACES.pop().cpu()
    assert trace.shape[1] == 30 * 6 + 1  # 512 slots: four slot splits, their combination a stage
    times = trace.reshape(trace.shape[0], -1)
    assert (times[:, 1:] >= times[:, :-1]).all()
    costs = stage_profile(trace, persistent.stage_names(30, trace.shape[1] - 1))
    assert [c.count for c in costs] == [30] * 6 and all(c.span_us > 0 for c in costs)
