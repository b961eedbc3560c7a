"""Verification rules: greedy prefix matching, and rejection sampling that preserves the target's
distribution exactly."""

import pytest
import torch

from demo.config import GenerationConfig, SamplingParams
from demo.engine import Engine
from demo.sampling import ShownProbs, target_probs, verify_greedy, verify_sampled
from demo.target import Target
from tests.tiny import six_token_target, tiny_drafter, tiny_hf


def test_greedy_accepts_the_longest_matching_prefix_then_the_targets_token():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 7, 1, 9]):  # target argmax per position
        logits[row, best] = 5.0
    n, tokens = verify_greedy(torch.tensor([3, 7, 2]), logits)
    # drafts 3, 7 match; 2 != 1 is rejected; the target's own token 1 follows
    assert n.item() == 2 and tokens[:3].tolist() == [3, 7, 1]
    n, tokens = verify_greedy(torch.tensor([3, 7, 1]), logits)
    assert n.item() == 3 and tokens.tolist() == [3, 7, 1, 9]  # all accepted: 9 is the bonus token
    n, tokens = verify_greedy(torch.tensor([4, 7, 1]), logits)
    assert n.item() == 0 and tokens[0].item() == 3  # a later match does not count after a rejection


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - p).abs().sum().item()


def test_rejection_sampling_emits_the_target_distribution_at_every_position():
    p = torch.tensor([[0.10, 0.40, 0.20, 0.30, 0.00, 0.00],
                      [0.25, 0.05, 0.30, 0.10, 0.30, 0.00],
                      [0.00, 0.20, 0.20, 0.20, 0.20, 0.20]])
    drafts = torch.tensor([1, 4])  # plausible first draft, plausible second draft
    g = torch.Generator().manual_seed(0)
    first = torch.zeros(6)
    second_after_accept = torch.zeros(6)
    trials = 20000
    for _ in range(trials):
        n, tokens = verify_sampled(drafts, p, g)
        first[tokens[0]] += 1
        if n >= 1:  # token 0 was draft 1; the next emitted token must follow p[1]
            second_after_accept[tokens[1]] += 1
    # with 20000 draws the TV distance of a correct sampler is ~0.01; the rule "resample from p
    # without removing the rejected draft" gives 0.14, "always accept" 0.6
    assert _tv(first, p[0]) < 0.02
    assert _tv(second_after_accept, p[1]) < 0.03


def test_rejection_sampling_never_accepts_a_draft_the_target_gives_zero_probability():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        n, tokens = verify_sampled(torch.tensor([2]), p, g)
        assert n.item() == 0 and tokens[0].item() in (0, 1)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    pp = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.85))
    # 0.5 + 0.3 < 0.85, so the third token is needed; the fourth is cut
    assert torch.allclose(pp, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)


def _joint_of_first_two_tokens(engine, prompt, runs):
    counts = torch.zeros(36)
    accepted = 0
    for seed in range(runs):
        cfg = GenerationConfig(max_new_tokens=2, num_spec_tokens=2, temperature=1.0, seed=seed, stop_token_ids=(),
                               draft_sampling="pointmass")  # the chain rule the test breaks: sampled_rule
        events = list(engine.generate(prompt, cfg))
        t1, t2 = [t for e in events for t in e.token_ids][:2]
        counts[t1 * 6 + t2] += 1
        accepted += events[1].num_accepted
    return counts, accepted


def _resample_without_removing_the_draft(drafts, probs, u, noise):
    """A wrong rule: after a rejection, sample from p itself (the rejected draft can come back)."""
    k = drafts.shape[0]
    n = (u < probs[torch.arange(k), drafts]).long().cumprod(0).sum()
    token = (probs[n] / noise).argmax()
    return n, torch.cat((drafts, drafts.new_zeros(1))).scatter(0, n.view(1), token.view(1))


def test_sampled_speculative_decoding_matches_the_targets_joint_distribution(monkeypatch):
    hf, target, prompt, joint = six_token_target()  # joint: the exact P(t1, t2) of the first two tokens
    engine = Engine(target, tiny_drafter("eagle", target, seed=5), max_context=16)
    counts, accepted = _joint_of_first_two_tokens(engine, prompt, 3000)
    assert accepted > 300  # the second token went through accepted drafts as well as rejections
    # 3000 draws over 36 cells: a correct sampler sits near 0.04
    assert _tv(counts, joint) < 0.065
    # the tolerance is tight enough to catch a wrong acceptance rule (it lands near 0.14)
    monkeypatch.setattr("demo.accept.sampled_rule", _resample_without_removing_the_draft)
    wrong, _ = _joint_of_first_two_tokens(engine, prompt, 3000)
    assert _tv(wrong, joint) > 0.09


@pytest.mark.parametrize("mode_seed", [0, 7])
def test_same_seed_same_sample(mode_seed):
    target = Target(tiny_hf("llama"))
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=64)
    cfg = GenerationConfig(max_new_tokens=12, num_spec_tokens=3, temperature=0.8, top_p=0.9, seed=mode_seed)
    a = [t for e in engine.generate([1, 2, 3], cfg) for t in e.token_ids]
    b = [t for e in engine.generate([1, 2, 3], cfg) for t in e.token_ids]
    assert a == b


def test_shown_probabilities_are_the_softmax_without_writing_it():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(0)) * 3
    rows, cols = torch.tensor([0, 2, 5, 5]), torch.tensor([7, 299, 0, 150])
    for params in (SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9)):
        probs = target_probs(logits, params)
        shown = ShownProbs(logits, params)
        assert (shown.probs is None) == params.greedy  # at T = 0 no [N, V] table is made
        torch.testing.assert_close(shown.at(rows, cols), probs[rows, cols])
        values, ids = shown.top(rows, 5)
        expected = probs[rows].topk(5, dim=-1)
        torch.testing.assert_close(values, expected.values)
        assert torch.equal(ids, expected.indices)
