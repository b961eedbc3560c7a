"""What a generation asks for, as plain dataclasses (no torch here, so the service, the bench and the
UI read a request's shape and limits without loading the engine):

- ``SamplingParams``: temperature and top-p (T = 0: greedy);
- ``TreeShape``: a request's draft tree, in SGLang's terms (children per node, tokens verified);
- ``DraftShape``: what one decoding step drafts, derived from k and the tree: a chain, a tree, or
  nothing (target only), and how many rows the target verifies;
- ``GenerationConfig``: the engine's settings for one generation;
- ``Rule``: the draft-sampling rule at T > 0.

The draft shape each method offers first on each device is the registry's (demo/methods.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from enum import Enum


TREE_SCRATCH = 512  # drafter cache slots reserved past the context for a tree's frontier rows ((depth - 1) * topk)
MAX_TREE_TOPK = 32
MAX_LOOKUP = 64  # a tree's prompt-lookup branch: at most this many tokens past the drafter's nodes
LOOKUP_NGRAM = 4  # the longest suffix a lookup branch looks up (vLLM's n-gram example sets prompt_lookup_max to 4)
MAX_DRAFT_TOKENS = 256  # verified per step, the root included

class Rule(str, Enum):
    """How drafts are drawn and tested at T > 0 (at T = 0 every rule is the greedy test of the proposer's
    top choices). A str, so a request's `draft_sampling` is its value:
    "pointmass": the proposer's top choices, each accepted with the target's probability p(x), siblings
      of a tree tried in turn against what is left of p (EAGLE's rule);
    "q": drawn from the drafter's distribution q, accepted with min(1, p/q) (speculative sampling;
      SpecInfer's rule on trees);
    "wor": a node's children drawn from q without replacement (distinct tokens), each accepted with
      min(1, p/q) against what the earlier rejections left of both p and q (recursive rejection
      sampling, Jeon et al. 2024).
    All three keep the target's distribution (demo/tree_verify.py); for a point-mass q (a copy) they are
    one rule."""

    POINTMASS = "pointmass"
    Q = "q"
    WOR = "wor"

    @property
    def samples(self) -> bool:
        """Drafts are draws from q rather than its top choices."""
        return self is not Rule.POINTMASS

    @property
    def without_replacement(self) -> bool:
        """A node's sampled children are distinct draws."""
        return self is Rule.WOR

    @classmethod
    def drawn(cls, draft_sampling: str, temperature: float, samples_drafts: bool = True) -> "Rule":
        """The rule a step runs: the request's at T > 0 for a proposer whose drafts have a q
        (`samples_drafts`), the point-mass rule otherwise (at T = 0 the rules coincide)."""
        return cls(draft_sampling) if temperature > 0 and samples_drafts else cls.POINTMASS


DRAFT_SAMPLING = tuple(r.value for r in Rule)
SAMPLED_DRAFTS = tuple(r.value for r in Rule if r.samples)  # the rules whose drafts are draws from q
# The rule the page, /generate and the bench use unless told: wor accepted the most and was the
# fastest at T = 1 at each device's default shape (a chain of 3 on a CPU, a tree 7 x 8, 64 on a GPU:
# docs/RESULTS.md, "At T = 1"), though its step costs more than a point-mass chain's.
DEFAULT_DRAFT_SAMPLING = Rule.WOR.value


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class TreeShape:
    """A request's tree: children per expanded node and tokens verified per step (root included,
    as SGLang counts them); 0 verifies every candidate. The depth is the request's k. `lookup`: a
    prompt-lookup branch of that many tokens verified beside the drafter's nodes (demo/proposers/ngram.py),
    for trees of the drafter's top choices (T = 0 and the point-mass rule); drafts drawn from q draft
    none."""

    topk: int = 4
    size: int = 0  # tokens verified per step, the root included: the API's num_draft_tokens
    lookup: int = 0


@dataclass(frozen=True)
class DraftShape:
    """What one decoding step drafts: depth D (k), children per node K, draft nodes verified N
    (root excluded), the rule its drafts are drawn and tested by (``Rule``: sampled from q, with or
    without replacement, or the drafter's top choices), and tree machinery or the plain chain (a chain is the tree
    K = 1, N = D). Target-only (D = 0) may verify `pad` padding rows after its one token: run at a
    speculative shape's width, it computes every token as that shape's verification does
    (``target_only_width``). A tree of the drafter's top choices may verify a prompt-lookup branch of
    `lookup` more nodes (demo/proposers/ngram.py), which reaches past the drafter's depth."""

    depth: int
    topk: int = 1
    nodes: int = 0
    rule: Rule = Rule.POINTMASS
    tree: bool = False
    pad: int = 0
    lookup: int = 0  # a tree's prompt-lookup branch: nodes verified past the drafter's N, reaching depth D + lookup

    @classmethod
    def of(cls, k: int, tree: TreeShape | None, rule: Rule = Rule.POINTMASS, width: int = 1) -> "DraftShape":
        """The shape of a request: a chain of k, or a tree of depth k (sampled drafts need the tree
        machinery); k = 0: target-only, its forwards `width` rows wide. A tree verifies its size - 1
        best nodes (0: every candidate), sampled or not (demo/tree.py says how sampled trees are
        pruned and stay exact)."""
        if k == 0:
            return cls(0, pad=width - 1)
        if tree is None and not rule.samples:
            return cls(k, 1, k)
        topk = tree.topk if tree is not None else 1
        full = topk + (k - 1) * topk * topk
        nodes = full if tree is None or not tree.size else tree.size - 1
        lookup = tree.lookup if tree is not None and not rule.samples else 0  # drafts drawn from q copy nothing
        return cls(k, topk, nodes, rule, True, lookup=lookup)

    @classmethod
    def drawn(cls, k: int, tree: TreeShape | None, draft_sampling: str, temperature: float,
              width: int = 1, samples_drafts: bool = True) -> "DraftShape":
        """The shape of a request by its rule's name (``Rule.drawn``)."""
        return cls.of(k, tree, Rule.drawn(draft_sampling, temperature, samples_drafts), width)

    @property
    def sampled(self) -> bool:
        return self.rule.samples

    @property
    def without_replacement(self) -> bool:
        return self.rule.without_replacement

    @property
    def chain(self) -> bool:
        """Drafts in a row, one a depth: a chain, or a tree of top-1 (a sampled chain runs as one) without a
        lookup branch."""
        return self.depth > 0 and self.topk == 1 and not self.lookup

    @property
    def candidates(self) -> int:
        """Nodes drafted before pruning: K at depth 1, then K * K per further depth."""
        return self.topk + (self.depth - 1) * self.topk * self.topk

    @property
    def reach(self) -> int:
        """The most drafts a step can accept: the drafter's depth, plus a lookup branch's length."""
        return self.depth + self.lookup

    @property
    def verified(self) -> int:
        """Draft nodes the target verifies each step: the drafter's, then any lookup branch's."""
        return self.nodes + self.lookup

    @property
    def width(self) -> int:
        """Rows of the target's forward each step: the root, the draft nodes (and any padding)."""
        return self.verified + 1 + self.pad

    def check(self) -> None:
        if self.pad < 0:
            raise ValueError(f"a target-only step runs at least 1 row wide, not {self.pad + 1}")
        if self.pad and self.depth:
            raise ValueError(f"only target-only steps are padded, not a shape of depth {self.depth}")
        if not 0 <= self.lookup <= MAX_LOOKUP:
            raise ValueError(f"a lookup branch (--lookup) is 0 to {MAX_LOOKUP} tokens, not {self.lookup}")
        if self.lookup and (not self.tree or self.sampled):
            raise ValueError("a lookup branch hangs on a tree of the drafter's top choices (a tree shape at T = 0 "
                             "or the pointmass rule), not on " + ("drafts drawn from q" if self.sampled else "a chain"))
        if self.width > MAX_DRAFT_TOKENS:
            fix = (f": a tree of depth {self.depth} x top-{self.topk} verifies at most {MAX_DRAFT_TOKENS} of its "
                   f"{self.candidates + 1} with num_draft_tokens (--num-draft-tokens) {MAX_DRAFT_TOKENS} or less"
                   if self.tree and self.topk > 1 else "")
            raise ValueError(f"a step verifies at most {MAX_DRAFT_TOKENS} tokens, not {self.width}{fix}")
        if not self.tree:
            return
        if not 1 <= self.topk <= MAX_TREE_TOPK:
            raise ValueError(f"tree top-k must be in 1..{MAX_TREE_TOPK}, not {self.topk}")
        if not self.depth <= self.nodes <= self.candidates:
            raise ValueError(f"a tree of depth {self.depth} and top-k {self.topk} verifies {self.depth + 1} to "
                             f"{self.candidates + 1} tokens (root included), not {self.nodes + 1}")
        if (self.depth - 1) * self.topk > TREE_SCRATCH:
            raise ValueError(f"depth {self.depth} x top-k {self.topk} needs more than {TREE_SCRATCH} drafter slots")


@dataclass
class GenerationConfig:
    """The engine's settings for one generation (Engine.generate)."""

    max_new_tokens: int = 256
    num_spec_tokens: int = 3  # k: drafts per step, or a tree's depth; 0: target-only through the same engine
    tree: TreeShape | None = None  # None: a chain of k drafts
    draft_sampling: str = DEFAULT_DRAFT_SAMPLING  # at T > 0, a Rule's value
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] | None = None  # None: the target's eos ids
    target_only_width: int = 1  # k = 0: rows of each forward, the first real (see target_only_width())
    # seconds of wall time after which the generation ends at the step that passes them, as
    # transformers' max_time (finish_reason "time"); None: no limit. A public app bounds a request with it.
    max_time_s: float | None = None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p)

    def draft_shape(self, k: int, samples_drafts: bool = True) -> DraftShape:
        """What a step drafts with k drafts per step (k = 0: none). A proposer whose drafts are point
        masses (`samples_drafts` False: a copy) drafts them under any rule, for which the rules coincide."""
        return DraftShape.drawn(k, self.tree, self.draft_sampling, self.temperature, self.target_only_width,
                                samples_drafts)


class Deadline:
    """The time a run may still take (a request's time_limit_s, a benchmark's), from when it began:
    each generation it starts ends once that is up (GenerationConfig.max_time_s)."""

    def __init__(self, limit_s: float | None):
        self.limit_s, self.began = limit_s, time.monotonic()

    def left(self) -> float | None:
        return None if self.limit_s is None else self.limit_s - (time.monotonic() - self.began)

    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def bound(self, gen: GenerationConfig) -> GenerationConfig:
        """`gen`, ending once the request's time is up."""
        left = self.left()
        return gen if left is None else replace(gen, max_time_s=max(left, 0.0))

    def ran_out(self) -> str:
        return (f"stopped at this app's time limit ({self.limit_s:g} s of engine time a request); "
                "ask for fewer new tokens")
