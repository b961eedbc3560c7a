"""Acceptance metrics follow vLLM's definitions."""

import pytest

from demo.metrics import AcceptanceStats


def test_metrics_on_a_hand_built_trace():
    s = AcceptanceStats(reach=3)
    s.observe_prefill(5.0)
    for accepted in (3, 0, 1, 2):  # four steps of k=3
        s.observe_draft(3, accepted)
        s.observe_step(accepted + 1, draft_ms=1.0, verify_ms=2.0, num_accepted=accepted)
    s.elapsed_s = 0.5
    # 6 accepted over 4 drafts: 1 + 6/4
    assert s.mean_acceptance_length == pytest.approx(2.5)
    # steps with >= 1, >= 2, >= 3 accepted: 3, 2, 1 of 4
    assert s.acceptance_per_position == pytest.approx([0.75, 0.5, 0.25])
    assert s.mean_acceptance_length == pytest.approx(1 + sum(s.acceptance_per_position))
    assert s.draft_acceptance_rate == pytest.approx(6 / 12)
    assert s.num_generated == 1 + 10
    assert s.tokens_per_s == pytest.approx(11 / 0.5)
    assert (s.mean_draft_ms, s.mean_verify_ms, s.prefill_ms) == (1.0, 2.0, 5.0)
    assert s.num_target_tokens == 4 and s.tokens_per_call == pytest.approx((6 + 4) / 4)
    assert s.accounting() == "6 accepted drafts + 4 target tokens + 1 from the prefill = 11 tokens in 4 target " \
                             "calls (+ the prefill)"


def test_a_step_cut_before_its_own_token_counts_no_target_token_and_tokens_per_call_follows_the_text():
    s = AcceptanceStats(reach=3)
    s.observe_prefill(5.0)
    s.observe_draft(3, 3)
    s.observe_step(4, 1.0, 2.0, num_accepted=3)
    s.observe_draft(3, 2)  # the budget ends the reply after two accepted drafts: no own token
    s.observe_step(2, 1.0, 2.0, num_accepted=2)
    assert s.num_generated == 7 and s.num_target_tokens == 1
    assert s.tokens_per_call == pytest.approx((7 - 1) / 2)  # what the text shows per step
    with pytest.raises(AssertionError):
        s.observe_step(3, 1.0, 2.0, num_accepted=1)  # a step adds one own token at most


def test_the_acceptance_table_is_vllms_printout_numbered_by_draft_as_the_page():
    s = AcceptanceStats(reach=2)
    s.observe_draft(2, 2)
    s.observe_draft(2, 1)
    assert s.format_table() == "\n".join([
        "-" * 50, "mean acceptance length: 2.50", "-" * 50,
        "acceptance at draft 1: 1.00", "acceptance at draft 2: 0.50"])


def test_merge_adds_totals():
    a, b = AcceptanceStats(reach=2), AcceptanceStats(reach=2)
    a.observe_draft(2, 2)
    b.observe_draft(2, 0)
    a.merge(b)
    assert a.num_drafts == 2 and a.accepted_per_position == [1, 1] and a.mean_acceptance_length == 2.0


def test_no_drafts_means_acceptance_length_one():
    assert AcceptanceStats(reach=0).mean_acceptance_length == 1.0


def test_acceptance_at_token_0_splits_by_how_the_step_before_ended():
    s = AcceptanceStats(reach=3)
    for accepted in (3, 2, 0, 1, 3, 3, 0):  # full, reject, reject, reject, full, full, reject
        s.observe_draft(3, accepted)
    # after a full chain: steps 2, 6, 7 (accepted 2, 3, 0); after a rejection: steps 3, 4, 5 (0, 1, 3)
    assert (s.steps_after_full, s.first_accepted_after_full) == (3, 2)
    assert (s.steps_after_rejection, s.first_accepted_after_rejection) == (3, 2)
    assert s.summary()["acceptance_at_0_after_full"] == pytest.approx(2 / 3)
    other = AcceptanceStats(reach=3)
    other.observe_draft(3, 1)  # a generation's first step follows no step: in neither split
    other.observe_draft(3, 0)
    s.merge(other)
    assert (s.steps_after_rejection, s.first_accepted_after_rejection) == (4, 2)
    assert s.acceptance_at_0_after_rejection == pytest.approx(2 / 4) and s.steps_after_full == 3
    assert AcceptanceStats(reach=3).summary()["acceptance_at_0_after_full"] is None
