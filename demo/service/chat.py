"""A conversation and the trace of its latest run, as plain data: what each emitted token is and
where it came from, the numbers behind the charts, and the comparison with target-only decoding.

No HTML and no figures here (demo/ui/html/render.py and demo/ui/figures.py draw these objects); everything is
a deep-copyable dataclass, so a browser session can keep its ``ChatState`` in ``gr.State``.

Provenance of an emitted token (the words of demo/metrics.py):

- depth 1..k: an accepted draft token, the i-th of its step's draft;
- depth 0: the target's own token at the end of each step (correction or bonus);
- resampled: at T > 0, the target's own token drawn from the residual after a rejection.

Tokens become text by decoding a window of the sequence and diffing (``IncrementalDecoder``), so
multi-byte characters and SentencePiece/BPE spaces come out right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from demo.metrics import AcceptanceStats
from demo.tree import DraftTree


@dataclass
class TokenPiece:
    """One emitted token and where it came from."""

    token_id: int
    text: str  # the characters it added to the reply ("" while a multi-byte character is incomplete)
    step: int  # the decoding step that emitted it (0: prefill)
    depth: int  # 1..k: accepted draft token at that depth; 0: the target's own token
    prob: float  # its probability under the target's (sampling) distribution
    resampled: bool = False  # T > 0: drawn from the residual after a rejected draft

    @property
    def kind(self) -> str:
        if self.depth:
            return "draft"
        return "resampled" if self.resampled else "target"

    def describe(self) -> str:
        """Hover text: step, provenance, probability under the target."""
        if self.depth:
            what = f"accepted draft token {self.depth}"
        elif self.resampled:
            what = "target's token, resampled after a rejection"
        else:
            what = "target's own token" + (" (prefill)" if self.step == 0 else "")
        return f"step {self.step} · {what} · p = {self.prob:.3f}"


def provenance(token_ids: list[int], num_accepted: int, resampled: bool) -> list[tuple[int, bool]]:
    """(depth, resampled) of each token one step emitted: the accepted drafts first, then the
    target's own token (absent when a stop token or the budget cut the step short)."""
    return [(i + 1, False) if i < num_accepted else (0, resampled) for i in range(len(token_ids))]


def without_partial_character(text: str) -> str:
    """Decoded text less the replacement characters at its end, bytes its last tokens left as part
    of a character (the token budget can cut a reply inside one) or as none: a reply never ends in
    half a character."""
    return text.rstrip("\ufffd")


class IncrementalDecoder:
    """Per-token text of a growing reply: decode a window of the ids and take what the new token
    added. A token that leaves a character incomplete gets "" and the token that completes it
    carries the character. The window starts at a token boundary where text was complete."""

    def __init__(self, tokenizer, window: int = 32):
        self.tokenizer = tokenizer
        self.window = window
        self.ids: list[int] = []
        self.start = 0  # first id of the decode window (always a complete-text boundary)
        self.prefix_len = 0  # len(decode(ids[start:committed]))
        self.boundaries = [0]  # indices after which the decoded text was complete

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self._decode(self.ids[self.start:])
        if text.endswith("\ufffd"):
            return ""
        piece = text[self.prefix_len:]
        end = len(self.ids)
        self.boundaries.append(end)
        if end - self.start > 2 * self.window:  # slide the window to a recent complete boundary
            self.start = next(b for b in reversed(self.boundaries) if b <= end - self.window)
            self.boundaries = [b for b in self.boundaries if b >= self.start]
            self.prefix_len = len(self._decode(self.ids[self.start:]))
        else:
            self.prefix_len = len(text)
        return piece

    def flush(self) -> str:
        """The text still held back when the reply ends, less a character its last tokens left
        incomplete (without_partial_character)."""
        text = without_partial_character(self._decode(self.ids[self.start:]))
        piece = text[self.prefix_len:]
        self.prefix_len = len(text)
        return piece


@dataclass
class StepPoint:
    """What the charts need from one decoding step (step 0, the prefill, is not a point)."""

    step: int
    reach: int  # the most this step could accept: k, a tree's depth (+ its lookup branch); 0: target-only
    num_accepted: int  # accepted drafts the reply kept (none past its end)
    num_emitted: int
    draft_ms: float
    verify_ms: float
    elapsed_s: float  # engine time after this step, prefill included
    tokens_per_s: float  # running: tokens so far / engine time so far


@dataclass
class Turn:
    role: str  # "user" or "assistant"
    text: str
    pieces: list[TokenPiece] = field(default_factory=list)  # assistant turns: token provenance
    label: str = ""
    state: str = "done"  # "streaming", "done", or "stopped" (Stop pressed while streaming)


@dataclass
class StepRecord:
    """Everything one engine step did, as plain data: what an inspector, a replay or an export reads.
    Step 0 is the prefill (no drafts)."""

    step: int
    root: int  # the token the step's drafts hang from: the last one emitted before it (-1 at the prefill)
    draft_ids: list[int]  # the verified drafts (a chain's k, a tree's nodes)
    num_accepted: int
    token_ids: list[int]  # emitted (accepted drafts, then the target's own token)
    token_probs: list[float]
    resampled: bool
    draft_ms: float
    verify_ms: float  # the prefill's time at step 0
    elapsed_s: float  # engine time after this step, prefill included
    tree: DraftTree | None  # the drafts as a tree (a chain is a path) with q, p and the accepted path
    target_top: list[list[tuple[int, float]]]  # per emitted token: the target's best (token, p) there
    draft_top: list[list[tuple[int, float]]] | None  # a chain's: per draft position, the drafter's best (token, q)


@dataclass
class RunTrace:
    """The latest speculative run: what the charts, the tree view, the stats panel and the step
    inspector show."""

    method: str
    mode: str
    num_spec_tokens: int
    stats: AcceptanceStats
    points: list[StepPoint] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)  # every engine step, the prefill first
    finish_reason: str | None = None
    settings: dict = field(default_factory=dict)  # the request as plain data (Request.settings()): the acceptance rule, the trace download
    prompt_ids: list[int] = field(default_factory=list)  # the conversation before the reply, as the target read it

    @property
    def trees(self) -> list[DraftTree]:
        """Each drafting step's tree; trees[i] is step i + 1's."""
        return [s.tree for s in self.steps if s.tree is not None]

    @property
    def roots(self) -> list[int]:
        """The token each of ``trees`` hangs from."""
        return [s.root for s in self.steps if s.tree is not None]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token of two decodes (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


COMPARE_ROUNDS = 3  # the timings a comparison takes where they fit (demo/service/session.py)


@dataclass
class Comparison:
    """Speculative run vs the same prompt target-only, in the same mode, both timed with nothing drawn
    between their steps (demo/service/session.py). Speeds are tokens per second of engine time
    (AcceptanceStats.elapsed_s: prefill and steps), those of the round whose speedup is the median;
    `speedups` holds each round's ratio, so the page shows their range."""

    speculative_tokens_per_s: float
    baseline_tokens_per_s: float
    greedy: bool
    identical: bool | None  # T = 0 only: the two replies are token-identical
    first_difference: int | None  # index of the first differing token, when not identical
    baseline_text: str
    baseline: Turn | None = None  # the target-only reply, token by token (the race's second lane)
    baseline_trace: RunTrace | None = None  # its steps and engine times
    # rows of the target-only run the T = 0 identity was checked against: 1 (the baseline itself), or
    # in bf16 and fp16 the verification's width (demo.engine.target_only_width: the exact reference)
    reference_width: int = 1
    one_row_difference: int | None = None  # reference_width > 1: where the 1-row baseline first differs
    speedups: list[float] = field(default_factory=list)  # each timed round's speculative / target-only tokens/s
    speculative: Turn | None = None  # the speculative run timed (the race's first lane) ...
    speculative_trace: RunTrace | None = None  # ... and its steps and engine times
    round_s: float = 0.0  # the wall time of one round (both runs): what timing it again would cost
    # each timed run's clause where a stop token the text leaves out ended it (Session.unshown_stop), or ""
    unshown: tuple[str, str] = ("", "")

    @classmethod
    def of(cls, speculative: RunTrace, baseline: RunTrace, greedy: bool, identical: bool | None,
           first_difference: int | None, baseline_reply: Turn, reference_width: int = 1,
           one_row_difference: int | None = None, speedups: list[float] | None = None,
           speculative_reply: Turn | None = None, round_s: float = 0.0) -> "Comparison":
        """The comparison of two recorded runs, by their engine time."""
        return cls(speculative.stats.tokens_per_s, baseline.stats.tokens_per_s, greedy, identical, first_difference,
                   baseline_reply.text, baseline_reply, baseline, reference_width, one_row_difference,
                   list(speedups or []), speculative_reply, speculative, round_s)

    @property
    def speedup(self) -> float:
        if self.speedups:
            return sorted(self.speedups)[len(self.speedups) // 2]  # the median (of 1 or 3 rounds)
        return self.speculative_tokens_per_s / self.baseline_tokens_per_s if self.baseline_tokens_per_s else 0.0


@dataclass
class ChatState:
    """One browser session's conversation (kept in gr.State; deep-copyable)."""

    turns: list[Turn] = field(default_factory=list)
    trace: RunTrace | None = None
    comparison: Comparison | None = None
    comparing: bool = False  # the comparison with target-only is running (Stop ends it)
    playback: int = 0  # the latest playback's number (a replay, a race, a step shown): an older one stops

    def next_playback(self) -> int:
        """A new playback's number; every older playback stops at its next frame."""
        self.playback += 1
        return self.playback

    @property
    def replying(self) -> bool:
        """A reply (or its comparison) of this conversation is running."""
        return self.comparing or any(t.state == "streaming" for t in self.turns)

    def mark_stopped(self) -> None:
        """A turn still streaming when Stop was pressed (or a new message came) was stopped, and so
        was a comparison running after it."""
        self.comparing = False
        for t in self.turns:
            if t.state == "streaming":
                t.state = "stopped"

    def messages(self) -> list[dict]:
        return [{"role": t.role, "content": t.text} for t in self.turns]


@dataclass
class Update:
    """One view update: the conversation, the numbers, and what is going on."""

    chat: ChatState
    status: str
    done: bool = False
