"""demo.kernels.attend: split-slot attention over a static cache with a boolean mask. The kernels run here
under Triton's interpreter (numpy on the CPU, in a process started with TRITON_INTERPRET=1: Triton
reads it when it is imported); tests/gpu/test_attend_gpu.py runs them compiled and captured on a GPU."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from demo.kernels import attend as attend_module
from demo.layers import causal_slot_mask
from tests.interpreted import run_interpreted

pytest.importorskip("triton")


def _inputs(B, nh, nkv, M, S, hd, kind, seed):
    """q [B, nh, M, hd]; caches [B, nkv, S, hd] cut from wider ones (strided, as the engine's views
    are); a mask [B, 1, M, S]: causal over slots, or scattered like a tree's (a row sees its random
    slots), cut from a wider one; row 0 of a scattered mask sees nothing."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, M, hd, generator=g)
    k = torch.randn(B, nkv, S + 16, hd, generator=g)[:, :, :S]
    v = torch.randn(B, nkv, S + 16, hd, generator=g)[:, :, :S]
    if kind == "causal":
        positions = torch.arange(S - M - 3, S - 3).view(1, M).expand(B, M)
        mask = torch.arange(S)[None, None, None, :] <= positions[:, None, :, None]
    else:
        mask = (torch.rand(B, 1, M, S + 5, generator=g) < 0.3)[..., :S]
        mask[..., 0, :] = False
    return q, k, v, mask


def check_against_sdpa(B, nh, nkv, M, S, hd, kind, split) -> None:
    q, k, v, mask = _inputs(B, nh, nkv, M, S, hd, kind, seed=M * 7 + S)
    out = attend_module.split_attend(q, k, v, mask, attend_module._attend_split, attend_module._attend_combine, split)
    assert out.shape == (B, M, nh, hd) and out.is_contiguous()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=nh != nkv).transpose(1, 2)
    if kind != "causal":
        assert bool((out[:, 0] == 0).all())  # a row that sees no slot gets zeros (SDPA: NaN)
        out, ref = out[:, 1:], ref[:, 1:]
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-6)


def check_rows_alone(split) -> None:
    """Each row's output is bitwise the same computed alone or beside others: its arithmetic never
    depends on the rows launched with it (the property exact decoding needs across widths)."""
    run = lambda *a: attend_module.split_attend(*a, attend_module._attend_split, attend_module._attend_combine, split)  # noqa: E731
    for kind in ("tree", "causal"):
        q, k, v, mask = _inputs(1, 9, 3, 13, 300, 64, kind, seed=5)
        for m in (mask, attend_module.seen_slots(mask)):  # packed rows; rows in slot order (the causal rows
            # share every split but the last, in groups of five, and part in the last)
            together = run(q, k, v, m)
            for row in (0, 4, 6, 12):
                alone = run(q[:, :, row:row + 1], k, v, m[:, :, row:row + 1])
                assert torch.equal(alone[:, 0], together[:, row]), (kind, m.dtype, row)


def check_in_slot_order(B, nh, nkv, M, S, hd, kind, split) -> None:
    """A mask given in slot order (``seen_slots``) attends as the boolean mask does."""
    q, k, v, mask = _inputs(B, nh, nkv, M, S, hd, kind, seed=M * 5 + S)
    run = lambda m: attend_module.split_attend(q, k, v, m, attend_module._attend_split,  # noqa: E731
                                               attend_module._attend_combine, split)
    torch.testing.assert_close(run(attend_module.seen_slots(mask)), run(mask), atol=2e-6, rtol=2e-6)


def check_tree_rows_as_paths(split) -> None:
    """A tree's node, its ancestors scattered over the tree's slots and attended in slot order, gets
    the bits of a causal row at the end of its path laid out at contiguous slots, as target-only
    decodes it, in a wider bucket too (more splits, junk in the slots no row sees)."""
    from demo.tree import tree_attention_mask

    g = torch.Generator().manual_seed(9)
    nh, nkv, hd, root, S, wide = 9, 3, 64, 125, 256, 512  # the tree crosses a split's edge at 128
    parents = torch.tensor([0, 0, 0, 1, 1, 2, 3, 5, 6, 7, 3])  # node 0: the root; ids grow with depth
    depth = [0]
    for p in parents[1:].tolist():
        depth.append(depth[p] + 1)
    n = parents.shape[0]
    q = torch.randn(1, nh, n, hd, generator=g)
    k = torch.randn(1, nkv, S, hd, generator=g)
    v = torch.randn(1, nkv, S, hd, generator=g)
    mask = tree_attention_mask(parents, max(depth), torch.tensor(root), S)
    run = lambda q, k, v, m: attend_module.split_attend(q, k, v, m, attend_module._attend_split,  # noqa: E731
                                                        attend_module._attend_combine, split)
    tree = run(q, k, v, attend_module.seen_slots(mask))
    for node in range(n):
        path = [node]
        while path[-1]:
            path.append(int(parents[path[-1]]))
        path = path[::-1]  # root .. node
        kp = torch.randn(1, nkv, wide, hd, generator=g)  # junk everywhere the row does not see
        vp = torch.randn(1, nkv, wide, hd, generator=g)
        kp[:, :, :root], vp[:, :, :root] = k[:, :, :root], v[:, :, :root]
        for j, a in enumerate(path):
            kp[:, :, root + j], vp[:, :, root + j] = k[:, :, root + a], v[:, :, root + a]
        causal = (torch.arange(wide) <= root + depth[node]).view(1, 1, 1, wide)
        alone = run(q[:, :, node:node + 1], kp, vp, causal)
        assert torch.equal(alone[:, 0], tree[:, node]), node


def check_a_split_is_shared_only_where_every_row_of_the_group_sees_it_whole() -> None:
    """Slot-order rows share a split's program only when every row of their group sees it whole:
    here the group of nodes 5 to 9 has a first row (node 5, a chain from the root) that sees split 0
    whole while node 6 parts from it inside the split, and each row still gets the bits it gets alone."""
    from demo.tree import tree_attention_mask

    g = torch.Generator().manual_seed(11)
    root, S = 58, 128  # split 0 ends at slot 63 = root + 5
    parents = torch.tensor([0, 0, 1, 2, 3, 4, 3, 6, 5, 8])
    q = torch.randn(1, 9, parents.shape[0], 64, generator=g)
    k, v = torch.randn(1, 3, S, 64, generator=g), torch.randn(1, 3, S, 64, generator=g)
    order = attend_module.seen_slots(tree_attention_mask(parents, 7, torch.tensor(root), S))
    assert int(order[0, 0, 5, 63]) == 63 and int(order[0, 0, 6, 62]) == 64  # node 6: slot 64 where 5 has 62
    run = lambda q, m: attend_module.split_attend(q, k, v, m, attend_module._attend_split,  # noqa: E731
                                                  attend_module._attend_combine, 64)
    together = run(q, order)
    for row in range(parents.shape[0]):
        assert torch.equal(run(q[:, :, row:row + 1], order[:, :, row:row + 1])[:, 0], together[:, row]), row


CASES = [  # B, nh, nkv, M, S, hd, mask, slots per split
    (1, 9, 3, 8, 200, 64, "causal", 128),  # a chain's verification, two splits (GQA groups of 3)
    (1, 9, 3, 1, 77, 64, "causal", 128),  # one token, one split: the first kernel writes the output
    (1, 9, 3, 97, 300, 64, "tree", 128),  # a tree's verification: 291 packed rows, scattered slots
    (2, 4, 4, 5, 130, 32, "tree", 64),  # batch 2, no GQA, a partial last block
    (1, 2, 1, 20, 700, 16, "causal", 64),  # eleven splits (the combine's power-of-two padding)
]


ORDERED_CASES = [(1, 9, 3, 8, 300, 64, "tree", 128), CASES[3], (1, 8, 2, 6, 300, 16, "tree", 128),  # groups of 3, 1, 4
                 (1, 9, 3, 8, 200, 64, "causal", 64)]  # a chain's verification in slot order, four splits


def test_split_attention_matches_sdpa_and_each_row_is_computed_alone_and_a_tree_row_as_its_path():
    code = ("from tests.kernels.test_attend import check_against_sdpa, check_in_slot_order, check_rows_alone, "
            "check_tree_rows_as_paths, check_a_split_is_shared_only_where_every_row_of_the_group_sees_it_whole\n"
            f"for case in {CASES!r}:\n    check_against_sdpa(*case)\n"
            f"for case in {ORDERED_CASES!r}:\n    check_in_slot_order(*case)\n"
            "check_rows_alone(128)\ncheck_rows_alone(64)\ncheck_tree_rows_as_paths(64)\n"
            "check_a_split_is_shared_only_where_every_row_of_the_group_sees_it_whole()\nprint('checked')")
    run_interpreted(code)


def test_on_a_cpu_attend_is_sdpa():
    q, k, v, mask = _inputs(1, 4, 2, 3, 40, 16, "causal", seed=1)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert not attend_module.triton_runs(q)
    assert torch.equal(attend_module.attend(q, k, v, mask), expected)


def _cuda_query(hd):  # what triton_runs reads of a query on a GPU
    return SimpleNamespace(shape=(1, 4, 2, hd), is_cuda=True, dtype=torch.bfloat16)


def test_a_target_refuses_an_unknown_kernels_choice_and_the_torch_choice_keeps_its_drafter_off_triton():
    from demo.target import Target
    from tests.tiny import tiny_drafter, tiny_hf

    with pytest.raises(ValueError, match="must be one of"):
        Target(tiny_hf("llama"), kernels="flash")
    assert attend_module.triton_runs(_cuda_query(64))
    assert not attend_module.triton_runs(_cuda_query(48))  # tl.dot takes powers of two
    for kernels, triton in (("fused", True), ("torch", False)):
        target = Target(tiny_hf("llama"), kernels=kernels)
        drafter = tiny_drafter("eagle3", target)
        drafter.share_target(target)
        assert drafter.triton is triton  # the drafter attends as its target does


def test_the_torch_choice_attends_through_sdpa_even_where_the_triton_kernels_run(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 16, generator=g) for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    monkeypatch.setattr(attend_module, "triton_runs", lambda q: True)  # as on a GPU
    monkeypatch.setattr(torch.ops, "speclens", SimpleNamespace(attend=lambda *a: pytest.fail("Triton attention ran")))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(attend_module.attend(q, k, v, mask, triton=False), expected)


def test_seen_slots_lists_each_rows_seen_slots_in_order_and_mask_of_gives_the_mask_back():
    mask = torch.tensor([[[[True, False, True, True, False], [False] * 5, [False, True, False, False, True]]]])
    order = attend_module.seen_slots(mask)
    assert order.dtype == torch.int32 and order.shape == mask.shape
    assert order[0, 0].tolist() == [[0, 2, 3, -1, -1], [-1] * 5, [1, 4, -1, -1, -1]]
    assert torch.equal(attend_module.mask_of(order), mask)
    causal = torch.arange(6)[None, None, None, :] <= torch.tensor([2, 5])[None, None, :, None]
    assert attend_module.seen_slots(causal)[0, 0].tolist() == [[0, 1, 2, -1, -1, -1], [0, 1, 2, 3, 4, 5]]
    positions = torch.tensor([[2, 5], [0, 3]])  # batch 2: a decoding step's causal rows, in slot order directly
    assert torch.equal(attend_module.causal_seen_slots(positions, 6),
                       attend_module.seen_slots(causal_slot_mask(positions, 6)))
