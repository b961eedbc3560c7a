"""Slow motion, replay and the race (demo/ui/replay.py): pure functions over recorded traces, no
Gradio, no sleeping (a fake clock)."""

from __future__ import annotations

import copy

import pytest

from demo.metrics import AcceptanceStats
from demo.service.chat import RunTrace, StepPoint
from demo.service.request import Request
from demo.ui.replay import (
    PACES,
    RACE_MIN_S,
    REAL_TIME,
    Frame,
    chat_at,
    coalesce,
    pieces_at,
    play,
    race_frames,
    race_scale,
    replay_frames,
    stats_at,
    step_at,
    step_times,
    tokens_at,
    trace_at,
)
from tests.tiny_chat import tiny_session


def hand_trace(elapsed: list[float], emitted: list[int], accepted: list[int], k: int = 3,
               prefill_ms: float = 100.0) -> RunTrace:
    """A trace as the session records it: step i emits emitted[i] tokens, accepted[i] of them drafts."""
    stats = AcceptanceStats(k)
    stats.observe_prefill(prefill_ms)
    points = []
    for step, (t, n, a) in enumerate(zip(elapsed, emitted, accepted), 1):
        if k:
            stats.observe_draft(k, a)
        stats.observe_step(n, 5.0, 20.0, a)
        stats.elapsed_s = t
        points.append(StepPoint(step, k, a, n, 5.0, 20.0, t, stats.tokens_per_s))
    return RunTrace("eagle3" if k else "none", "eager", k, stats, points, finish_reason="length")


@pytest.fixture(scope="module")
def recorded():
    """A real run of the tiny session with its comparison: (chat, speculative trace, baseline trace)."""
    session = tiny_session(predictable=True)
    final = list(session.generate(Request.of("hi", method="eagle", num_spec_tokens=3, max_new_tokens=20,
                                             compare=True)))[-1]
    return final.chat, final.chat.trace, final.chat.comparison.baseline_trace


def test_the_totals_counted_again_up_to_the_last_step_are_the_runs_totals(recorded):
    chat, trace, baseline = recorded
    for run in (trace, baseline):
        assert stats_at(run, len(run.points)) == run.stats
    assert stats_at(trace, 1).num_steps == 1 and stats_at(trace, 0).num_generated == 1  # the prefill's token


def test_tokens_counted_at_each_step_are_the_tokens_the_reply_had_then(recorded):
    chat, trace, _ = recorded
    pieces = chat.turns[-1].pieces
    for step in range(len(trace.points) + 1):
        assert tokens_at(trace, step) == len(pieces_at(pieces, step)) == stats_at(trace, step).num_generated
    assert tokens_at(trace, len(trace.points)) == len(pieces)


def test_a_trace_at_a_step_has_that_steps_points_and_trees_only(recorded):
    _, trace, _ = recorded
    before = copy.deepcopy(trace)
    mid = trace_at(trace, 2)
    assert [p.step for p in mid.points] == [1, 2] and len(mid.trees) == len(mid.roots) == 2
    assert [s.step for s in mid.steps] == [0, 1, 2] and trace_at(trace, -1).steps == []  # the prefill is step 0
    assert mid.finish_reason is None and trace_at(trace, len(trace.points)).finish_reason == trace.finish_reason
    assert trace == before  # the recorded trace is left as it was


def test_real_time_replay_waits_each_steps_engine_time_and_takes_the_runs_total():
    trace = hand_trace([0.3, 0.5, 0.9], [4, 4, 2], [3, 3, 1])
    frames = replay_frames(trace, PACES[REAL_TIME])
    assert [f.step for f in frames] == [0, 1, 2, 3]
    assert [round(f.delay_s, 6) for f in frames] == [0.1, 0.2, 0.2, 0.4]  # prefill 100 ms, then each step
    assert sum(f.delay_s for f in frames) == pytest.approx(trace.stats.elapsed_s)


def test_a_chosen_pace_shows_every_step_for_that_long():
    trace = hand_trace([0.3, 0.5, 0.9], [4, 4, 2], [3, 3, 1])
    assert [f.delay_s for f in replay_frames(trace, 1.0)] == [1.0] * 4
    assert [f.delay_s for f in replay_frames(trace, 0.25)] == [0.25] * 4


def test_frames_closer_than_the_screen_can_show_are_merged_keeping_the_time_and_the_last_step():
    frames = [Frame(i, 0.004) for i in range(100)]  # a GPU run: 4 ms a step
    kept = coalesce(frames, 1 / 30)
    assert kept[-1].step == 99 and len(kept) < 15
    assert all(f.delay_s >= 1 / 30 for f in kept[:-1])
    assert sum(f.delay_s for f in kept) == pytest.approx(0.4)


def test_the_race_puts_both_runs_on_one_clock_of_engine_time():
    spec = hand_trace([0.2, 0.3], [4, 4], [3, 3])  # prefill 0.1 s, then two steps
    base = hand_trace([0.15, 0.2, 0.25, 0.3, 0.35], [1] * 5, [0] * 5, k=0, prefill_ms=100.0)
    frames = race_frames(spec, base)
    assert [round(f.t, 6) for f in frames] == [0.1, 0.15, 0.2, 0.25, 0.3, 0.35]
    assert [f.steps for f in frames] == [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4), (2, 5)]  # spec done at 0.3 s
    assert sum(f.delay_s for f in frames) == pytest.approx(0.35)  # real time: the slower run's engine time


def test_a_slowed_race_lasts_the_pace_per_target_only_step_and_keeps_the_ratio():
    spec = hand_trace([0.2, 0.3], [4, 4], [3, 3])
    base = hand_trace([0.15, 0.2, 0.25, 0.3, 0.35], [1] * 5, [0] * 5, k=0)
    scale = race_scale(1.0, spec, base)  # 6 target forwards (prefill included) in 0.35 s
    assert scale == pytest.approx(6 / 0.35)
    frames = race_frames(spec, base, scale)
    assert sum(f.delay_s for f in frames) == pytest.approx(6.0)


def test_a_real_time_race_of_short_runs_is_slowed_to_last_long_enough_to_watch():
    spec = hand_trace([0.2, 0.3], [4, 4], [3, 3])
    base = hand_trace([0.15, 0.2, 0.25, 0.3, 0.35], [1] * 5, [0] * 5, k=0)
    scale = race_scale(PACES[REAL_TIME], spec, base)  # both runs over in 0.35 s of engine time
    frames = race_frames(spec, base, scale)
    assert sum(f.delay_s for f in frames) == pytest.approx(RACE_MIN_S)
    assert [f.steps for f in frames] == [f.steps for f in race_frames(spec, base)]  # the same race, slower
    slow = hand_trace([t * 100 for t in (0.15, 0.2, 0.25, 0.3, 0.35)], [1] * 5, [0] * 5, k=0)
    assert race_scale(PACES[REAL_TIME], spec, slow) == 1.0  # a race of 35 s runs as it ran


def test_tokens_per_target_call_leaves_the_prefill_aside_as_every_view_does():
    spec = hand_trace([0.2, 0.3], [4, 4], [3, 3])
    base = hand_trace([0.15, 0.2], [1, 1], [0, 0], k=0)
    assert spec.stats.tokens_per_call == 8 / 2 and base.stats.tokens_per_call == 1.0
    assert spec.stats.accounting() == "6 accepted drafts + 2 target tokens + 1 from the prefill = 9 tokens in " \
                                      "2 target calls (+ the prefill)"


def test_play_keeps_the_pace_when_drawing_a_frame_takes_time():
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(round(s, 6))
        now[0] += s

    frames = [Frame(i, 1.0) for i in range(3)]
    for frame in play(frames, sleep=sleep, clock=lambda: now[0]):
        now[0] += 0.3  # drawing the frame
    assert slept == [1.0, 0.7, 0.7] and now[0] == pytest.approx(3.3)


def test_step_times_never_go_backwards():
    trace = hand_trace([0.05, 0.2], [2, 2], [1, 1], prefill_ms=80.0)  # a prefill timed a little over step 1's end
    times = step_times(trace)
    assert times == sorted(times) and times[0] == 0.08


def test_before_the_prefill_ends_nothing_is_shown_and_after_the_last_step_everything(recorded):
    chat, trace, _ = recorded
    empty = chat_at(chat, -1)
    assert empty.turns[-1].pieces == [] and empty.turns[-1].state == "streaming"
    assert empty.trace.stats.num_generated == 0 and empty.trace.points == [] and empty.turns[:-1] == chat.turns[:-1]
    assert chat_at(chat, len(trace.points)).turns[-1] == chat.turns[-1]


def test_the_step_at_a_time_is_the_last_one_finished_by_then():
    trace = hand_trace([0.3, 0.5], [4, 4], [3, 3])  # the prefill ends at 0.1 s
    assert [step_at(trace, t) for t in (0.05, 0.1, 0.29, 0.3, 9.0)] == [-1, 0, 0, 1, 2]
