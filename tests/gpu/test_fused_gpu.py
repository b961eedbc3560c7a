"""demo.kernels.fused on a GPU: the fused layer kernels give PyTorch's fp32 logits and bf16 logits as
close to fp32 as PyTorch's layers (Llama, heads of 32, Qwen2, Qwen3); a compiled fused forward gives
eager's logits and cache bit for bit; graph mode stays token-identical to eager with the fused
kernels and with "torch" (PyTorch's layers and SDPA, ``Target(hf, kernels="torch")``, the
reference), and a fused chain compiled too; bf16 speculation with the fused layers gives 1-row
target-only's tokens whatever the tiles (``demo.bench.tools.perf_forward.tiles_of``); and a bf16 tree
verification at the default target's shape gives each node the logits of 1-row steps along its path.

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import copy

import pytest
import torch

from demo.config import TreeShape
from demo.engine import Engine
from demo.target import Target
from tests.gpu.helpers import PROMPT, reply_tokens
from tests.tiny import corrupted_oracle, tiny_drafter, tiny_hf

pytestmark = pytest.mark.cuda

HEADS_OF_32 = dict(num_attention_heads=2, num_key_value_heads=1)  # RoPE in the q/k/v kernel (demo.kernels.fused.rope_fits)
HEADS_OF_64 = dict(num_attention_heads=1, num_key_value_heads=1)


@pytest.mark.parametrize("kind", ["llama", "llama-heads-of-32", "qwen2", "qwen3"])
def test_fused_layers_give_fp32_logits_exactly_and_bf16_logits_as_close_to_fp32_as_pytorchs(kind):
    hf = (tiny_hf("llama", **HEADS_OF_32) if kind == "llama-heads-of-32" else tiny_hf(kind)).to("cuda")
    tokens = torch.tensor([PROMPT], device="cuda")
    positions = torch.arange(len(PROMPT), device="cuda").view(1, -1)

    def logits(kernels, dtype):
        target = Target(copy.deepcopy(hf).to(dtype), kernels=kernels)
        target.setup_cache(128)
        return target.forward(tokens, positions).logits.float()

    exact = logits("torch", torch.float32)
    torch.testing.assert_close(logits("fused", torch.float32), exact, atol=1e-4, rtol=1e-4)
    # bf16 rounds at the same points but sums in other orders: no further from fp32 than PyTorch's layers
    fused_error = (logits("fused", torch.bfloat16) - exact).abs().max().item()
    torch_error = (logits("torch", torch.bfloat16) - exact).abs().max().item()
    assert fused_error <= 2 * torch_error + 1e-2, (fused_error, torch_error)


def test_a_compiled_fused_forward_gives_eagers_logits_and_cache_bit_for_bit_on_a_gpu():
    # heads of 32: RoPE and the cache write in norm_qkv_rope, so every figure comes from the same
    # kernels either way, and the compiler only functionalizes the cache writes
    from demo.capture import compile_step

    hf = tiny_hf("llama", **HEADS_OF_32).to("cuda", torch.bfloat16)
    target = Target(hf, kernels="fused")
    target.setup_cache(128)
    P = len(PROMPT)
    with torch.inference_mode():
        target.forward(torch.tensor([PROMPT], device="cuda"), torch.arange(P, device="cuda").view(1, -1))
        tokens = torch.tensor([[5, 6, 7, 8]], device="cuda")
        positions = torch.arange(P, P + 4, device="cuda").view(1, -1)

        def forward():
            return target.forward(tokens, positions, attend=64).logits

        runs = []
        for step in (forward, compile_step(forward)):
            for t in (target.cache.k, target.cache.v):
                t[:, :, :, P:].zero_()  # each run must write this step's K/V itself
            logits = step().clone()
            runs.append((logits, target.cache.k.clone(), target.cache.v.clone()))
    (eager, ke, ve), (compiled, kc, vc) = runs
    assert ke[:, :, :, P:P + 4].abs().sum() > 0
    assert torch.equal(compiled, eager) and torch.equal(kc, ke) and torch.equal(vc, ve)


@pytest.mark.parametrize("kernels", ["torch", "fused"])  # "torch": PyTorch's layers and SDPA, the reference path
@pytest.mark.parametrize("tree", [None, TreeShape(3, 10)], ids=["chain", "tree"])
def test_triton_kernels_keep_graph_mode_token_identical_to_eager_and_a_fused_chain_compiled_too(tree, kernels):
    hf = tiny_hf("llama", **HEADS_OF_32).to("cuda", torch.bfloat16)
    target = Target(hf, kernels=kernels)  # the drafter attends as its target (Engine.set_proposer)
    drafter = tiny_drafter("eagle3", target, draft_vocab_size=128)
    outs = []
    # compiling every phase changes the rounding of PyTorch's layers and the drafter (the text may move
    # at near-ties), not that of the fused kernels: a chain's target tokens then depend on nothing the
    # compiler touches (a tree's on where its drafts put each node's ancestors)
    runs = (("eager", False), ("cudagraph", False))
    if kernels == "fused" and tree is None:
        runs += (("cudagraph", "all"),)
    for mode, scope in runs:
        engine = Engine(target, drafter, mode=mode, compile=scope, max_context=128)
        outs.append(reply_tokens(engine, PROMPT, max_new_tokens=40, num_spec_tokens=4, tree=tree, stop_token_ids=()))
    assert all(out == outs[0] for out in outs)


@pytest.mark.parametrize("tiles,tree,oracle", [("default", None, False),
                                               ("block_m=64:head_split=2:block_k=16:steps=1", None, False),
                                               ("default", TreeShape(4, 16), False),
                                               ("default", TreeShape(4, 16), True)],
                         ids=["chain", "chain-other-tiles", "tree", "tree-deep-paths"])
def test_with_fused_layers_bf16_speculation_gives_one_row_target_onlys_tokens_on_a_gpu(tiles, tree, oracle):
    # every row of the target computed alike whatever the forward's width: the 8-row verification
    # and the 1-row step agree bit for bit, so no padded reference is needed; a tree's nodes attend
    # to their ancestors in slot order (demo.kernels.attend.seen_slots), as target-only attends to the path;
    # whatever the tiles (heads of 64 split between two programs each, 64-row tiles, the input split
    # in 16-column steps, one a program)
    from demo.bench.tools.perf_forward import parse_tiles, tiles_of

    with tiles_of(parse_tiles(tiles)):  # every launch inside, captured graphs too, runs these tiles
        _fused_speculation_gives_target_onlys_tokens(HEADS_OF_32 if tiles == "default" else HEADS_OF_64, tree, oracle)


def _fused_speculation_gives_target_onlys_tokens(heads: dict, tree: TreeShape | None, oracle: bool) -> None:
    # a random drafter's drafts are mostly rejected, so its trees emit what the root's row computes;
    # an oracle of target-only's tokens (wrong every 5th) has deep paths accepted
    hf = tiny_hf("llama", vocab_size=2000, **heads).to("cuda", torch.bfloat16)
    target = Target(hf, kernels="fused")
    drafter = tiny_drafter("eagle3", target)
    for seed in range(4):
        prompt = torch.randint(3, 2000, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        for mode in ("eager", "cudagraph"):
            ref = reply_tokens(Engine(target, None, mode=mode, max_context=160), prompt, max_new_tokens=96,
                               stop_token_ids=())
            engine = Engine(target, corrupted_oracle(prompt + ref, target) if oracle else drafter, mode=mode,
                            max_context=160)
            spec = reply_tokens(engine, prompt, max_new_tokens=96, num_spec_tokens=7, tree=tree, stop_token_ids=())
            assert spec == ref, (seed, mode)


def _random_tree(n: int, seed: int) -> torch.Tensor:
    """parents [n] of a tree whose node ids grow with depth (node 0 the root), 1 to 4 children a node."""
    g = torch.Generator().manual_seed(seed)
    parents, level = [0], [0]
    while len(parents) < n:
        nxt = []
        for p in level:
            for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
                if len(parents) < n:
                    nxt.append(len(parents))
                    parents.append(p)
        level = nxt
    return torch.tensor(parents)


@pytest.mark.parametrize("context", [40, 200], ids=["short", "past-a-split"])
def test_a_bf16_tree_verification_gives_each_node_the_logits_of_one_row_steps_along_its_path(context):
    # the whole target forward, at the default target's shape (random weights): a tree's nodes, their
    # ancestors scattered over the tree's slots, against 1-row forwards along each node's path
    from demo.bench.tools.perf_forward import random_target
    from demo.tree import ancestors, tree_attention_mask

    target = random_target("smollm2-135m", "cuda", torch.bfloat16, 1024)  # Target(hf): the fused kernels
    g = torch.Generator().manual_seed(context)
    prompt = torch.randint(3, 49152, (1, context), generator=g).cuda()
    target.forward(prompt, torch.arange(context, device="cuda").view(1, -1), attend=512)
    parents = _random_tree(65, seed=context)
    depths = ancestors(parents, 64).sum(-1) - 1  # ancestors-or-self, less the node itself
    tokens = torch.randint(3, 49152, (1, 65), generator=g).cuda()
    mask = tree_attention_mask(parents.cuda(), int(depths.max()), torch.tensor(context, device="cuda"), 1024)
    tree = target.forward(tokens, (context + depths).view(1, -1).cuda(), attend=512,
                          slots=(context + torch.arange(65)).view(1, -1).cuda(), mask=mask).logits[0]
    differ = []
    for node in range(65):
        path = [node]
        while path[-1]:
            path.append(int(parents[path[-1]]))
        for j, a in enumerate(path[::-1]):
            row = target.forward(tokens[:, a:a + 1], torch.tensor([[context + j]], device="cuda"), attend=512).logits
        if not torch.equal(row[0, -1], tree[node]):
            differ.append((node, int(depths[node])))
    assert not differ, f"(node, depth) whose logits differ: {differ}"
