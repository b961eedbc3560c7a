"""The headline (demo/ui/html/headline.py): tokens per target call with its accounting, the speedup
only as the comparison measured it (with its range), and why, from the run's own numbers."""

from html.parser import HTMLParser

import pytest

from demo.metrics import AcceptanceStats
from demo.service.chat import Comparison, RunTrace, StepRecord
from demo.ui.html.headline import render_headline, why


def text_of(html: str) -> str:
    out = []
    parser = HTMLParser()
    parser.handle_data = out.append
    parser.feed(html)
    return " ".join(out)


def run(method="eagle3", steps=10, accepted=15, draft_ms=2.0, verify_ms=8.0, seconds=1.3) -> RunTrace:
    """A run of `steps` steps of k = 3 with `accepted` drafts accepted in all, each step ending with
    the target's own token: 1 + accepted + steps tokens."""
    drafting = method != "none"
    stats = AcceptanceStats(3 if drafting else 0, num_drafts=steps if drafting else 0,
                            num_draft_tokens=3 * steps if drafting else 0,
                            num_accepted_tokens=accepted if drafting else 0, num_steps=steps,
                            num_generated=1 + (accepted if drafting else 0) + steps, num_target_tokens=steps,
                            draft_ms_total=draft_ms * steps, verify_ms_total=verify_ms * steps, elapsed_s=seconds)
    last = StepRecord(steps, 1, [4, 5, 6] if drafting else [], 0, [7], [0.5], False, draft_ms, verify_ms,
                      seconds, None, [], None)
    return RunTrace(method, "eager", 3, stats, steps=[last])


def comparison(speedups=(2.4, 2.5, 2.7), base_tokens=11, base_seconds=1.1) -> Comparison:
    base = run(method="none", steps=base_tokens - 1, seconds=base_seconds)
    return Comparison(25.0, 10.0, True, True, None, "", baseline_trace=base, speedups=list(speedups),
                      speculative_trace=run())


def test_tokens_per_call_counts_accepted_drafts_and_the_targets_own_tokens_per_decoding_step():
    text = text_of(render_headline(run(accepted=15, steps=10)))
    assert "2.50 tokens per target call" in text
    assert "15 accepted drafts + 10 target tokens + 1 from the prefill = 26 tokens in 10 target calls" in text


def test_without_a_comparison_the_headline_claims_no_speedup_and_says_how_to_measure_it():
    text = text_of(render_headline(run()))
    assert "×" not in text.split("Why")[0]  # no speedup figure above the explanation
    assert "Compare with target-only" in text
    assert "upper bound" in text  # the explanation prices a target-only token at a verification, and says so


def test_a_comparison_gives_the_median_speedup_with_its_range():
    text = text_of(render_headline(run(), comparison()))
    assert "2.50×" in text and "speedup, measured" in text and "2.40–2.70 over 3 timings" in text
    assert "25.0 vs 10.0 tokens/s" in text and "nothing drawn" in text


def test_a_reply_timed_once_says_so_and_what_three_timings_would_have_cost():
    cmp = comparison(speedups=(0.91,))
    cmp.round_s = 30.0
    text = text_of(render_headline(run(), cmp))
    assert "0.91×" in text and "one timing: 3 would take about 90 s" in text and "rough" in text
    assert "over 1 timings" not in text and "median" not in text


def test_why_multiplies_tokens_per_call_by_target_only_time_per_token_over_the_step_time():
    cmp = comparison()
    cmp.baseline_trace.stats.verify_ms_total = 6.0 * cmp.baseline_trace.stats.num_steps  # 6 ms a target-only step
    cmp.baseline_trace.stats.draft_ms_total = 0.0
    reason = why(run(accepted=15, draft_ms=2.0, verify_ms=8.0), cmp)
    assert reason.measured_t1 and reason.t1_ms == pytest.approx(6.0)
    assert reason.predicted == pytest.approx(2.5 * 6.0 / (2.0 + 8.0))
    assert "2.50 × 6.00 / (2.00 + 8.00) = 1.50×" in reason.sentence() and "4 tokens" in reason.sentence()
    estimate = why(run(accepted=15, draft_ms=2.0, verify_ms=8.0))
    assert not estimate.measured_t1 and estimate.predicted == pytest.approx(2.5 * 8.0 / 10.0)


def test_before_a_step_and_for_target_only_the_headline_has_no_speedup():
    assert "–" in text_of(render_headline(None)) and "×" not in text_of(render_headline(None))
    target_only = text_of(render_headline(run(method="none", steps=19, seconds=1.0)))
    assert "1 token per target call" in target_only and "20.0" in target_only and "×" not in target_only
