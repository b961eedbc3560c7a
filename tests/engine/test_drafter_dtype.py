"""A drafter computing in another dtype than the target's (bf16 beside an fp32 target, what a CPU
with native bf16 multiplies runs: demo.drafter_common.drafter_dtype): the output stays the target's,
token for token, and the drafts stay the fp32 drafter's nearly everywhere."""

import pytest
import torch

from demo import drafter_common
from demo.config import TreeShape
from demo.drafter_common import drafter_dtype
from demo.engine import Engine
from demo.target import Target
from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]


def _drafter(method: str, target):
    if method == "eagle3-shared-head":  # drafts through the target's lm_head, as the shipped one
        return tiny_drafter("eagle3", target, own_lm_head=False)
    return tiny_drafter(method, target)


def _drafts(events) -> list[int]:
    return [t for e in events for t in e.draft_ids]


@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle3-shared-head"])
@pytest.mark.parametrize("tree", [None, TreeShape(3, 8)], ids=["chain", "tree"])
def test_a_bf16_drafter_beside_an_fp32_target_changes_no_token_and_drafts_as_in_fp32(method, tree):
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 40)
    target = Target(hf)
    drafts = {}
    for dtype in (torch.float32, torch.bfloat16):
        drafter = _drafter(method, target)
        engine = Engine(target, drafter, max_context=128, drafter_dtype=dtype)
        tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=3, tree=tree, stop_token_ids=())
        assert tokens == ref
        assert drafter.dtype == dtype and drafter.lm_head.weight.dtype == dtype  # the head copied where borrowed
        assert target.lm_head.weight.dtype == torch.float32  # the target's own head untouched
        drafts[dtype] = _drafts(events)
    same = sum(a == b for a, b in zip(drafts[torch.float32], drafts[torch.bfloat16]))
    assert same >= 0.8 * len(drafts[torch.float32]) > 0


def test_a_bf16_drafters_logits_come_back_in_the_targets_dtype():
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    Engine(target, drafter, max_context=64, drafter_dtype=torch.bfloat16)
    hidden = torch.randn(1, 2, target.config.hidden_size)  # the engine's buffers may hold either dtype
    logits, out = drafter.forward(torch.tensor([[5, 6]]), torch.tensor([[0, 1]]), hidden)
    assert logits.dtype == torch.float32 and out.dtype == torch.bfloat16
    features = torch.randn(1, 2, drafter.fc.in_features)
    assert drafter.project(features).dtype == torch.bfloat16


def test_hot_tokens_of_a_bf16_drafter_are_its_hot_rows_of_the_targets_head_in_bf16():
    target = Target(tiny_hf("llama"))
    drafter = _drafter("eagle3-shared-head", target)
    drafter.share_target(target)
    hot = torch.tensor([3, 9, 40, 41, 200])
    drafter.limit_vocab(hot)
    Engine(target, drafter, max_context=64, drafter_dtype=torch.bfloat16)
    assert drafter.lm_head.weight.dtype == torch.bfloat16 and drafter.drafting_vocab == 5
    assert torch.equal(drafter.lm_head.weight, target.lm_head.weight[hot].to(torch.bfloat16))


@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("native", [True, False])
def test_beside_an_fp32_target_a_cpu_drafts_in_fp32_with_an_int8_head_else_in_native_bf16(native, int8, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(drafter_common, "int8_available", lambda: int8)
    assert drafter_dtype(torch.float32, "cpu") == (torch.bfloat16 if native and not int8 else torch.float32)
    assert drafter_common.drafter_int8(torch.float32, "cpu") is int8
    assert drafter_dtype(torch.bfloat16, "cpu") == torch.bfloat16
    assert drafter_dtype(torch.float32, "cuda") == torch.float32  # a GPU drafts in the target's dtype
    assert drafter_common.drafter_dtype is drafter_dtype


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_drafter_pass_in_either_dtype_traces_whole_as_the_compiled_drafter_needs(method, dtype):
    # graph mode compiles the drafter's passes with fullgraph=True (demo.engine.compile_step): its
    # casts and dtype reads must not break the graph
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter(method, target)
    Engine(target, drafter, max_context=64, drafter_dtype=dtype)
    drafter.stack_weights()
    step = torch.compile(lambda t, p, h: drafter.forward(t, p, h), backend="eager", fullgraph=True)
    logits, hidden = step(torch.tensor([[5, 6]]), torch.tensor([[0, 1]]), torch.randn(1, 2, drafter.cfg.hidden_size))
    assert logits.dtype == torch.float32 and hidden.dtype == dtype
    project = torch.compile(lambda x: drafter.project(x), backend="eager", fullgraph=True)
    width = drafter.fc.in_features if method == "eagle3" else drafter.cfg.hidden_size
    assert project(torch.randn(1, 2, width)).dtype == (dtype if method == "eagle3" else torch.float32)
