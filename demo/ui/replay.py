"""Slow motion, replay and the race: what to show at each step of a recorded run, and when.

A run's ``RunTrace`` (demo/service/chat.py) keeps every decoding step: the tokens it emitted, the drafts it
accepted and its engine time. Playing it back needs no engine and no Gradio: these pure functions
say which step to show next and how long to wait before showing it; views.py draws the frames.

- pace: how long each step stays on screen. ``None`` is real time: each step after its measured
  engine time (demo/metrics.py: prefill and steps, the display excluded); a number is that many
  seconds per step, so that a GPU run, a few milliseconds a step, is not a blur.
- replay: one run, from its prefill (step 0) to its last step, every frame a step.
- race: the speculative run and the target-only run of the same prompt on one clock of engine
  time, each lane moving at its own measured pace; slowed down so that a target-only step (one
  target forward) lasts the pace when one is chosen, and in real time so that the race lasts at
  least RACE_MIN_S (a GPU run of 256 tokens is over in a quarter of a second).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, TypeVar

from demo.metrics import AcceptanceStats
from demo.service.chat import ChatState, RunTrace, TokenPiece

REAL_TIME = "real time"
PACES = {REAL_TIME: None, "1 step / s": 1.0, "4 steps / s": 0.25}  # label -> seconds a step stays on screen
RACE_MIN_S = 4.0  # a real-time race of shorter runs is slowed, all of it alike, to last this long


def step_times(trace: RunTrace) -> list[float]:
    """Engine seconds at the end of the prefill (index 0) and of each step 1..n. The prefill's end
    is its own measured time (a StepPoint exists from step 1 on)."""
    times = [trace.stats.prefill_ms / 1e3] + [p.elapsed_s for p in trace.points]
    for i in range(1, len(times)):  # never backwards (the prefill's time is measured inside its wall time)
        times[i] = max(times[i], times[i - 1])
    return times


def step_at(trace: RunTrace, t: float) -> int:
    """The last step the run had finished after `t` engine seconds (-1: its prefill was still running)."""
    return bisect_right(step_times(trace), t) - 1


def tokens_at(trace: RunTrace, step: int) -> int:
    """Tokens the run had emitted after `step` (the prefill emits one; step -1: none yet)."""
    return 0 if step < 0 else 1 + sum(p.num_emitted for p in trace.points[:step])


def stats_at(trace: RunTrace, step: int) -> AcceptanceStats:
    """The run's totals as they were after `step` (-1: before its prefill ended, nothing), counted
    again from its points; after its last step they equal trace.stats."""
    stats = AcceptanceStats(trace.stats.reach)  # the most a step accepts (a lookup branch reaches past k)
    if step < 0:
        return stats
    stats.observe_prefill(trace.stats.prefill_ms)
    for p in trace.points[:step]:
        if p.reach:
            stats.observe_draft(p.reach, p.num_accepted)
        stats.observe_step(p.num_emitted, p.draft_ms, p.verify_ms, p.num_accepted)
    stats.elapsed_s = trace.stats.elapsed_s if step >= len(trace.points) else step_times(trace)[step]
    return stats


def trace_at(trace: RunTrace, step: int) -> RunTrace:
    """The trace as it was after `step`: its points, steps (the prefill is step 0), so its trees,
    and totals so far."""
    done = step >= len(trace.points)
    shown = max(step, 0)
    return replace(trace, stats=stats_at(trace, step), points=trace.points[:shown], steps=trace.steps[:max(step + 1, 0)],
                   finish_reason=trace.finish_reason if done else None)


def pieces_at(pieces: list[TokenPiece], step: int) -> list[TokenPiece]:
    """The reply's tokens emitted up to `step`."""
    return [p for p in pieces if p.step <= step]


def chat_at(chat: ChatState, step: int) -> ChatState:
    """The conversation as it was after `step` of its latest reply (-1: before its first token):
    the turns before it as they are, the reply's tokens and the trace up to that step."""
    reply = chat.turns[-1]
    pieces = pieces_at(reply.pieces, step)
    shown = replace(reply, pieces=pieces, text="".join(p.text for p in pieces),
                    state=reply.state if step >= len(chat.trace.points) else "streaming")
    return replace(chat, turns=[*chat.turns[:-1], shown], trace=trace_at(chat.trace, step), comparison=None)


@dataclass(frozen=True)
class Frame:
    """Show the run as it was after `step`, `delay_s` seconds after the frame before."""

    step: int
    delay_s: float


@dataclass(frozen=True)
class RaceFrame:
    """Both lanes at engine time `t` (seconds since both runs began): the last step each had
    finished (-1: its prefill still running), shown `delay_s` wall seconds after the frame before."""

    t: float
    steps: tuple[int, int]
    delay_s: float


F = TypeVar("F", Frame, RaceFrame)


def coalesce(frames: list[F], min_interval: float) -> list[F]:
    """Drop frames that would follow the one before sooner than `min_interval` seconds (a screen
    cannot show 200 steps a second), carrying their wait to the next kept frame: the total time is
    kept, and so is the last frame."""
    out, carry = [], 0.0
    for i, frame in enumerate(frames):
        carry += frame.delay_s
        if carry >= min_interval or i == len(frames) - 1:
            out.append(replace(frame, delay_s=carry))
            carry = 0.0
    return out


def replay_frames(trace: RunTrace, pace: float | None, min_interval: float = 0.0) -> list[Frame]:
    """One frame per step, the prefill first: at the measured pace (None) or `pace` seconds each."""
    times = step_times(trace)
    if pace is None:
        delays = [times[0]] + [b - a for a, b in zip(times, times[1:])]
    else:
        delays = [pace] * len(times)
    return coalesce([Frame(step, delay) for step, delay in enumerate(delays)], min_interval)


def race_scale(pace: float | None, speculative: RunTrace, baseline: RunTrace) -> float:
    """Wall seconds per engine second, one factor for both lanes so that their ratio holds: with a
    pace, so that the baseline's mean step (one target forward, the prefill counted as one) lasts
    `pace`; in real time 1, or more where the race would be over in under RACE_MIN_S."""
    if pace is None:
        end = max(step_times(speculative)[-1], step_times(baseline)[-1])
        return max(1.0, RACE_MIN_S / end) if end > 0 else 1.0
    if baseline.stats.elapsed_s <= 0:
        return 1.0
    return pace / (baseline.stats.elapsed_s / (baseline.stats.num_steps + 1))


def race_frames(speculative: RunTrace, baseline: RunTrace, scale: float = 1.0,
                min_interval: float = 0.0) -> list[RaceFrame]:
    """A frame whenever either lane finishes a step, both on one clock of engine time; a lane that
    has finished keeps its last step."""
    times = [step_times(speculative), step_times(baseline)]
    frames, before = [], 0.0
    for t in sorted({t for lane in times for t in lane}):
        steps = tuple(bisect_right(lane, t) - 1 for lane in times)
        frames.append(RaceFrame(t, steps, (t - before) * scale))
        before = t
    return coalesce(frames, min_interval)


def play(frames: Iterable[F], sleep: Callable[[float], None] = time.sleep,
         clock: Callable[[], float] = time.monotonic) -> Iterator[F]:
    """Each frame at its time: the delays add up from the start, so the time the caller spends
    drawing a frame comes out of the next wait instead of slowing the pace."""
    due = clock()
    for frame in frames:
        due += frame.delay_s
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        yield frame
