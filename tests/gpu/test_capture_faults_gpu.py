"""demo.bench.capture_lab on a GPU: the capture lab's faults inside the engine's real CUDA graphs. Without a
fault the lab's graphs are eager's counts; with stale features or a drafter step captured at k = 1 the
text stays target-only's while acceptance falls (tests/engine/test_capture_faults.py proves the same
of the CPU stand-in).

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import pytest
import torch

import demo.engine as engine_module
from demo.bench.capture_lab import lab_engine
from demo.bench.faults import CAPTURED_DEPTH
from demo.config import GenerationConfig, TreeShape
from demo.engine import Engine
from demo.target import Target
from tests.gpu.helpers import PROMPT
from tests.tiny import FeatureOracle, tiny_hf

pytestmark = pytest.mark.cuda

GEN = dict(max_new_tokens=48, num_spec_tokens=3, stop_token_ids=())


def decode(engine, tree=None):
    events = list(engine.generate(PROMPT, GenerationConfig(**GEN, tree=tree)))
    s = events[-1].stats
    return [t for e in events for t in e.token_ids], (s.num_drafts, s.num_accepted_tokens, s.accepted_per_position)


@pytest.fixture
def models(monkeypatch):
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 64)  # replies cross from attend bucket 64 to 128
    target = Target(tiny_hf("llama").to("cuda"))
    reference, _ = decode(Engine(target, None, max_context=128))
    return target, FeatureOracle(target, PROMPT + reference, every=4), reference


def test_the_labs_graphs_without_a_fault_are_eagers_counts(models):
    target, drafter, reference = models
    eager = decode(Engine(target, drafter, max_context=128))
    assert decode(lab_engine(target, drafter, mode="cudagraph", max_context=128)) == eager
    assert eager[0] == reference


@pytest.mark.parametrize("fault", ["stale-features", "draft-shape"])
def test_a_fault_in_the_real_graphs_keeps_the_text_and_lowers_acceptance(models, fault):
    target, drafter, reference = models
    _, (_, accepted, per_position) = decode(Engine(target, drafter, max_context=128))
    lab = lab_engine(target, drafter, fault=fault, mode="cudagraph", max_context=128)
    tokens, (_, faulted, faulted_per_position) = decode(lab)
    assert tokens == reference and faulted < accepted
    assert any(g.replays for g in lab.prepare(3).graphs.values())  # the graphs ran
    if fault == "draft-shape":
        assert faulted_per_position[CAPTURED_DEPTH:] == [0, 0]


@pytest.mark.parametrize("fault", ["none", "stale-features"])
def test_a_trees_graphs_over_several_buckets_replay_safely_with_or_without_the_fault(models, fault):
    """Every graph of a shape shares one memory pool: a fault that bound a tensor made inside one
    capture, dropped by the next, let another graph's scratch reuse it (an illegal address on the
    default tree). Here the replies cross buckets, twice, and the device stays sound."""
    target, drafter, reference = models
    tree = TreeShape(2, 6)
    eager = decode(Engine(target, drafter, max_context=128), tree)
    lab = lab_engine(target, drafter, fault=fault, mode="cudagraph", max_context=128)
    first, second = decode(lab, tree), decode(lab, tree)
    torch.cuda.synchronize()
    assert first == second and first[0] == reference
    if fault == "none":
        assert first == eager
    else:
        assert first[1][1] < eager[1][1]
