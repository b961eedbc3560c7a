"""The proposer contract (demo/proposers/), run for every method of the registry on tiny models: a
proposer writes its draft into the step's persistent buffers, so the same step runs eagerly and
captured (graph mode's capture over CPU stand-ins of CUDA graphs, and the capture lab's replay of the
binding a capture saw) with the same tokens and the same acceptance counts, and at T = 0 every
method emits exactly what target-only decoding emits.

No weights, no GPU: tests/tiny.py's random Llama; its targets have no end-of-sequence token, so each
run goes to max_new_tokens.
"""

from __future__ import annotations

import pytest
import torch

import demo.capture as capture_module
import demo.engine as engine_module
from demo.bench.capture_lab import lab_engine
from demo.config import GenerationConfig, TreeShape
from demo.engine import Engine
from demo.methods import REGISTRY
from demo.proposers import NgramProposer, proposer_for
from demo.proposers.ngram import copy_source
from demo.target import Target
from tests.engine.test_engine_replicas import StandInEvent, StandInGraph
from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

PROMPT = [5, 9, 3, 7, 5, 9, 3, 7, 5, 9, 3, 7, 11, 5, 9]  # repeats itself: a lookup has something to copy
DRAFTING = [name for name, m in REGISTRY.items() if m.proposer is not None]


def proposer(method: str, target: Target):
    drafter = tiny_drafter(method, target) if REGISTRY[method].needs_drafter else None
    return proposer_for(method, drafter)


def shapes(method: str) -> list[TreeShape | None]:
    return [None, TreeShape(2, 5)] if REGISTRY[method].trees else [None]


@pytest.fixture
def graph_mode(monkeypatch):
    """Engines whose prepare() captures every step into CPU stand-ins of CUDA graphs (as
    tests/engine/test_engine_replicas.py's): graph mode's capture, replicas and run-ahead, on a CPU."""
    monkeypatch.setattr(capture_module, "CapturedStep", StandInGraph)
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 64)

    def make(target, proposer, **kw):
        engine = Engine(target, proposer, **kw)
        engine.mode = "cudagraph"
        return engine
    return make


def counts(events):
    s = events[-1].stats
    return s.num_drafts, s.num_accepted_tokens, s.accepted_per_position, [e.num_accepted for e in events]


def test_the_registry_names_a_proposer_for_every_method_that_drafts():
    target = Target(tiny_hf("llama"))
    for name, spec in REGISTRY.items():
        made = proposer(name, target)
        assert (made is None) == (spec.proposer is None), name
        if made is not None:
            assert made.method == name and made.trees == spec.trees and made.samples_drafts == spec.samples_drafts


@pytest.mark.parametrize("method", DRAFTING)
def test_every_method_at_t0_emits_what_target_only_emits(method):
    hf = tiny_hf("llama")
    reference = hf_greedy(hf, PROMPT, 30)
    target = Target(hf)
    for tree in shapes(method):
        engine = Engine(target, proposer(method, target), max_context=128)
        tokens, events = run(engine, PROMPT, max_new_tokens=30, num_spec_tokens=3, tree=tree, stop_token_ids=())
        assert tokens == reference, (method, tree)
        assert events[-1].stats.num_drafts == len(events) - 1  # every step drafted


@pytest.mark.parametrize("method", DRAFTING)
@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_every_method_captured_is_eager_token_for_token_and_count_for_count(method, temperature, graph_mode):
    hf = tiny_hf("llama")
    target = Target(hf)
    made = proposer(method, target)
    for tree in shapes(method):
        gen = dict(max_new_tokens=30, num_spec_tokens=3, tree=tree, temperature=temperature, seed=5, stop_token_ids=())
        tokens, events = run(Engine(target, made, max_context=128), PROMPT, **gen)
        graph_tokens, graph_events = run(graph_mode(target, made, max_context=128), PROMPT, **gen)
        assert graph_tokens == tokens and counts(graph_events) == counts(events), (method, tree)
        drafter = getattr(made, "drafter", None)
        if drafter is not None:  # the capture lab's replay of the captured binding, no fault
            lab_tokens, lab_events = run(lab_engine(target, drafter, max_context=128), PROMPT, **gen)
            assert lab_tokens == tokens and counts(lab_events) == counts(events), (method, tree)


@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_a_compiled_captured_chain_drafts_what_eager_drafts(method, graph_mode):
    """compile="drafter" (the proposer's steps and the acceptance test through inductor, then
    captured) proposes, step by step, the drafts eager proposes. The vLLM change's failure mode: a
    compiled step that stages the drafter's next positions wrong drafts other tokens, and the text
    stays lossless while acceptance falls (inductor wrote a view of verify_positions back after its
    add_, so the drafter read every position n + 1 too far)."""
    target = Target(tiny_hf("llama", seed=5, vocab_size=8))  # 8 tokens: drafts are often accepted
    made = proposer(method, target)
    gen = dict(max_new_tokens=40, num_spec_tokens=3, stop_token_ids=())
    prompt = [7, 4, 1, 6, 3]
    tokens, events = run(Engine(target, made, max_context=128), prompt, **gen)
    graph_tokens, graph_events = run(graph_mode(target, made, max_context=128, compile="drafter"), prompt, **gen)
    assert [e.draft_ids for e in graph_events] == [e.draft_ids for e in events]
    assert graph_tokens == tokens and counts(graph_events) == counts(events)


def test_an_ngram_draft_copies_what_followed_the_texts_last_tokens():
    """A target that always continues "a" and a prompt of a's: every copied draft is accepted, so
    each step emits k + 1 tokens, as many as a perfect drafter's."""
    hf = tiny_hf("llama")
    with torch.no_grad():
        hf.lm_head.weight.zero_()  # every logit equal: the target's argmax is token 0, always
    target = Target(hf)
    engine = Engine(target, NgramProposer(), max_context=128)
    tokens, events = run(engine, [0] * 8, max_new_tokens=25, num_spec_tokens=4, stop_token_ids=())
    assert tokens == [0] * 25
    assert all(e.num_accepted == 4 for e in events[1:-1])  # the last step may be cut at the budget
    assert events[1].tree.tokens == [0, 0, 0, 0] and events[1].draft_top is None  # a copy has no candidates


@pytest.mark.parametrize("k", [1, 3])
def test_each_ngram_draft_is_the_copy_the_text_so_far_points_to(k):
    """Step by step, the chain the engine drafts (on the device, from its token history) is the one
    copy_source finds on the host in the prompt and the tokens emitted so far: the history holds each
    emitted token at its own position, so the lookup reads the real text and accepts what it should
    (a history one position off still emits target-only's tokens, the same text, only with far fewer
    drafts accepted)."""
    target = Target(tiny_hf("llama"))
    engine = Engine(target, NgramProposer(), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=k, stop_token_ids=())
    text = list(PROMPT) + events[0].token_ids
    for e in events[1:]:
        source = copy_source(text)
        start = source[0] if source else len(text) - 1  # nothing repeats: the last token, repeated
        period = max(len(text) - start, 1) if source else 1
        assert e.draft_ids == [text[start + t % period] for t in range(k)], f"step {e.step}"
        text += e.token_ids
    assert sum(e.num_accepted for e in events) > 0


def test_an_ngram_proposer_drafts_chains_only_and_its_drafts_are_point_masses():
    target = Target(tiny_hf("llama"))
    engine = Engine(target, NgramProposer(), max_context=128)
    with pytest.raises(ValueError, match="drafts chains"):
        list(engine.generate(PROMPT, GenerationConfig(max_new_tokens=4, num_spec_tokens=2, tree=TreeShape(2, 4))))
    # at T > 0 under the default rule (wor, which samples drafts) a copy is still a chain of point masses
    events = list(engine.generate(PROMPT, GenerationConfig(max_new_tokens=12, num_spec_tokens=3, temperature=0.8,
                                                           stop_token_ids=())))
    assert all(len(e.draft_ids) == 3 for e in events[1:])
    assert all(e.tree.draft_probs == [1.0] * 3 for e in events[1:])


@pytest.mark.parametrize("min_ngram, expect", [(1, [5, 1, 3]), (2, [5, 1, 3]), (3, None)])
def test_a_lookup_copies_after_the_longest_suffix_of_at_least_the_minimum(min_ngram, expect):
    """The text 2 3 7 2 3 5 1 3 0 2 3 ends in "2 3": its latest earlier occurrence (ending at index 4)
    is followed by 5 1 3; the shorter "3" occurs later (index 7, followed by 0 2 3) but the longer
    match wins, as vLLM's n-gram proposer takes the longest. No earlier "0 2 3": a minimum of 3 finds
    nothing."""
    from demo.proposers.ngram import lookup_continuation

    history = torch.tensor([2, 3, 7, 2, 3, 5, 1, 3, 0, 2, 3, 0, 0])
    tokens, found = lookup_continuation(history, torch.tensor(11), 3, max_ngram=4, min_ngram=min_ngram)
    assert bool(found) == (expect is not None)
    if expect is not None:
        assert tokens.tolist() == expect
