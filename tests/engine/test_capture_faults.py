"""demo.bench.capture_lab, the capture lab, on a CPU: its stand-in for a graph replay is eager mode token for
token and count for count, and leaves the engine it was made around as it was; each capture fault keeps
the text target-only's at T = 0 while acceptance falls, and only where the step is captured.

The drafter is tests/tiny.py's FeatureOracle: it drafts from the target's features as a trained head
does (a position-reading oracle could not see stale features), so fresh features accept every draft
but every 4th place's, and stale ones almost none."""

import pytest
import torch

from demo.bench.capture_lab import lab_around, lab_engine
from demo.bench.faults import CAPTURED_DEPTH, check_fault
from demo.config import TreeShape
from demo.engine import Engine
from demo.target import Target
from tests.tiny import FeatureOracle, hf_greedy, run, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]
SHAPES = [None, TreeShape(2, 0)]
IDS = ["chain", "tree"]


@pytest.fixture(scope="module")
def models():
    """(hf, target, drafter, the target's greedy continuation of PROMPT)."""
    hf = tiny_hf("llama")
    target = Target(hf)
    reference = hf_greedy(hf, PROMPT, 40)
    return hf, target, FeatureOracle(target, PROMPT + reference, every=4), reference


def counts(events):
    """A run's acceptance counts: drafting steps, accepted drafts, and steps accepting >= i drafts."""
    s = events[-1].stats
    return s.num_drafts, s.num_accepted_tokens, s.accepted_per_position


@pytest.mark.parametrize("tree", SHAPES, ids=IDS)
def test_replayed_without_a_fault_is_eager_token_for_token_and_count_for_count(models, tree):
    _, target, drafter, _ = models
    for sampling in (dict(), dict(temperature=0.9, top_p=0.95, seed=3)):
        gen = dict(max_new_tokens=40, num_spec_tokens=3, tree=tree, stop_token_ids=(), **sampling)
        tokens, events = run(Engine(target, drafter, max_context=256), PROMPT, **gen)
        lab_tokens, lab_events = run(lab_engine(target, drafter, max_context=256), PROMPT, **gen)
        assert lab_tokens == tokens and counts(lab_events) == counts(events)
        assert [e.num_accepted for e in lab_events] == [e.num_accepted for e in events]


def test_a_lab_engine_leaves_the_engine_it_was_made_around_unchanged(models):
    # the app makes a lab engine per benchmark run over its shared models: the shared engine must
    # decode afterwards exactly as before, from the same persistent buffers
    _, target, drafter, _ = models
    engine = Engine(target, drafter, max_context=256)
    gen = dict(max_new_tokens=40, num_spec_tokens=3, stop_token_ids=())
    before_tokens, before = run(engine, PROMPT, **gen)
    b = engine.prepare(3)
    tensors = {name: t.data_ptr() for name, t in vars(b).items() if isinstance(t, torch.Tensor)}
    lab = lab_around(engine, "stale-features")
    assert lab.mode == engine.mode and lab.drafter is engine.drafter and lab.target is engine.target
    run(lab, PROMPT, **gen)
    after_tokens, after = run(engine, PROMPT, **gen)
    assert after_tokens == before_tokens and counts(after) == counts(before)
    assert type(engine) is Engine and not hasattr(engine, "fault")
    assert {name: t.data_ptr() for name, t in vars(b).items() if isinstance(t, torch.Tensor)} == tensors


@pytest.mark.parametrize("tree", SHAPES, ids=IDS)
def test_stale_features_keep_the_text_target_only_while_acceptance_falls_at_every_draft(models, tree):
    _, target, drafter, reference = models
    gen = dict(max_new_tokens=40, num_spec_tokens=3, tree=tree, stop_token_ids=())
    _, eager = run(Engine(target, drafter, max_context=256), PROMPT, **gen)
    tokens, faulted = run(lab_engine(target, drafter, fault="stale-features", max_context=256), PROMPT, **gen)
    assert tokens == reference  # verification keeps the fault out of the text
    good, bad = eager[-1].stats, faulted[-1].stats
    assert bad.mean_acceptance_length < good.mean_acceptance_length - 1
    assert all(b < g for b, g in zip(bad.acceptance_per_position, good.acceptance_per_position))


def test_stale_features_are_invisible_to_eager_mode(models):
    # eager looks the rebound name up again every step: a test run only eagerly never sees the fault
    _, target, drafter, _ = models
    gen = dict(max_new_tokens=40, num_spec_tokens=3, stop_token_ids=())
    tokens, eager = run(Engine(target, drafter, max_context=256), PROMPT, **gen)
    lab = lab_engine(target, drafter, fault="stale-features", replay=False, max_context=256)
    lab_tokens, faulted = run(lab, PROMPT, **gen)
    assert lab_tokens == tokens and counts(faulted) == counts(eager)


def test_a_drafter_step_captured_at_k_1_keeps_draft_1_and_loses_the_rest(models):
    _, target, drafter, reference = models
    gen = dict(max_new_tokens=40, num_spec_tokens=3, stop_token_ids=())
    tokens, faulted = run(lab_engine(target, drafter, fault="draft-shape", max_context=256), PROMPT, **gen)
    assert tokens == reference
    accepted = faulted[-1].stats.accepted_per_position
    assert accepted[0] > 0 and accepted[CAPTURED_DEPTH:] == [0, 0]  # drafts 2 and 3 are stale buffer contents
    # eager builds every step at its own k: no shape to mismatch
    lab = lab_engine(target, drafter, fault="draft-shape", replay=False, max_context=256)
    assert counts(run(lab, PROMPT, **gen)[1]) == counts(run(Engine(target, drafter, max_context=256), PROMPT, **gen)[1])


@pytest.mark.parametrize("fault, k, tree, message", [
    ("hot-cache", 3, False, "the capture fault must be one of none, stale-features, draft-shape"),
    ("stale-features", 0, False, "target-only has none"),
    ("draft-shape", 3, True, "draft a chain"),
])
def test_a_fault_that_cannot_act_is_refused_in_a_sentence(fault, k, tree, message):
    with pytest.raises(ValueError, match=message):
        check_fault(fault, k, tree)


def test_on_the_default_target_stale_features_lower_acceptance_and_keep_the_text(default_target):
    # the embedded SmolLM2-135M-Instruct and its bundled EAGLE-3 head, as the app runs them on a CPU
    from demo.drafter_common import drafter_dtype, drafter_int8
    from demo.models.checkpoints import load_drafter
    from demo.models.presets import bundled_drafter_dir
    from demo.models.prompts import chat_ids

    hf, tok = default_target
    target = Target(hf)
    engine = Engine(target, load_drafter(str(bundled_drafter_dir("eagle3")), target), max_context=256,
                    drafter_dtype=drafter_dtype(target.dtype, target.device),
                    drafter_int8=drafter_int8(target.dtype, target.device))
    prompt = chat_ids(tok, [{"role": "user", "content": "Write a haiku about the sea."}])
    gen = dict(max_new_tokens=24, num_spec_tokens=3)
    tokens, eager = run(engine, prompt, **gen)
    faulted_tokens, faulted = run(lab_around(engine, "stale-features"), prompt, **gen)
    target_only, _ = run(Engine(target, None, max_context=256), prompt, max_new_tokens=24)
    assert faulted_tokens == tokens == target_only
    assert faulted[-1].stats.mean_acceptance_length < eager[-1].stats.mean_acceptance_length - 0.3


def test_a_lab_engine_keeps_every_engine_method_callable(models):
    # the lab keeps state of its own beside the engine's; an attribute that took a method's name
    # (as its bindings once took Engine._captured) breaks only the GPU's capture, which no CPU run reaches
    _, target, drafter, _ = models
    lab = lab_engine(target, drafter, fault="stale-features", max_context=256)
    lab.prepare(3)
    methods = {name for name in dir(Engine) if callable(getattr(Engine, name))}
    assert sorted(name for name in vars(lab) if name in methods) == []
