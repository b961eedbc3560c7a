"""demo.kernels.fused: a decoder layer's projections as fused kernels, each row computed alike whatever the
width. The kernels run here under Triton's interpreter, in fp32 (numpy on the CPU, in a process
started with TRITON_INTERPRET=1); tests/gpu/test_fused_gpu.py runs them in bf16, compiled and captured."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.interpreted import run_interpreted

pytest.importorskip("triton")


def _run_interpreted(code: str) -> None:
    run_interpreted(code + "\nprint('checked')")


def check_ops() -> None:
    """Each op gives the eager layer's pieces (demo.layers), and each row the same bits alone as
    beside 12 others, whatever the grid and the input step (the default tiles and others), the input
    split between programs too (its partial sums added in split order, the split counters kept
    beside the weight and left at zero by every launch, so a launch after others gives the same)."""
    from demo.kernels import fused
    from demo.layers import rms_norm

    g = torch.Generator().manual_seed(0)
    cases = ((3, 64, 96, fused.Tiles()), (13, 100, 40, fused.Tiles()), (1, 576, 200, fused.Tiles()),
             (7, 576, 200, fused.Tiles(block_k=64, steps=0)),  # the input unsplit, in 64-column steps
             (13, 100, 40, fused.Tiles(block_n=16, head_split=2, num_warps=2)),
             (13, 300, 40, fused.Tiles(block_k=128, num_stages=2)), (40, 100, 40, fused.Tiles(block_m=32)),
             (13, 576, 40, fused.Tiles(steps=4)), (20, 100, 72, fused.Tiles(steps=1, block_m=32)),
             (40, 576, 40, fused.Tiles()),  # a split input over 3 row tiles, each counting its splits
             (13, 64, 4100, fused.Tiles(block_n=16, wide_block_n=64)),  # too wide to split: the head's own tiles
             (7, 300, 40, fused.Tiles(unroll_norm=0)))  # the norm's sum of squares in a loop
    for R, K, N, tiles in cases:
        fused.TILES = tiles  # this process's every later launch (what demo.bench.tools.perf_forward.tiles_of does)
        x = torch.randn(R, K, generator=g)
        norm = SimpleNamespace(weight=1 + 0.1 * torch.randn(K, generator=g), variance_epsilon=1e-5)
        w = torch.randn(N, K, generator=g) / K ** 0.5
        bias = torch.randn(N, generator=g)
        gate_up = torch.randn(2 * N, K, generator=g) / K ** 0.5
        residual = torch.randn(R, N, generator=g)
        normed = rms_norm(x, norm.weight, 1e-5)
        ops = {
            "norm_linear": (lambda x, res: fused.norm_linear(x, norm, w, bias), lambda: F.linear(normed, w, bias)),
            "norm_gated": (lambda x, res: fused.norm_gated(x, norm, gate_up),
                           lambda: F.silu(F.linear(normed, gate_up[:N])) * F.linear(normed, gate_up[N:])),
            "linear_residual": (lambda x, res: fused.linear_residual(x, w, res), lambda: residual + F.linear(x, w)),
        }
        for name, (op, reference) in ops.items():
            together = op(x, residual)
            torch.testing.assert_close(together, reference(), atol=1e-5, rtol=1e-5, msg=name)
            for row in {0, R // 2, R - 1}:
                alone = op(x[row:row + 1], residual[row:row + 1])
                assert torch.equal(alone[0], together[row]), (name, R, row)
            assert torch.equal(op(x, residual), together), name  # the counters the first launch left
        for weight in (w, gate_up):  # each launch's last splits set the counts back: no zeroing launch needed
            for counters in getattr(weight, "_speclens_split_counters", []):
                assert not counters.any(), (R, K, N, tiles)
        splits_here = fused.input_splits(K, -(-N // tiles.block_n))[0] > 1
        assert splits_here == hasattr(w, "_speclens_split_counters"), (R, K, N, tiles)


def check_qkv_rope() -> None:
    """norm_qkv_rope gives eager's q (rotated) and writes eager's k (rotated) and v at each row's slot,
    touching no other slot; each row's q the same bits alone as beside others; with one program per
    head, with (heads of 64) each head's columns split between two programs, and with the input split
    between three programs."""
    from demo.kernels import fused

    for hd, tiles in ((32, fused.Tiles()), (64, fused.Tiles(block_m=32, head_split=2, num_warps=2, block_k=32)),
                      (32, fused.Tiles(block_k=16, steps=1))):
        fused.TILES = tiles
        check_qkv_rope_of(hd)


def check_qkv_rope_of(hd: int) -> None:
    from demo.kernels import fused
    from demo.layers import apply_rope, rms_norm

    g = torch.Generator().manual_seed(1)
    B, M, H, nh, nkv, S = 2, 5, 48, 4, 2, 40
    x = torch.randn(B, M, H, generator=g)
    norm = SimpleNamespace(weight=1 + 0.1 * torch.randn(H, generator=g), variance_epsilon=1e-5)
    w = torch.randn((nh + 2 * nkv) * hd, H, generator=g) / H ** 0.5
    bias = torch.randn((nh + 2 * nkv) * hd, generator=g)
    angles = torch.rand(B, 1, M, hd // 2, generator=g) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    slots = torch.tensor([[3, 9, 4, 20, 31], [0, 1, 2, 39, 7]])
    k_cache, v_cache = torch.zeros(B, nkv, S + 8, hd)[:, :, :S], torch.zeros(B, nkv, S + 8, hd)[:, :, :S]
    q = fused.norm_qkv_rope(x, norm, w, bias, cos, sin, slots, k_cache, v_cache, nh)
    qs, ks, vs = torch.nn.functional.linear(rms_norm(x, norm.weight, 1e-5), w, bias).split(
        (nh * hd, nkv * hd, nkv * hd), dim=-1)
    q_ref = apply_rope(qs.view(B, M, nh, hd).transpose(1, 2), cos, sin).transpose(1, 2)
    k_ref = apply_rope(ks.view(B, M, nkv, hd).transpose(1, 2), cos, sin)  # [B, nkv, M, hd]
    torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
    written = torch.zeros(B, S, dtype=torch.bool)
    for b in range(B):
        for m in range(M):
            written[b, slots[b, m]] = True
            torch.testing.assert_close(k_cache[b, :, slots[b, m]], k_ref[b, :, m], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v_cache[b, :, slots[b, m]], vs.view(B, M, nkv, hd)[b, m], atol=1e-5, rtol=1e-5)
    assert bool((k_cache.abs().sum(-1)[~written[:, None, :].expand(B, nkv, S)] == 0).all())
    alone = fused.norm_qkv_rope(x[:1, 2:3], norm, w, bias, cos[:1, :, 2:3], sin[:1, :, 2:3], slots[:1, 2:3],
                                k_cache[:1], v_cache[:1], nh)
    assert torch.equal(alone[0, 0], q[0, 2])
    for counters in getattr(w, "_speclens_split_counters", []):  # left at zero for the next launch
        assert not counters.any()


def check_tree_rows() -> None:
    """Through the fused layers, a tree's verification gives each node the logits, bit for bit, that
    1-row target-only steps give the same tokens along its path: the rows are computed alike at any
    width, and the tree's attention sums each node's ancestors in slot order (demo.kernels.attend.seen_slots),
    as target-only sums the path. Heads of 32: RoPE and the cache write in the projection's kernel."""
    from demo.target import Target
    from demo.tree import tree_attention_mask
    from tests.tiny import tiny_hf

    parents = torch.tensor([0, 0, 0, 1, 1, 2, 3, 5, 6])  # node 0: the root; ids grow with depth
    depth = [0]
    for p in parents[1:].tolist():
        depth.append(depth[p] + 1)
    n, root, S = parents.shape[0], 124, 256  # the tree crosses the attention's split edge at 128
    target = Target(tiny_hf("llama", num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    assert target.rows_alike()  # so 1-row target-only is the exact reference (demo.engine.target_only_width)
    assert not Target(target.hf, kernels="torch").rows_alike()  # PyTorch's projections round by the row count
    target.setup_cache(S)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 256, (1, root), generator=g)
    tokens = torch.randint(3, 256, (1, n), generator=g)
    with torch.inference_mode():
        target.forward(prompt, torch.arange(root).view(1, -1), attend=S)
        saved = target.cache.k.clone(), target.cache.v.clone()
        mask = tree_attention_mask(parents, max(depth), torch.tensor(root), S)
        tree = target.forward(tokens, root + torch.tensor([depth]), slots=root + torch.arange(n).view(1, -1),
                              mask=mask, attend=S).logits
        for leaf in (4, 8):  # paths of depth 2 and 5
            path = [leaf]
            while path[-1]:
                path.append(int(parents[path[-1]]))
            target.cache.k.copy_(saved[0])
            target.cache.v.copy_(saved[1])
            for j, node in enumerate(path[::-1]):
                step = target.forward(tokens[:, node:node + 1], torch.tensor([[root + j]]), attend=S).logits
                assert torch.equal(step[0, 0], tree[0, node]), (leaf, node)


def check_generations() -> None:
    """Whole generations through the fused layers (and the fused head) give transformers' greedy
    tokens: target-only, a chain and a tree (its mask put in slot order as it is drafted) on Llama;
    target-only on Qwen2 (q/k/v biases) and Qwen3 (q/k norms: RoPE outside the projection's kernel)."""
    from demo.config import TreeShape
    from demo.engine import Engine
    from demo.kernels import fused
    from demo.target import Target
    from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

    calls = []  # the fused layers ran: every forward ends in the fused head
    original = fused.norm_linear
    import demo.target
    demo.target.norm_linear = lambda *a: calls.append(1) or original(*a)
    prompt = [1, 17, 99, 4, 250, 31, 8]
    runs = (("none", 0, None), ("eagle", 3, None), ("eagle3", 3, TreeShape(3, 8)))
    for kind in ("llama", "qwen2", "qwen3"):  # three layers (EAGLE-3 reads three): the interpreter is slow
        # heads of 32 (Llama, Qwen2: RoPE in the projection's kernel); Qwen3's q/k norms take it apart
        hf = tiny_hf(kind, num_hidden_layers=3, **({} if kind == "qwen3" else dict(num_attention_heads=2,
                                                                                   num_key_value_heads=1)))
        ref = hf_greedy(hf, prompt, 12)
        target = Target(hf)
        for method, k, tree in runs if kind == "llama" else runs[:1]:
            drafter = tiny_drafter(method, target) if method != "none" else None
            engine = Engine(target, drafter, max_context=64)
            before = len(calls)
            tokens, _ = run(engine, prompt, max_new_tokens=12, num_spec_tokens=k, tree=tree, stop_token_ids=())
            assert tokens == ref, (kind, method)
            assert len(calls) > before  # the fused layers ran
            if tree is not None:  # the tree's mask was put in slot order with its drafting (Target.ordered_masks)
                assert [b.tree.verify_mask.dtype for b in engine._buffers.values()] == [torch.int32]


def test_fused_ops_match_the_eager_layer_and_compute_each_row_alone():
    _run_interpreted("from tests.kernels.test_fused import check_ops\ncheck_ops()")


def test_rope_and_the_cache_write_in_the_projections_kernel_match_the_eager_layer():
    _run_interpreted("from tests.kernels.test_fused import check_qkv_rope\ncheck_qkv_rope()")


def test_a_trees_verification_gives_each_node_the_logits_of_one_row_steps_along_its_path_bit_for_bit():
    _run_interpreted("from tests.kernels.test_fused import check_tree_rows\ncheck_tree_rows()")


def test_generations_through_the_fused_layers_keep_target_greedy_tokens():
    _run_interpreted("from tests.kernels.test_fused import check_generations\ncheck_generations()")


def test_on_a_cpu_the_fused_layers_never_run():
    from demo.kernels.fused import fused_runs
    from demo.target import Target
    from tests.tiny import tiny_hf

    assert not fused_runs(torch.zeros(1, 2, 64), F.silu)  # a CPU tensor, no interpreter
    assert not Target(tiny_hf("llama").to(torch.bfloat16)).rows_alike()  # so bf16 checks stay padded
