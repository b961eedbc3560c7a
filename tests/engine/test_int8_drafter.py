"""A drafter's head and decoder layer through int8 copies on a CPU (what a CPU beside an fp32 target
runs: demo.drafter_common.drafter_int8): the output stays the target's token for token, the drafts
stay the fp32 drafter's nearly everywhere, fc and the target's own weights are never quantized."""

import pytest
import torch
from torch import nn

from demo import drafter_common
from demo.config import GenerationConfig, TreeShape
from demo.drafter_common import drafter_int8
from demo.engine import Engine
from demo.layers import INT8_WEIGHTS, int8_available, linear, stacked, use_int8_weights
from demo.target import Target
from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]


def test_an_int8_copy_multiplies_within_its_quantization_error_and_unmarked_is_fp32_again():
    torch.manual_seed(0)
    m = nn.Linear(64, 512, bias=False)
    x = torch.randn(3, 64)
    exact = x @ m.weight.t()
    use_int8_weights([m])
    with torch.no_grad():
        y = linear(m, x)
    assert stacked(m)._packed[0] == "int8"
    assert not torch.equal(y, exact) and (y - exact).abs().max() < 0.03 * exact.abs().max()
    use_int8_weights([m], False)
    with torch.no_grad():
        assert stacked(m)._prepacked()[0] != "int8" and torch.allclose(linear(m, x), exact, atol=1e-5)


@pytest.mark.parametrize("tree", [None, TreeShape(3, 8)], ids=["chain", "tree"])
def test_an_int8_drafter_changes_no_token_and_drafts_as_in_fp32(tree, monkeypatch):
    monkeypatch.setattr(drafter_common, "INT8_MIN_BYTES", 0)  # the tiny head counts as a large one
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 40)
    target = Target(hf)
    drafts = {}
    for int8 in (False, True):
        drafter = tiny_drafter("eagle3", target, draft_vocab_size=128)  # its own head
        engine = Engine(target, drafter, max_context=128, drafter_int8=int8)
        tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=3, tree=tree, stop_token_ids=())
        assert tokens == ref
        assert getattr(drafter.lm_head, INT8_WEIGHTS, False) is int8 and drafter.head_in_int8 is int8
        layer = [m for m in drafter.midlayer.modules() if isinstance(m, nn.Linear)]
        assert len(layer) == 7 and all(getattr(m, INT8_WEIGHTS, False) is int8 for m in layer)  # q/k/v, o, gate/up, down
        assert drafter.layer_in_int8 is int8 and not getattr(drafter.fc, INT8_WEIGHTS, False)  # fc stays fp32
        drafts[int8] = [t for e in events for t in e.draft_ids]
    same = sum(a == b for a, b in zip(drafts[False], drafts[True]))
    assert same >= 0.8 * len(drafts[False]) > 0


def test_the_head_alone_in_int8_leaves_the_layer_in_fp32(monkeypatch):
    monkeypatch.setattr(drafter_common, "INT8_MIN_BYTES", 0)
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target, draft_vocab_size=128)
    engine = Engine(target, drafter, max_context=64, drafter_int8="head")
    assert engine.drafter_int8 == "head" and drafter.head_in_int8 and not drafter.layer_in_int8
    drafter.use_int8(False)
    assert not drafter.head_in_int8 and not drafter.layer_in_int8
    assert Engine(target, drafter, max_context=64, drafter_int8="no").drafter_int8 is False  # only True or "head"


def test_the_targets_head_a_drafter_borrows_is_never_quantized_but_its_hot_rows_are(monkeypatch):
    monkeypatch.setattr(drafter_common, "INT8_MIN_BYTES", 0)
    target = Target(tiny_hf("llama"))
    eagle = tiny_drafter("eagle", target)  # EAGLE-1 drafts through the target's lm_head: through a view of its weight
    engine = Engine(target, eagle, max_context=64, drafter_int8=True)
    assert eagle.lm_head is not target.lm_head and eagle.lm_head.weight is target.lm_head.weight  # no fp32 copy
    assert eagle.head_in_int8 and not getattr(target.lm_head, INT8_WEIGHTS, False)
    x = torch.randn(2, target.config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(linear(target.lm_head, x), x @ target.lm_head.weight.t(), atol=1e-5)  # fp32 for the target
        assert stacked(eagle.lm_head)._prepacked()[0] == "int8" and stacked(target.lm_head)._prepacked()[0] != "int8"
    tokens, _ = run(engine, PROMPT, max_new_tokens=30, num_spec_tokens=3, stop_token_ids=())
    assert tokens == hf_greedy(target.hf, PROMPT, 30)
    eagle.use_int8(False)
    assert eagle.lm_head is target.lm_head and not eagle.head_in_int8  # back to the target's module, no second copy
    shared = tiny_drafter("eagle3", target, own_lm_head=False)
    shared.share_target(target)
    shared.limit_vocab(torch.tensor([3, 9, 40, 41, 200]))  # its hot rows: a copy of its own
    Engine(target, shared, max_context=64, drafter_int8=True)
    assert getattr(shared.lm_head, INT8_WEIGHTS, False) and not getattr(target.lm_head, INT8_WEIGHTS, False)


def test_a_small_head_stays_in_fp32_and_a_gpu_engine_never_quantizes():
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target, draft_vocab_size=128)
    assert Engine(target, drafter, max_context=64, drafter_int8=True).drafter_int8
    assert not getattr(drafter.lm_head, INT8_WEIGHTS, False) and not drafter.head_in_int8  # a few KB: no step's cost


@pytest.mark.parametrize("native", [True, False])
def test_the_int8_drafter_is_chosen_on_any_cpu_beside_an_fp32_target_native_bf16_or_not(native, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert drafter_int8(torch.float32, "cpu") is int8_available()  # quicker than a bf16 drafter where both run
    assert not drafter_int8(torch.bfloat16, "cpu") and not drafter_int8(torch.float32, "cuda")


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
def test_a_generation_starts_its_catch_up_from_no_rows_of_the_one_before(tree, monkeypatch):
    """A CPU's int8 drafter takes its activation scale over all of a call's rows, so the rows of the
    first catch-up that the prefill does not write must not hold the previous generation's (with the
    bundled EAGLE-3 two runs of one prompt then drafted differently, and the page's race counted other
    steps than its status)."""
    monkeypatch.setattr(drafter_common, "INT8_MIN_BYTES", 0)
    target = Target(tiny_hf("llama"))
    engine = Engine(target, tiny_drafter("eagle3", target, draft_vocab_size=128), max_context=128, drafter_int8=True)
    run(engine, [5, 250, 251, 252, 253, 254, 3, 9] * 3, max_new_tokens=24, num_spec_tokens=4, tree=tree,
        stop_token_ids=())
    b = next(iter(engine._buffers.values()))
    assert b.draft.catch_features[:, 1:].abs().sum() > 0  # the previous generation's rows, before the next prefill
    gen = GenerationConfig(max_new_tokens=8, num_spec_tokens=4, tree=tree, stop_token_ids=())
    next(engine.generate(PROMPT, gen))  # the prefill's event
    assert not b.draft.catch_features[:, 1:].any() and not b.draft.catch_tokens[0, 1:].any()
