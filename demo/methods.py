"""The vocabulary of a request, defined once: drafting methods, engine modes, compile scopes, the
limit on k, and the labels the UI, the bench and the reports print for them.

- method: "none" (the target alone), "eagle" (EAGLE-1) or "eagle3" (EAGLE-3): which drafter
  proposes (demo/drafters.py maps each drafting method to its class).
- mode: "eager" (every step runs op by op) or "cudagraph" (each step replays CUDA graphs captured
  before the first request); graph mode changes nothing but time.
- compile scope: what ``--compile`` compiles before capture, the drafter's steps or all of them.
- draft shape: a chain of k drafts, or a tree of depth k (demo/config.py); draft sampling: how
  drafts are drawn at T > 0.

Plain names only (no torch): the service, the bench and the UI read them without the engine.
"""

from __future__ import annotations

DRAFT_METHODS = ("eagle", "eagle3")
METHODS = ("none",) + DRAFT_METHODS
METHOD_LABELS = {"none": "target only", "eagle": "EAGLE", "eagle3": "EAGLE-3"}

MODES = ("eager", "cudagraph")
MODE_LABELS = {"eager": "eager", "cudagraph": "CUDA graph"}
COMPILE_SCOPES = ("drafter", "all")  # --compile: all but the target's forward (default), or every step

# How drafts are drawn at T > 0 (at T = 0 they are always the drafter's top choices):
# "pointmass": the drafter's top choices, each accepted with the target's probability p(x), siblings
#   of a tree tried in turn (EAGLE's rule); "q": drawn from the drafter's distribution q, accepted
#   with min(1, p/q) (speculative sampling; SpecInfer's rule on trees); "wor": a node's children drawn
#   from q without replacement (distinct tokens), each accepted with min(1, p/q) against what the
#   earlier rejections left of both p and q (recursive rejection sampling, Jeon et al. 2024). All three
#   keep the target's distribution (demo/tree_verify.py).
DRAFT_SAMPLING = ("pointmass", "q", "wor")
SAMPLED_DRAFTS = ("q", "wor")  # the rules whose drafts are draws from q rather than its top choices
# The rule the page, /generate and the bench use unless told: wor accepted the most and was the
# fastest at T = 1 at each device's default shape (a chain of 3 on a CPU, a tree 7 x 8, 64 on a GPU:
# docs/RESULTS.md, "At T = 1"), though its step costs more than a point-mass chain's.
DEFAULT_DRAFT_SAMPLING = "wor"

# k, draft tokens per step. The engine takes up to MAX_SPEC_TOKENS (deeper chains accept almost
# nothing more); the app offers up to APP_MAX_SPEC_TOKENS, as many as its depth colours tell apart.
MAX_SPEC_TOKENS = 32
APP_MAX_SPEC_TOKENS = 10


def num_drafts(method: str, num_spec_tokens: int) -> int:
    """k of a request: its num_spec_tokens with a drafter, 0 for the target alone."""
    return 0 if method == "none" else int(num_spec_tokens)


def mode_label(mode: str, compile_scope: str | bool | None = None) -> str:
    """"cudagraph+compile(drafter)" and the like: the mode as reports and the bench print it."""
    return mode + (f"+compile({compile_scope})" if compile_scope else "")


def dtype_label(dtype) -> str:
    """"bfloat16" for torch.bfloat16."""
    return str(dtype).removeprefix("torch.")
