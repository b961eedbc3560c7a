"""The headline (demo/ui/html/headline.py): tokens per target call and the speedup, measured when a target-only
speed is known, else estimated and labelled so, with why the speedup is smaller."""

from html.parser import HTMLParser

import pytest

from demo.metrics import AcceptanceStats
from demo.service.chat import Comparison, RunTrace, StepRecord
from demo.ui.html.headline import baseline_key, record_baseline, render_headline, speedup


def text_of(html: str) -> str:
    out = []
    parser = HTMLParser()
    parser.handle_data = out.append
    parser.feed(html)
    return " ".join(out)


def run(method="eagle3", steps=10, accepted=15, draft_ms=2.0, verify_ms=8.0, tokens=26, seconds=1.3) -> RunTrace:
    """A run of `steps` steps of k = 3 with `accepted` drafts accepted in all."""
    stats = AcceptanceStats(3 if method != "none" else 0, num_drafts=steps if method != "none" else 0,
                            num_draft_tokens=3 * steps, num_accepted_tokens=accepted, num_steps=steps,
                            num_generated=tokens, draft_ms_total=draft_ms * steps, verify_ms_total=verify_ms * steps,
                            elapsed_s=seconds)
    last = StepRecord(steps, 1, [4, 5, 6] if method != "none" else [], 0, [7], [0.5], False, draft_ms, verify_ms,
                      seconds, None, [], None)
    return RunTrace(method, "eager", 3, stats, steps=[last])


def test_speedup_is_measured_against_a_known_target_only_speed():
    up = speedup(run(tokens=26, seconds=1.3), baseline_tps=10.0)  # 20 tokens/s against 10
    assert up.measured and up.value == pytest.approx(2.0) and "20.0 vs 10.0 tokens/s" in up.basis


def test_without_a_baseline_the_speedup_is_an_estimate_below_the_tokens_per_call():
    trace = run(accepted=15, draft_ms=2.0, verify_ms=8.0)  # 2.5 tokens per call, 80 % of a step verifying
    up = speedup(trace, baseline_tps=None)
    assert not up.measured and up.value == pytest.approx(2.5 * 8 / 10) and "estimate" in up.basis
    assert up.value < trace.stats.mean_acceptance_length


def test_a_comparison_run_gives_the_measured_speedup():
    cmp = Comparison(30.0, 12.0, True, True, None, "")
    up = speedup(run(), baseline_tps=99.0, comparison=cmp)
    assert up.measured and up.value == pytest.approx(2.5) and "30.0 vs 12.0" in up.basis


def test_target_only_and_comparison_runs_record_the_baseline_of_their_models_and_mode():
    key = baseline_key("SmolLM2", "eager")
    assert key != baseline_key("SmolLM2", "cudagraph")
    assert record_baseline({}, key, run(method="none", tokens=20, seconds=1.0), None) == {key: 20.0}
    assert record_baseline({key: 20.0}, key, run(), Comparison(30.0, 12.0, True, True, None, "")) == {key: 12.0}
    assert record_baseline({key: 20.0}, key, run(), None) == {key: 20.0}  # a speculative run alone measures none


def test_headline_shows_tokens_per_call_the_speedup_and_why_it_is_smaller():
    text = text_of(render_headline(run(accepted=15), baseline_tps=None))
    assert "2.50" in text and "tokens per target call" in text
    assert "≤ 2.00×" in text and "speedup (estimate)" in text
    assert "Why is the speedup smaller" in text and "drafter" in text and "over 4 tokens" in text
    measured = text_of(render_headline(run(), baseline_tps=10.0))
    assert "2.00×" in measured and "estimate" not in measured and "ms per token target-only" in measured


def test_before_a_step_and_for_target_only_the_headline_has_no_speedup():
    assert "–" in text_of(render_headline(None)) and "×" not in text_of(render_headline(None))
    target_only = text_of(render_headline(run(method="none", tokens=20, seconds=1.0)))
    assert "1 token per target call" in target_only and "20.0" in target_only and "×" not in target_only
