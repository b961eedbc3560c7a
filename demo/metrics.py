"""Acceptance accounting, defined once and reused by the CLI and the UI, and the clock of a step's
phases (``StepTimer``).

Vocabulary (the same words label every chart):

- draft: the k tokens the drafter proposes in one decoding step.
- accepted: the leading draft tokens the target confirms (greedy: they equal the target's argmax;
  sampled: each passes the rejection test). Counting stops at the first rejection.
- the target's own token: the one token the target adds at the end of every step, either the
  correction after a rejection or the bonus token when all k drafts were accepted.
- tokens per target call = (accepted + the target's own tokens) / decoding steps: a run's T tokens
  are its A accepted drafts plus S target tokens, in S target calls, plus the prefill's one token
  (``accounting``). Only what the reply kept counts: a draft accepted after the end of the reply (a
  stop token, the token budget) is not emitted, so it is not counted accepted either.
- mean acceptance length = 1 + accepted / drafts (vLLM's convention, ``SpecDecodingStats`` in
  vllm/v1/spec_decode/metrics.py): the same figure as tokens per target call, but for a last step
  cut before its own token.
- acceptance at draft i = share of steps with at least i drafts accepted (a survival curve, not a
  conditional rate), so mean acceptance length = 1 + sum of acceptance at every draft.
- acceptance at draft 1 after a full step / after a rejected step: the same share over the steps that
  follow a step whose drafts were all accepted / one that rejected a draft. A step starts where
  the last one stopped, and a rejection marks a place the drafter did not foresee: the split shows
  why acceptance at draft 1 falls as k grows (deeper chains start more steps after rejections).

Numbering: the page and the bench (``format_table``) number draft positions 1..k as a learner reads
them, "draft i" being the i-th token of a step's draft (the depth its colour shows), so "acceptance
at draft i" is vLLM's 0-based "acceptance at token i-1".
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

MEAN_ACCEPTANCE_LENGTH = "mean acceptance length"
DEFINITIONS = {
    "tokens_per_call": "Tokens per target call: (accepted drafts + the target's own tokens) / decoding steps; "
    "the prefill's first token aside.",
    "mean_acceptance_length": "1 + accepted drafts per drafting step (vLLM's measure): tokens per target call, "
    "but for a last step cut before its own token.",
    "acceptance_per_position": "Acceptance at draft i (i = 1..k, the i-th draft token of a step): share of "
    "steps whose first i drafts were all accepted.",
    "tokens_per_s": "Generated tokens per second of engine time (prefill included, UI time excluded).",
    "draft_ms": "Mean time per step spent proposing the k draft tokens.",
    "verify_ms": "Mean time per step spent in the target's verification forward and the acceptance test.",
    "acceptance_at_0_after": "Acceptance at draft 1 (a step's first draft token) over the steps right after a "
    "fully accepted step, and over those right after a rejection.",
    "draft_vocab": "Target tokens a draft can be: the drafter's draft vocabulary, the whole vocabulary, or (a "
    "head drafting through the target's lm_head, on a CPU) its most frequent tokens; a token outside it is "
    "never drafted, and the output is the target's all the same.",
}


@dataclass
class AcceptanceStats:
    """Running totals of one generation (or one benchmark), with vLLM's definitions."""

    reach: int  # the most drafts one step can accept: k, or k + a lookup branch's length
    num_drafts: int = 0  # decoding steps that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [k] steps with >= i+1 accepted
    num_steps: int = 0  # target forwards after prefill (with or without drafts)
    num_generated: int = 0  # tokens emitted, prefill token included
    num_target_tokens: int = 0  # the target's own tokens that decoding steps emitted (correction or bonus)
    draft_ms_total: float = 0.0
    verify_ms_total: float = 0.0
    prefill_ms: float = 0.0
    elapsed_s: float = 0.0  # engine time: prefill + steps, consumer time between steps excluded
    steps_after_full: int = 0  # drafting steps right after a step whose drafts were all accepted ...
    first_accepted_after_full: int = 0  # ... and how many of them had their first draft accepted
    steps_after_rejection: int = 0  # the same right after a step that rejected a draft
    first_accepted_after_rejection: int = 0
    last_step_full: bool | None = None  # how this generation's last drafting step ended (None: none yet); not a total

    def __post_init__(self):
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.reach

    def observe_draft(self, num_draft: int, num_accepted: int) -> None:
        """Count one verified draft of num_draft tokens of which the first num_accepted passed and were
        emitted (a draft past the end of the reply is not counted)."""
        assert 0 <= num_accepted <= num_draft <= self.reach
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        if self.last_step_full is True:
            self.steps_after_full += 1
            self.first_accepted_after_full += num_accepted > 0
        elif self.last_step_full is False:
            self.steps_after_rejection += 1
            self.first_accepted_after_rejection += num_accepted > 0
        self.last_step_full = num_accepted == num_draft

    def observe_prefill(self, prefill_ms: float) -> None:
        """Count the prefill, which emits the target's first token (not a decoding step)."""
        self.prefill_ms += prefill_ms
        self.num_generated += 1

    def observe_step(self, num_emitted: int, draft_ms: float, verify_ms: float, num_accepted: int) -> None:
        """Count one target forward that emitted num_emitted tokens, num_accepted of them accepted
        drafts (the rest, one or none, the target's own token)."""
        assert 0 <= num_accepted <= num_emitted <= num_accepted + 1
        self.num_steps += 1
        self.num_generated += num_emitted
        self.num_target_tokens += num_emitted - num_accepted
        self.draft_ms_total += draft_ms
        self.verify_ms_total += verify_ms

    def merge(self, other: "AcceptanceStats") -> None:
        """Add another run's totals (same k) to these, for benchmark totals over prompts."""
        assert other.reach == self.reach
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.accepted_per_position = [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position)]
        self.num_steps += other.num_steps
        self.num_generated += other.num_generated
        self.num_target_tokens += other.num_target_tokens
        self.draft_ms_total += other.draft_ms_total
        self.verify_ms_total += other.verify_ms_total
        self.prefill_ms += other.prefill_ms
        self.elapsed_s += other.elapsed_s
        self.steps_after_full += other.steps_after_full
        self.first_accepted_after_full += other.first_accepted_after_full
        self.steps_after_rejection += other.steps_after_rejection
        self.first_accepted_after_rejection += other.first_accepted_after_rejection

    @property
    def tokens_per_call(self) -> float:
        """(accepted drafts + the target's own tokens) / decoding steps; 1 for the target alone."""
        return (self.num_accepted_tokens + self.num_target_tokens) / self.num_steps if self.num_steps else 1.0

    def accounting(self) -> str:
        """The run's tokens in one line, the words every view uses: "A accepted drafts + S target tokens
        = T tokens in S target calls (+ the prefill)"."""
        prefill = self.num_generated - self.num_accepted_tokens - self.num_target_tokens
        return (f"{self.num_accepted_tokens} accepted drafts + {self.num_target_tokens} target tokens "
                f"{'+ 1 from the prefill ' if prefill == 1 else f'+ {prefill} from prefills ' if prefill else ''}"
                f"= {self.num_generated} tokens in {self.num_steps} target calls (+ the prefill"
                f"{'s' if prefill > 1 else ''})")

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [n / self.num_drafts if self.num_drafts else 0.0 for n in self.accepted_per_position]

    @property
    def acceptance_at_0_after_full(self) -> float | None:
        return self.first_accepted_after_full / self.steps_after_full if self.steps_after_full else None

    @property
    def acceptance_at_0_after_rejection(self) -> float | None:
        return self.first_accepted_after_rejection / self.steps_after_rejection if self.steps_after_rejection else None

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_draft_ms(self) -> float:
        return self.draft_ms_total / self.num_steps if self.num_steps else 0.0

    @property
    def mean_verify_ms(self) -> float:
        return self.verify_ms_total / self.num_steps if self.num_steps else 0.0

    @classmethod
    def from_counts(cls, counts: dict) -> "AcceptanceStats":
        """The totals of a report's "counts" (``dataclasses.asdict``), reports written before the
        reach had its own name (when it was called num_spec_tokens) included."""
        counts = dict(counts)
        if "num_spec_tokens" in counts:
            counts["reach"] = counts.pop("num_spec_tokens")
        return cls(**counts)

    def snapshot(self) -> "AcceptanceStats":
        """An independent copy, safe to hand to a consumer while counting goes on."""
        return copy.deepcopy(self)

    def summary(self) -> dict:
        """Plain numbers for JSON, the stats panel and the API."""
        return {
            "reach": self.reach,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_per_position": self.acceptance_per_position,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_steps": self.num_steps,
            "num_generated": self.num_generated,
            "num_target_tokens": self.num_target_tokens,
            "tokens_per_call": self.tokens_per_call,
            "acceptance_at_0_after_full": self.acceptance_at_0_after_full,
            "acceptance_at_0_after_rejection": self.acceptance_at_0_after_rejection,
            "steps_after_full": self.steps_after_full,
            "steps_after_rejection": self.steps_after_rejection,
            "first_accepted_after_full": self.first_accepted_after_full,
            "first_accepted_after_rejection": self.first_accepted_after_rejection,
            "tokens_per_s": self.tokens_per_s,
            "mean_draft_ms": self.mean_draft_ms,
            "mean_verify_ms": self.mean_verify_ms,
            "prefill_ms": self.prefill_ms,
            "elapsed_s": self.elapsed_s,
        }

    def format_table(self) -> str:
        """The acceptance table the bench prints, vLLM's (examples/offline_inference/spec_decode.py) in
        the page's words: acceptance at draft 1..k is vLLM's acceptance at token 0..k-1."""
        rule = "-" * 50
        lines = [rule, f"{MEAN_ACCEPTANCE_LENGTH}: {self.mean_acceptance_length:.2f}", rule]
        lines += [f"acceptance at draft {i}: {r:.2f}" for i, r in enumerate(self.acceptance_per_position, 1)]
        return "\n".join(lines)


class StepTimer:
    """Marks within a step: CUDA events on a GPU (read after the step's sync), wall clock on CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def _now(self):
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self):
        self.marks = [self._now()]

    def mark(self):
        self.marks.append(self._now())

    def read(self) -> list[float]:
        """Milliseconds between consecutive marks; call after the step's host sync."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]
