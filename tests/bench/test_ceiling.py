"""The ceiling (demo/bench/ceiling.py): the target drafting for itself proposes the target's own
distribution, so every greedy draft is accepted and every sampled first draft too; the bench's
--ceiling flag drafts with it."""

import pytest

from demo.bench.tools import cli as bench
from demo.bench.ceiling import TargetDrafter
from demo.bench.config import BenchConfig, BenchConfigError
from demo.config import TreeShape
from demo.engine import Engine
from demo.target import Target
from tests.tiny import hf_greedy, run, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]


@pytest.mark.parametrize("tree", [None, TreeShape(2, 0)], ids=["chain", "tree"])
def test_the_target_drafting_for_itself_has_every_greedy_chain_draft_accepted(tree):
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 41)
    target = Target(hf)
    engine = Engine(target, TargetDrafter(target), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=41, num_spec_tokens=4, tree=tree, stop_token_ids=())
    assert tokens == ref  # 1 from the prefill, then 8 steps of 4 drafts and the target's token
    if tree is None:  # a tree keeps the target's path only where its cumulative score ranks in the frontier
        assert [e.num_accepted for e in events[1:]] == [4] * 8
    else:
        assert sum(e.num_accepted == 4 for e in events[1:]) >= 6


@pytest.mark.parametrize("draft_sampling", ["q", "wor"])
def test_the_target_drafting_for_itself_has_every_sampled_first_draft_accepted(draft_sampling):
    # q = p: each draft is accepted with min(1, p / q) = 1, at every depth of a chain or a tree
    target = Target(tiny_hf("llama", initializer_range=0.05))  # flat: the target's top choice is often not drawn
    engine = Engine(target, TargetDrafter(target), max_context=128)
    for tree in (None, TreeShape(3, 0)):
        _, events = run(engine, PROMPT, max_new_tokens=41, num_spec_tokens=4, tree=tree, temperature=1.0,
                        draft_sampling=draft_sampling, seed=3, stop_token_ids=())
        assert [e.num_accepted for e in events[1:]] == [4] * 8
    # pointmass proposes the target's top choice, accepted with p(x) < 1: below its ceiling of k + 1
    _, events = run(engine, PROMPT, max_new_tokens=41, num_spec_tokens=4, temperature=1.0, seed=3,
                    draft_sampling="pointmass", stop_token_ids=())
    assert events[-1].stats.mean_acceptance_length < 4


def test_ceiling_needs_a_drafting_method_and_no_drafter():
    assert BenchConfig(method="eagle3", ceiling=True).check().drafter_spec() is None
    for bad in (dict(method="none"), dict(method="eagle3", drafter="some/dir")):
        with pytest.raises(BenchConfigError, match="--ceiling"):
            BenchConfig(ceiling=True, **bad).check()
    assert bench.parse_args(["--ceiling", "--temperature", "1", "--draft-sampling", "wor"]).ceiling
