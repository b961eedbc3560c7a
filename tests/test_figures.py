"""The chart builders (demo/figures.py) are pure functions of plain numbers: assert on figure data."""

import copy

import pytest

from demo.chat import StepPoint
from demo.figures import (acceptance_figure, acceptance_length_figure, latency_figure,
                          throughput_figure)
from demo.metrics import AcceptanceStats
from demo.render import depth_color


def points() -> list[StepPoint]:
    # k = 3; accepted 3, 1, 0, 2 drafts; each step emits accepted + 1 tokens
    accepted = [3, 1, 0, 2]
    out, tokens, t = [], 1, 0.010  # prefill: 1 token in 10 ms
    for i, n in enumerate(accepted, 1):
        tokens += n + 1
        t += 0.004 + 0.006
        out.append(StepPoint(step=i, num_drafts=3, num_accepted=n, num_emitted=n + 1, draft_ms=4.0, verify_ms=6.0,
                             elapsed_s=t, tokens_per_s=tokens / t))
    return out


def stats() -> AcceptanceStats:
    s = AcceptanceStats(num_spec_tokens=3)
    for n in (3, 1, 0, 2):
        s.observe_draft(3, n)
    return s


def test_acceptance_bars_are_the_share_of_steps_with_at_least_i_plus_1_accepted():
    fig = acceptance_figure(stats())
    (bar,) = fig.data
    assert list(bar.x) == ["1", "2", "3"]
    assert list(bar.y) == pytest.approx([3 / 4, 2 / 4, 1 / 4])  # >=1: 3 of 4 steps, >=2: 2, >=3: 1
    assert list(bar.marker.color) == [depth_color(1), depth_color(2), depth_color(3)]  # the legend's colours
    assert tuple(fig.layout.yaxis.range) == (0, 1)


def test_acceptance_length_per_step_and_its_running_mean():
    fig = acceptance_length_figure(points())
    bars, line = fig.data
    assert list(bars.x) == [1, 2, 3, 4] and list(bars.y) == [4, 2, 1, 3]  # accepted + the target's own token
    assert list(line.y) == pytest.approx([4, 3, 7 / 3, 2.5])
    assert line.y[-1] == pytest.approx(stats().mean_acceptance_length)  # the same definition as metrics.py


def test_target_only_steps_are_not_acceptance_lengths():
    p = [StepPoint(1, 0, 0, 1, 0.0, 5.0, 0.01, 100.0)]
    fig = acceptance_length_figure(p)
    bars, line = fig.data
    assert list(bars.y) == [] and list(line.y) == []
    assert [a.text for a in fig.layout.annotations] == ["target only: no drafts"]
    assert [a.text for a in acceptance_figure(AcceptanceStats(0)).layout.annotations] == ["target only: no drafts"]


def test_latency_bars_stack_draft_and_verify_ms():
    fig = latency_figure(points())
    draft, verify = fig.data
    assert (draft.name, verify.name) == ("draft", "verify")
    assert list(draft.y) == [4.0] * 4 and list(verify.y) == [6.0] * 4
    assert fig.layout.barmode == "stack"


def test_throughput_has_running_rate_and_per_step_rate():
    p = points()
    per_step, running = throughput_figure(p).data
    assert list(running.x) == [q.elapsed_s for q in p]
    assert list(running.y) == [q.tokens_per_s for q in p]
    assert list(per_step.y) == pytest.approx([4 / 0.01, 2 / 0.01, 1 / 0.01, 3 / 0.01])


@pytest.mark.parametrize("build", [acceptance_length_figure, latency_figure, throughput_figure])
def test_empty_charts_say_so(build):
    fig = build([])
    assert [a.text for a in fig.layout.annotations] == ["no steps yet"]


def test_figures_are_pure_functions():
    p, s = points(), stats()
    before = (copy.deepcopy(p), copy.deepcopy(s))
    for build, arg in ((acceptance_figure, s), (acceptance_length_figure, p), (latency_figure, p),
                       (throughput_figure, p)):
        assert build(arg).to_json() == build(arg).to_json()
    assert (p, s) == before  # inputs untouched
