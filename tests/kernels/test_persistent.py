"""demo.kernels.persistent: every layer of a decoding step's forward in one launch, its tasks the fused
path's programs. Run here under Triton's interpreter in fp32 (one program takes every task in
order); tests/gpu/test_persistent_gpu.py runs it in bf16 with a program a multiprocessor."""

import pytest
import torch

from tests.interpreted import run_interpreted

pytest.importorskip("triton")


def check_logits_equal_the_fused_paths() -> None:
    """Logits, the residual streams EAGLE-3 reads and the cache's K/V are the fused path's, bit for
    bit: target-only's 1 row, a chain's 5, a tree's 9 (its mask in slot order), over one slot split
    (128 slots) and over two (256: their combination a stage of its own); Llama, and Qwen2 (q/k/v
    biases).
    The barrier's count and the split counters are zero after every launch."""
    from demo.target import Target
    from demo.tree import tree_attention_mask
    from tests.tiny import tiny_hf

    parents = torch.tensor([0, 0, 0, 1, 1, 2, 3, 5, 6])
    depth = [0]
    for p in parents[1:].tolist():
        depth.append(depth[p] + 1)
    for kind, S, root in (("llama", 128, 60), ("llama", 256, 124), ("qwen2", 256, 130)):
        hf = tiny_hf(kind, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1)
        g = torch.Generator().manual_seed(S)
        prompt = torch.randint(3, 256, (1, root), generator=g)
        chain = torch.randint(3, 256, (1, 5), generator=g)
        tree = torch.randint(3, 256, (1, parents.shape[0]), generator=g)
        mask = tree_attention_mask(parents, max(depth), torch.tensor(root), S)
        forwards = {
            "one row": lambda t: t.forward(chain[:, :1], torch.tensor([[root]]), attend=S, aux_layers=(0, 2, 3)),
            "chain": lambda t: t.forward(chain, root + torch.arange(5).view(1, -1), attend=S, aux_layers=(0, 2, 3)),
            "tree": lambda t: t.forward(tree, root + torch.tensor([depth]), slots=root + torch.arange(9).view(1, -1),
                                        mask=mask, attend=S, aux_layers=(1,)),
        }
        results = {}
        for kernels in ("fused", "persistent"):
            target = Target(hf, kernels=kernels)
            target.setup_cache(S)
            target.stack_weights()
            with torch.inference_mode():
                target.forward(prompt, torch.arange(root).view(1, -1), attend=S)  # a prefill: the fused layers
                saved = target.cache.k.clone(), target.cache.v.clone()
                for name, forward in forwards.items():
                    target.cache.k.copy_(saved[0])
                    target.cache.v.copy_(saved[1])
                    out = forward(target)
                    results[kernels, name] = (out.logits, out.aux, target.cache.k.clone(), target.cache.v.clone())
                    if kernels == "persistent":
                        stack = target.layer_stack()
                        assert not stack.barrier.any() and not stack.counters.any(), (kind, S, name)
        assert target._stack is not None  # the persistent launch ran
        for name in forwards:
            for what, a, b in zip(("logits", "streams", "k", "v"), results["fused", name], results["persistent", name]):
                differ = a != b
                assert not differ.any(), (kind, S, name, what, f"{int(differ.sum())} of {a.numel()} differ, by at "
                                          f"most {(a.float() - b.float()).abs().max().item():.3g}")


def check_generations() -> None:
    """Whole generations with the persistent launch give transformers' greedy tokens: target-only, a
    chain and a tree."""
    from demo.config import TreeShape
    from demo.engine import Engine
    from demo.target import Target
    from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

    prompt = [1, 17, 99, 4, 250, 31, 8]
    hf = tiny_hf("llama", num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1)
    ref = hf_greedy(hf, prompt, 12)
    target = Target(hf, kernels="persistent")
    for method, k, tree in (("none", 0, None), ("eagle3", 3, None), ("eagle3", 3, TreeShape(3, 8))):
        drafter = tiny_drafter(method, target) if method != "none" else None
        engine = Engine(target, drafter, max_context=64)
        tokens, _ = run(engine, prompt, max_new_tokens=12, num_spec_tokens=k, tree=tree, stop_token_ids=())
        assert tokens == ref, method
    assert target._stack is not None


def test_the_persistent_launch_gives_the_fused_paths_logits_streams_and_cache_bit_for_bit():
    run_interpreted("from tests.kernels.test_persistent import check_logits_equal_the_fused_paths\n"
                    "check_logits_equal_the_fused_paths()\nprint('checked')")


def test_generations_through_the_persistent_launch_keep_target_greedy_tokens():
    run_interpreted("from tests.kernels.test_persistent import check_generations\ncheck_generations()\n"
                    "print('checked')")


def test_stacking_the_layers_keeps_every_weight_and_restacks_a_replaced_one():
    """The stack holds the layers' weights, and each module reads its slice (nothing stored twice);
    a weight given new storage afterwards makes the stack stale, and the next one holds it."""
    from demo.kernels.persistent import stack_current, stack_layers
    from demo.target import Target
    from tests.tiny import tiny_hf

    hf = tiny_hf("qwen2", num_hidden_layers=3)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    target = Target(hf)
    parts = target._layer_parts()
    stack = stack_layers(list(parts.values()))
    after = hf.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    layer = hf.model.layers[1]
    assert layer.mlp.down_proj.weight.data_ptr() == stack.down[1].data_ptr()
    assert layer.self_attn.k_proj.weight.data_ptr() == stack.qkv[1].data_ptr() + \
        layer.self_attn.q_proj.weight.numel() * stack.qkv.element_size()
    att = layer.self_attn
    assert att.v_proj.bias.data_ptr() == stack.qkv_bias[1].data_ptr() + \
        (att.q_proj.out_features + att.k_proj.out_features) * stack.qkv_bias.element_size()
    assert stack_current(stack, parts)
    hf.model.layers[-1].mlp.down_proj.weight.data = hf.model.layers[-1].mlp.down_proj.weight.clone() * 2
    assert not stack_current(stack, parts)
    again = stack_layers(list(target._layer_parts().values()))
    assert torch.equal(again.down[-1], 2 * before["model.layers.2.mlp.down_proj.weight"])


def test_on_a_cpu_the_persistent_choice_runs_the_pytorch_layers():
    """Without a GPU or the interpreter the choice changes nothing: PyTorch's layers, no stack."""
    from demo.target import Target
    from tests.tiny import tiny_hf

    hf = tiny_hf("llama", num_hidden_layers=2)
    reference, persistent = Target(hf, kernels="fused"), Target(hf, kernels="persistent")
    outs = []
    for target in (reference, persistent):
        target.setup_cache(32)
        with torch.inference_mode():
            outs.append(target.forward(torch.tensor([[5, 6, 7]]), torch.arange(3).view(1, -1)).logits)
    assert persistent.layer_stack() is None and persistent._stack is None
    assert torch.equal(outs[0], outs[1])


def test_the_persistent_grid_never_holds_more_programs_than_the_multiprocessors_hold_at_once(monkeypatch):
    """Programs wait for each other at every barrier, so a grid larger than what the multiprocessors
    hold together would never finish: the grid counts each one's registers (8 a thread at a time),
    threads and shared memory (with the driver's 1 KB a program), takes one a multiprocessor by
    default, and never more programs than the widest stage has tasks."""
    from types import SimpleNamespace

    from demo.kernels import persistent

    props = SimpleNamespace(multi_processor_count=132, regs_per_multiprocessor=65536,
                            max_threads_per_multi_processor=2048, shared_memory_per_multiprocessor=233472)
    monkeypatch.setattr(persistent, "INTERPRETED", False)
    monkeypatch.setattr(persistent.torch.cuda, "get_device_properties", lambda device: props)

    def compiled(regs, warps, shared):
        return SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(num_warps=warps, shared=shared),
                               _init_handles=lambda: None)

    assert persistent.resident(compiled(128, 4, 0), "cuda") == 4  # 65,536 registers / (128 x 128 threads)
    assert persistent.resident(compiled(102, 4, 0), "cuda") == 4  # 102 a thread are allocated as 104
    assert persistent.resident(compiled(32, 4, 46000), "cuda") == 4  # 228 KB / (46,000 + 1,024 bytes)
    assert persistent.resident(compiled(32, 8, 0), "cuda") == 8  # threads: 2,048 / 256
    assert persistent.resident(compiled(255, 8, 200 * 1024), "cuda") == 1  # at least the one that launches

    kernel = SimpleNamespace(warmup=lambda *args, grid, **kwargs: kernel.compiled)
    kernel.compiled = compiled(128, 4, 0)  # 4 a multiprocessor
    for per_sm, tasks, grid in ((1, 10_000, 132), (1, 96, 96), (0, 10_000, 528), (2, 10_000, 264),
                                (8, 10_000, 528), (0, 300, 300)):
        monkeypatch.setattr(persistent, "GRID", persistent.Grid(per_sm))
        assert persistent.programs(kernel, (), {}, "cuda", tasks) == grid, (per_sm, tasks)
    monkeypatch.setattr(persistent, "INTERPRETED", True)
    assert persistent.programs(kernel, (), {}, "cuda", 10_000) == 1  # the interpreter never waits


def test_a_forward_wider_than_the_grids_rows_runs_the_fused_layers_and_prefetch_waits_for_room_in_l2(monkeypatch):
    """The persistent launch takes at most Grid.max_rows rows (wider ones were quicker through the fused
    kernels); it prefetches the next layer only on a GPU whose L2 holds four layers, and its K/V only
    where each head's slots lie in one run."""
    from types import SimpleNamespace

    from demo.kernels import persistent

    stack = SimpleNamespace(gate_up=torch.empty(2, 256, 64), o=torch.empty(2, 64, 64), down=torch.empty(2, 64, 128))
    assert persistent.fits(stack, 16, 2, 1, 32) and not persistent.fits(stack, 17, 2, 1, 32)
    monkeypatch.setattr(persistent, "GRID", persistent.Grid(max_rows=64))
    assert persistent.fits(stack, 64, 2, 1, 32) and not persistent.fits(stack, 65, 2, 1, 32)

    layer = [torch.empty(3, 1 << 20, dtype=torch.bfloat16)]  # 2 MB a layer
    cache = torch.empty(3, 1, 2, 64, 32)  # [L, B, nkv, S, hd]
    monkeypatch.setattr(persistent, "INTERPRETED", False)
    for l2, prefetch, k, wanted in ((50 << 20, 2, cache, 2), (50 << 20, 1, cache, 1), (6 << 20, 2, cache, 0),
                                    (50 << 20, 0, cache, 0), (50 << 20, 2, cache.transpose(3, 4), 1)):
        monkeypatch.setattr(persistent, "GRID", persistent.Grid(prefetch=prefetch))
        monkeypatch.setattr(persistent.torch.cuda, "get_device_properties",
                            lambda device, l2=l2: SimpleNamespace(L2_cache_size=l2))
        assert persistent.prefetching(k, cache, *layer) == wanted, (l2, prefetch, k.stride())
    monkeypatch.setattr(persistent, "INTERPRETED", True)
    monkeypatch.setattr(persistent, "GRID", persistent.Grid())
    assert not persistent.prefetching(cache, cache, *layer)  # the interpreter has no L2 to ask


def test_a_launchs_stage_names_hold_a_combination_only_where_the_attention_splits_its_slots():
    from demo.kernels.persistent import stage_names

    assert stage_names(2, 10) == ["q/k/v", "attention", "o_proj", "gate/up", "down"] * 2
    assert stage_names(1, 6) == ["q/k/v", "attention", "combination", "o_proj", "gate/up", "down"]
