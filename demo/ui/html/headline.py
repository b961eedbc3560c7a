"""The run in large type while it generates: tokens per target call and, once "Compare with
target-only" has timed it, the speedup with its range; with one line, from this run's own numbers,
on why the speedup is what it is:

    speedup = tokens per call × t1 / (t_draft + t_verify)

where t1 is a target-only step's time (one token) and t_draft, t_verify a speculative step's: the
speedup of the decoding steps, the prefill (the same in both runs) left out. Without a
comparison t1 is unknown: the line prices a target-only token at one verification (an upper bound,
since verifying k + 1 tokens costs at least what decoding 1 does) and says so, in small type; the
headline never divides by another run's speed.

Pure functions of plain data (AcceptanceStats, RunTrace, Comparison); no Gradio here.
"""

from __future__ import annotations

from dataclasses import dataclass

from demo.service.chat import COMPARE_ROUNDS, Comparison, RunTrace
from demo.ui.html.render import escape


@dataclass(frozen=True)
class Why:
    """The speedup explained from a run's numbers: L × t1 / (t_draft + t_verify)."""

    tokens_per_call: float  # L
    t1_ms: float  # a target-only step's ms (the comparison's), or the verification's ms (an upper bound)
    draft_ms: float
    verify_ms: float
    width: int  # tokens a step verifies
    measured_t1: bool  # t1 is target-only's own, measured by the comparison

    @property
    def predicted(self) -> float:
        step = self.draft_ms + self.verify_ms
        return self.tokens_per_call * self.t1_ms / step if step > 0 else 0.0

    def sentence(self) -> str:
        t1 = (f"a target-only step takes {self.t1_ms:.2f} ms for its one token" if self.measured_t1 else
              f"if a target-only token cost one verification ({self.t1_ms:.2f} ms; it costs less, so this is an "
              "upper bound)")
        return (f"Why: each step drafts in {self.draft_ms:.2f} ms and verifies {self.width} tokens in "
                f"{self.verify_ms:.2f} ms, and {t1}: {self.tokens_per_call:.2f} × {self.t1_ms:.2f} / "
                f"({self.draft_ms:.2f} + {self.verify_ms:.2f}) = {self.predicted:.2f}× over the decoding steps "
                "(the prefill, the same in both runs, left out).")


def why(trace: RunTrace, comparison: Comparison | None = None) -> Why | None:
    """This run's Why, from the comparison's timed runs when there are (the streamed run's own step
    times include drawing the page); None before a step."""
    timed = comparison.speculative_trace if comparison and comparison.speculative_trace else None
    s = (timed or trace).stats
    if not s.num_steps or trace.method == "none":
        return None
    base = comparison.baseline_trace.stats if comparison and comparison.baseline_trace else None
    measured = base is not None and base.num_steps > 0
    t1 = base.mean_draft_ms + base.mean_verify_ms if measured else s.mean_verify_ms
    width = len(trace.steps[-1].draft_ids) + 1 if trace.steps else trace.num_spec_tokens + 1
    return Why(s.tokens_per_call, t1, s.mean_draft_ms, s.mean_verify_ms, width, measured)


def speedup_range(comparison: Comparison) -> str:
    """"1.52× (median; 1.47–1.58 over 3 timings)", or, for a reply too long to time three times, "1.52×
    (one timing: ...)" with what more would have cost."""
    text = f"{comparison.speedup:.2f}×"
    n = len(comparison.speedups)
    if n > 1:
        text += f" (median; {min(comparison.speedups):.2f}–{max(comparison.speedups):.2f} over {n} timings)"
    elif n == 1 and comparison.round_s:
        text += (f" (one timing: {COMPARE_ROUNDS} would take about {COMPARE_ROUNDS * comparison.round_s:.0f} s; "
                 "timings vary from run to run, so read it as rough)")
    return text


def render_headline(trace: RunTrace | None, comparison: Comparison | None = None, unshown: str = "") -> str:
    """Tokens per target call, the measured speedup (or how to measure it) and why; dashes before a run.
    `unshown`: the clause saying the last token counted is a stop token the reply does not show
    (Session.unshown_stop), after the accounting."""
    if trace is None or not trace.stats.num_steps:
        return ('<div class="sl-headline sl-headline-empty"><div class="sl-hl"><b>–</b><span>tokens per target '
                'call</span></div><div class="sl-hl"><b>–</b><span>speedup</span></div></div>')
    s = trace.stats
    if trace.method == "none":
        return ('<div class="sl-headline"><div class="sl-hl"><b>1</b><span>token per target call</span></div>'
                f'<div class="sl-hl"><b>{s.tokens_per_s:.1f}</b><span>tokens/s target-only: the baseline a '
                "speculative run is compared with</span></div></div>")
    calls = (f'<div class="sl-hl"><b>{s.tokens_per_call:.2f}</b><span>tokens per target call</span>'
             f"<small>{escape(s.accounting() + ('; ' + unshown if unshown else ''))}</small></div>")
    if comparison is not None and comparison.baseline_tokens_per_s > 0:
        speed = (f'<div class="sl-hl"><b>{comparison.speedup:.2f}×</b><span>speedup, measured</span>'
                 f"<small>{escape(speedup_range(comparison))}: {comparison.speculative_tokens_per_s:.1f} vs "
                 f"{comparison.baseline_tokens_per_s:.1f} tokens/s target-only, both timed with nothing drawn"
                 "</small></div>")
    else:
        speed = ('<div class="sl-hl sl-hl-unmeasured"><b>?</b><span>speedup</span><small>tick “Compare with '
                 "target-only” to measure it</small></div>")
    reason = why(trace, comparison)
    line = f'<div class="sl-hl-why">{escape(reason.sentence())}</div>' if reason else ""
    return f'<div class="sl-headline">{calls}{speed}{line}</div>'
