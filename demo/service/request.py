"""A request and its limits, as plain data (no torch: hosting, settings and the bench read these
without the engine).

- ``Request`` is one generation's settings: method, mode, compare, and the engine's
  ``GenerationConfig``. Build one from loose settings with ``Request.of``.
- ``LIMITS`` and ``TREE_LIMITS``: the allowed ranges of the settings, checked (``check_number``)
  before any engine call; ``RequestError`` is a refusal whose message the visitor reads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from demo.config import MAX_DRAFT_TOKENS, MAX_LOOKUP, MAX_TREE_TOPK, DraftShape, GenerationConfig, Rule, TreeShape
from demo.methods import APP_MAX_SPEC_TOKENS, DEFAULT_METHOD, REGISTRY, draft_depth

# Allowed ranges of the generation settings (inclusive), checked before any engine call.
LIMITS = {
    "num_spec_tokens": (1, APP_MAX_SPEC_TOKENS),
    "temperature": (0.0, 2.0),
    "top_p": (0.01, 1.0),
    "max_new_tokens": (1, 2048),
    "seed": (0, 2**31 - 1),
}
TREE_PARAMS = {"topk": "tree_topk", "size": "num_draft_tokens", "lookup": "lookup"}  # /generate's names of them
TREE_LIMITS = {"topk": (1, MAX_TREE_TOPK), "size": (0, MAX_DRAFT_TOKENS),  # size 0: every node
               "lookup": (0, MAX_LOOKUP)}
# The page offers max new tokens up to its model's context less this share of it (at least), room
# for a short prompt and a step's drafts: the most it offers runs, where LIMITS' 2048 could never
# fit a 2048-token context (a longer prompt is refused at Generate, with the room it leaves).
PROMPT_SHARE = 1 / 16
# A prompt (with the conversation before it) longer than max_context * this many characters cannot
# fit the context and is refused before it is tokenized: English runs about 4 characters per token,
# and no real text packs 32 into every token of a prompt.
MAX_CHARS_PER_TOKEN = 32

NO_COMPARISON = "target only is the target-only baseline itself"


class RequestError(ValueError):
    """Bad input; the message is shown to the user and no engine was called."""


@dataclass
class Request:
    """One generation: who drafts (method), how steps run (mode), whether to compare with the
    target alone, and the engine's settings. Build one from loose settings with ``Request.of``."""

    prompt: str
    method: str = DEFAULT_METHOD
    mode: str = "eager"
    compare: bool = False  # then run the same prompt target-only for the speedup
    gen: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=128))
    time_limit_s: float | None = None  # the most the request (reply and comparison) may hold the engine

    @classmethod
    def of(cls, prompt: str, *, method: str = DEFAULT_METHOD, mode: str = "eager", compare: bool = False,
           **generation) -> "Request":
        """Request.of("hi", method="eagle", num_spec_tokens=5, temperature=0.7): the generation
        settings by name, over the request defaults."""
        return cls(prompt, method, mode, compare, replace(cls("").gen, **generation))

    @property
    def k(self) -> int:
        return draft_depth(self.method, self.gen.num_spec_tokens)

    @property
    def shape(self) -> DraftShape:
        """What each step drafts: a chain of k, a tree of depth k, or nothing (target only)."""
        return self.engine_config().draft_shape(self.k)

    def engine_config(self) -> GenerationConfig:
        """What the engine runs: k = 0 for the target alone; a method whose drafts are point masses
        (a copy) under the pointmass rule, with which the others coincide on them."""
        method = REGISTRY.get(self.method)
        rule = self.gen.draft_sampling if method is None or method.samples_drafts else Rule.POINTMASS.value
        return replace(self.gen, num_spec_tokens=self.k, draft_sampling=rule)

    def settings(self) -> dict:
        """The request as plain data (JSON-ready): method, mode, compare and the engine's settings."""
        return {"method": self.method, "mode": self.mode, "compare": self.compare, **asdict(self.engine_config())}


DEFAULT_REQUEST = Request("")


def check_values(request: Request) -> None:
    """The request's numbers and its tree, each a number within its LIMITS (the checks that need no
    models): run before anything computes with them, so a null, NaN, Infinity, list or string is
    refused in a sentence rather than failing in arithmetic."""
    for name, (lo, hi) in LIMITS.items():
        check_number(name, getattr(request.gen, name), lo, hi)
    tree = request.gen.tree
    if tree is None or not request.k:
        return
    if not isinstance(tree, TreeShape):
        raise RequestError(f"tree must be a TreeShape, not {tree!r}.")
    method = REGISTRY.get(request.method)
    if method is not None and not method.trees:
        raise RequestError(f"{method.label} drafts chains, not trees: choose the chain shape (tree_topk 0).")
    for name, (lo, hi) in TREE_LIMITS.items():
        check_number(TREE_PARAMS[name], getattr(tree, name), lo, hi)
    try:
        request.shape.check()
    except ValueError as e:
        raise RequestError(f"{str(e)[0].upper()}{str(e)[1:]}.") from None


def most_new_tokens(max_context: int) -> int:
    """The most max new tokens the page offers on a model of `max_context` tokens (PROMPT_SHARE)."""
    lo, hi = LIMITS["max_new_tokens"]
    return max(lo, min(hi, max_context - math.ceil(max_context * PROMPT_SHARE)))


def check_number(name: str, value, lo, hi) -> None:
    """A setting must be a finite number (a whole one where the limits are) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number, not {value!r}.")
    if isinstance(lo, int) and value != int(value):
        raise RequestError(f"{name} must be a whole number, not {value}.")
    if not lo <= value <= hi:
        raise RequestError(f"{name} = {value} is out of range: allowed {lo} to {hi}.")
