"""The race panel -> escaped HTML: the speculative run and the target-only run of one prompt, lane
above lane, each as far as it had got after the same engine time (demo/ui/replay.py says which step),
and at the finish the speedup, tokens per target call and, at T = 0, the identity check.

Engine time is each run's own prefill and steps (demo/metrics.py): the time spent drawing the page
between steps is in neither lane.
"""

from __future__ import annotations

from demo.service.chat import Comparison, RunTrace, Turn
from demo.ui.html.render import escape, render_reply
from demo.ui.replay import pieces_at, step_times

RACE_HINT = ("Tick “Compare with target-only” and generate: the race then replays the two runs of your prompt "
             "side by side, each at its measured pace (engine time).")


def render_runner(label: str, reply: Turn, trace: RunTrace, step: int, total_tokens: int, unshown: str = "") -> str:
    """One lane: its tokens so far (coloured by provenance), a bar of tokens out of the longer reply,
    target calls so far, and when it finished; `unshown`: once finished, the clause saying its last
    token counted is a stop token the text leaves out (Session.unshown_stop)."""
    shown = pieces_at(reply.pieces, step)
    calls = max(step, 0)  # decoding steps: the prefill aside, as every view counts them
    finished = step >= len(trace.points)
    end = f" · finished at {step_times(trace)[-1]:.2f} s" if finished else ""
    count = f"{len(shown)} tokens" + (f" ({unshown})" if finished and unshown else "")
    width = 100 * len(shown) / total_tokens if total_tokens else 0
    state = "sl-lane-done" if finished else "sl-lane-running"
    return (f'<div class="sl-lane {state}"><div class="sl-lane-head"><b>{escape(label)}</b>'
            f'<span class="sl-lane-count">{escape(count)} · {calls} target calls (+ the prefill){end}</span></div>'
            f'<div class="sl-lane-bar"><div style="width:{width:.1f}%"></div></div>'
            f'<div class="sl-lane-text">{render_reply(shown)}</div></div>')


def render_race_summary(label: str, spec: RunTrace, comparison: Comparison) -> str:
    """The finish: speedup in engine time, tokens per target call, and the T = 0 identity."""
    lines = [f'<div class="sl-race-speedup"><b>{comparison.speedup:.2f}×</b> {escape(label)} vs target only: '
             f"{comparison.speculative_tokens_per_s:.1f} vs {comparison.baseline_tokens_per_s:.1f} tokens/s of "
             "engine time</div>",
             f'<div class="sl-race-calls">{spec.stats.tokens_per_call:.2f} vs '
             f"{comparison.baseline_trace.stats.tokens_per_call:.2f} tokens per target call: "
             f"{escape(spec.stats.accounting())}"
             f"{escape('; ' + comparison.unshown[0]) if comparison.unshown[0] else ''}</div>"]
    if comparison.identical is None:
        lines.append('<div class="sl-identity">T &gt; 0: two samples, each from the target\'s distribution; they '
                     "differ by design.</div>")
    elif comparison.identical:
        wide = (f" run {comparison.reference_width} rows wide (the exact reference)"
                if comparison.reference_width > 1 else "")
        lines.append(f'<div class="sl-identity sl-ok">✓ T = 0: the same {spec.stats.num_generated} tokens as '
                     f"target-only decoding{wide}.</div>")
    else:
        lines.append(f'<div class="sl-identity sl-bad">✗ T = 0: differs from target-only decoding at token '
                     f"{comparison.first_difference}.</div>")
    return '<div class="sl-race-summary">' + "".join(lines) + "</div>"


def render_race(label: str, reply: Turn, spec: RunTrace, baseline_reply: Turn, baseline: RunTrace, t: float,
                steps: tuple[int, int], comparison: Comparison | None, slowdown: float = 1.0) -> str:
    """Both lanes after `t` engine seconds (steps: the last step each had finished; `label` names the
    speculative run's method; `slowdown`: wall seconds per engine second, said on the clock); the
    summary once both have finished and the comparison is known."""
    total = max(len(reply.pieces), len(baseline_reply.pieces))
    unshown = comparison.unshown if comparison else ("", "")
    lanes = (render_runner(label, reply, spec, steps[0], total, unshown[0]) +
             render_runner("target only", baseline_reply, baseline, steps[1], total, unshown[1]))
    finished = steps[0] >= len(spec.points) and steps[1] >= len(baseline.points)
    summary = render_race_summary(label, spec, comparison) if finished and comparison else ""
    factor = f"{slowdown:.1f}" if slowdown < 10 else f"{slowdown:.0f}"
    slowed = f" · shown {factor}× slower than it ran" if slowdown > 1.01 else ""
    return (f'<div class="sl-race"><div class="sl-race-clock">engine time {t:.2f} s{slowed}</div>{lanes}{summary}'
            "</div>")


def render_race_hint() -> str:
    return f'<div class="sl-race sl-empty">{escape(RACE_HINT)}</div>'
