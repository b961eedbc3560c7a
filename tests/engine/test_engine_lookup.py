"""A draft tree with a prompt-lookup branch (TreeShape.lookup): the branch changes how many forwards a
reply takes, never its tokens; each step verifies what followed the text's last tokens where they last
appeared, hung where it leaves the drafter's tree, and on a reply that repeats itself steps accept
past the drafter's depth."""

import pytest
import torch

from demo.bench.tools.lookup import continuation
from demo.config import LOOKUP_NGRAM, DraftShape, GenerationConfig, TreeShape
from demo.engine import Engine
from demo.step_buffers import state_tensors
from demo.target import Target
from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]
REPEATING = dict(vocab_size=8)  # a tiny target of 8 tokens: its greedy replies fall into runs and repeats


@pytest.mark.parametrize("kind, seed, k, tree", [
    ("llama", 0, 3, TreeShape(3, 9, 8)), ("qwen2", 3, 4, TreeShape(2, 6, 16)), ("llama", 1, 2, TreeShape(1, 0, 5))],
    ids=["tree-3x3-lookup8", "tree-4x2-lookup16", "top1-lookup5"])
def test_a_lookup_tree_emits_the_targets_greedy_tokens(kind, seed, k, tree):
    hf = tiny_hf(kind, seed=seed)
    ref = hf_greedy(hf, PROMPT, 60)
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target, draft_vocab_size=128), max_context=160)
    tokens, events = run(engine, PROMPT, max_new_tokens=60, num_spec_tokens=k, tree=tree, stop_token_ids=())
    assert tokens == ref
    shape = DraftShape.of(k, tree)
    assert all(len(e.draft_ids) == shape.verified and e.tree.copied == tree.lookup for e in events[1:])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_a_repeating_reply_the_branch_is_accepted_past_the_drafters_depth_in_fewer_forwards(seed):
    hf = tiny_hf("llama", seed=seed, **REPEATING)
    prompt = [1, 2, 3, 4, 5]
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=256)
    plain, plain_events = run(engine, prompt, max_new_tokens=100, num_spec_tokens=2, tree=TreeShape(2, 4),
                              stop_token_ids=())
    tokens, events = run(engine, prompt, max_new_tokens=100, num_spec_tokens=2, tree=TreeShape(2, 4, 8),
                         stop_token_ids=())
    assert tokens == plain == hf_greedy(hf, prompt, 100)
    assert len(events) < len(plain_events)
    assert max(e.num_accepted for e in events) > 2  # deeper than the drafter drafts
    copied = [n for e in events[1:] for n in e.tree.path if e.tree.is_copied(n)]
    assert copied
    stats = events[-1].stats
    assert stats.reach == 2 + 8 and len(stats.accepted_per_position) == 10
    assert stats.num_drafts == len(events) - 1 and stats.num_draft_tokens == 10 * stats.num_drafts


def test_each_step_verifies_what_followed_the_texts_last_tokens_hung_where_it_leaves_the_tree():
    hf = tiny_hf("llama", seed=0, **REPEATING)
    prompt = [1, 2, 3, 4, 5]
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=256)
    lookup, depth = 6, 3
    _, events = run(engine, prompt, max_new_tokens=80, num_spec_tokens=depth, tree=TreeShape(2, 5, lookup),
                    stop_token_ids=())
    text = list(prompt)
    for e in events:
        if e.step:
            tree = e.tree
            depths = [0] + tree.depths
            first = len(tree.tokens) - lookup + 1  # node id of the branch's first node
            hung = tree.parents[first - 1]
            branch = continuation(text, depth + lookup, LOOKUP_NGRAM) or [text[-1]] * (depth + lookup)
            # the walk went down the drafter's tree along the branch as far as it agreed ...
            walked, node = [], hung
            while node:
                walked.append(tree.tokens[node - 1])
                node = tree.parents[node - 1]
            assert walked[::-1] == branch[:depths[hung]]
            # ... and the rest of the branch hangs there as a chain
            assert tree.tokens[first - 1:] == branch[depths[hung]:depths[hung] + lookup]
            assert tree.parents[first - 1:] == [hung] + list(range(first, first + lookup - 1))
            assert all(tree.draft_probs[n - 1] == 0.0 for n in range(first, first + lookup))
            siblings = [tree.tokens[i] for i, p in enumerate(tree.parents) if p == hung]
            assert len(siblings) == len(set(siblings))
        text += e.token_ids


def test_the_pointmass_rule_at_t_above_0_takes_the_branch_and_a_seed_repeats_its_tokens():
    hf = tiny_hf("llama", seed=0, **REPEATING)
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=256)
    gen = dict(max_new_tokens=80, num_spec_tokens=2, tree=TreeShape(2, 4, 8), temperature=0.7, seed=5,
               draft_sampling="pointmass", stop_token_ids=())
    first, events = run(engine, [1, 2, 3, 4, 5], **gen)
    again, _ = run(engine, [1, 2, 3, 4, 5], **gen)
    assert first == again and len(first) == 80
    assert all(e.tree.copied == 8 for e in events[1:])


def test_drafts_drawn_from_q_carry_no_branch_and_a_chain_cannot_have_one():
    tree = TreeShape(4, 20, 16)
    assert GenerationConfig(temperature=1.0, tree=tree, draft_sampling="wor").draft_shape(5).lookup == 0
    assert GenerationConfig(temperature=1.0, tree=tree, draft_sampling="pointmass").draft_shape(5).lookup == 16
    shape = GenerationConfig(tree=tree).draft_shape(5)
    assert (shape.reach, shape.verified, shape.width) == (21, 35, 36)
    with pytest.raises(ValueError, match="not on a chain"):
        DraftShape(3, 1, 3, lookup=4).check()
    with pytest.raises(ValueError, match="0 to 64"):
        DraftShape(3, 2, 6, tree=True, lookup=65).check()


def test_a_lookup_step_keeps_its_tensors_in_persistent_buffers():
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=128)
    gen = GenerationConfig(max_new_tokens=12, num_spec_tokens=3, tree=TreeShape(2, 5, 6), stop_token_ids=())
    b = engine.prepare(gen.draft_shape(3))
    before = [t.data_ptr() for t in state_tensors(b)]
    run(engine, PROMPT, max_new_tokens=12, num_spec_tokens=3, tree=TreeShape(2, 5, 6), stop_token_ids=())
    assert [t.data_ptr() for t in state_tensors(b)] == before and b.history is not None
