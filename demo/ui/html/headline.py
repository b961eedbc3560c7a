"""The run in two numbers, in large type while it generates: tokens per target call (the mean
acceptance length) and the speedup, with one line on why the second is smaller than the first.

The speedup is measured when this visitor's target-only tokens/s in the same mode is known (a
target-only run, or the "Compare with target-only" run, both through the same engine), else
estimated from acceptance and step times:

    speedup ≈ tokens per call × verify ms / (draft ms + verify ms)

which prices a target-only token at one verification forward, an upper bound: verifying k + 1
tokens costs at least what decoding 1 does. The headline says which of the two it shows.

Pure functions of plain data (AcceptanceStats, RunTrace, Comparison); no Gradio here.
"""

from __future__ import annotations

from dataclasses import dataclass

from demo.service.chat import Comparison, RunTrace
from demo.ui.html.render import escape

WHY = ("Why is the speedup smaller than the tokens per call? Every step also runs the drafter, and the "
       "target's forward over {width} tokens costs more than its forward over 1.")


@dataclass(frozen=True)
class Speedup:
    value: float
    measured: bool  # against a target-only tokens/s measured in this mode; False: estimated
    basis: str  # how it was obtained, in one line


def baseline_key(model: str, mode: str) -> str:
    """Whose target-only speed a run compares with: the same models, in the same mode."""
    return f"{model}|{mode}"


def record_baseline(baselines: dict, key: str, trace: RunTrace | None, comparison: Comparison | None) -> dict:
    """`baselines` (key -> target-only tokens/s) with what a finished run measured: a target-only run
    is one, and so is the comparison run after a speculative one."""
    if comparison is not None and comparison.baseline_tokens_per_s > 0:
        return {**baselines, key: comparison.baseline_tokens_per_s}
    if trace is not None and trace.method == "none" and trace.stats.tokens_per_s > 0:
        return {**baselines, key: trace.stats.tokens_per_s}
    return baselines


def speedup(trace: RunTrace, baseline_tps: float | None, comparison: Comparison | None = None) -> Speedup | None:
    """The run's speedup over target-only decoding: the comparison's, else against `baseline_tps`,
    else the estimate from acceptance and step times; None before the first decoding step."""
    s = trace.stats
    if comparison is not None and comparison.baseline_tokens_per_s > 0:
        return Speedup(comparison.speedup, True, f"{comparison.speculative_tokens_per_s:.1f} vs "
                       f"{comparison.baseline_tokens_per_s:.1f} tokens/s target-only, measured just now")
    if not s.num_steps:
        return None
    if baseline_tps:
        return Speedup(s.tokens_per_s / baseline_tps, True, f"{s.tokens_per_s:.1f} vs {baseline_tps:.1f} tokens/s "
                       "target-only (measured earlier in this mode)")
    step_ms = s.mean_draft_ms + s.mean_verify_ms
    value = s.mean_acceptance_length * s.mean_verify_ms / step_ms if step_ms > 0 else 0.0
    return Speedup(value, False, "estimate: tokens per call × verify / (draft + verify) time, pricing a target-only "
                   "token at one verify (an upper bound); tick \"Compare with target-only\" to measure it")


def render_headline(trace: RunTrace | None, baseline_tps: float | None = None,
                    comparison: Comparison | None = None) -> str:
    """Tokens per target call and the speedup in large type, with the basis of the speedup and why
    it is smaller; the two labels with dashes before a run."""
    if trace is None or not trace.stats.num_steps:
        return ('<div class="sl-headline sl-headline-empty"><div class="sl-hl"><b>–</b><span>tokens per target '
                'call</span></div><div class="sl-hl"><b>–</b><span>speedup</span></div></div>')
    s = trace.stats
    if trace.method == "none":
        return ('<div class="sl-headline"><div class="sl-hl"><b>1</b><span>token per target call</span></div>'
                f'<div class="sl-hl"><b>{s.tokens_per_s:.1f}</b><span>tokens/s target-only: the baseline a '
                "speculative run in this mode is measured against</span></div></div>")
    length = s.mean_acceptance_length
    up = speedup(trace, baseline_tps, comparison)
    width = len(trace.steps[-1].draft_ids) + 1
    step_ms = s.mean_draft_ms + s.mean_verify_ms
    base = (comparison.baseline_tokens_per_s if comparison is not None and comparison.baseline_tokens_per_s > 0
            else baseline_tps)
    detail = (f" Here drafting takes {s.mean_draft_ms:.1f} of each step's {step_ms:.1f} ms"
              + (f", and a verify {s.mean_verify_ms:.1f} ms against about {1e3 / base:.1f} ms per token "
                 "target-only" if base else "") + ".")
    estimate = "" if up.measured else "≤ "
    return ('<div class="sl-headline">'
            f'<div class="sl-hl"><b>{length:.2f}</b><span>tokens per target call</span>'
            '<small>the mean acceptance length: accepted drafts + the target\'s own token</small></div>'
            f'<div class="sl-hl{"" if up.measured else " sl-hl-estimate"}"><b>{estimate}{up.value:.2f}×</b>'
            f'<span>speedup{"" if up.measured else " (estimate)"}</span><small>{escape(up.basis)}</small></div>'
            f'<div class="sl-hl-why">{escape(WHY.format(width=width) + detail)}</div></div>')
