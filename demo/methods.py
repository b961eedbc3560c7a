"""The drafting methods, one registry: what each is called and labelled, what it needs loaded, the
draft shapes it drafts, and the shape each device offers first at T = 0 and at T > 0. The page's
choices, /generate's `method`, the presets, the bench and the Benchmark tab read it; a method's
proposal is its proposer's (demo/proposers/). A new family is its proposer module plus one entry here.

Also the rest of a request's vocabulary that is not a draft: engine modes, compile scopes, the limit
on k, and the labels the UI, the bench and the reports print for them.

- method: ``METHODS``' names: "none" (the target alone), "eagle" (EAGLE-1), "eagle3" (EAGLE-3), "ngram"
  (model-free prompt lookup, vLLM's name).
- mode: "eager" (every step runs op by op) or "cudagraph" (each step replays CUDA graphs captured
  before the first request); graph mode changes nothing but time.
- compile scope: what ``--compile`` compiles before capture, the proposer's steps or all of them.

Plain names only (no torch): the service, the bench and the UI read them without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from demo.config import TreeShape

@dataclass(frozen=True)
class Method:
    """A drafting method of the registry."""

    name: str  # the request's `method`
    label: str  # what the page and the reports call it
    proposer: str | None  # who drafts: "drafter" (an EAGLE head, loaded with the target), "ngram" (nothing to
    # load: demo/proposers/ngram.py), None (no one: the target alone)
    trees: bool  # drafts trees (top-k children, a lookup branch) as well as chains
    # drafts drawn from a distribution at T > 0 (the q and wor rules). A copy is a point mass, for which the
    # three rules of demo/config.DRAFT_SAMPLING coincide: such a method drafts its point masses under any.
    samples_drafts: bool
    # device type -> (the draft offered first at T = 0, at T > 0); "cpu" stands for any device not named
    defaults: tuple = ()  # ((device type, (k, tree) at T = 0, (k, tree) at T > 0), ...); tree None: a chain
    color: str = "#7f7f7f"  # its colour in the bench's charts

    @property
    def needs_drafter(self) -> bool:
        return self.proposer == "drafter"

    def default_draft(self, device_type: str, temperature=0.0) -> tuple[int, TreeShape | None]:
        """(k, tree) to offer first on a device ("cuda", "cpu", ...) at `temperature`; tree None: a
        chain of k. A temperature that is not a positive number (a request's checks refuse all but 0)
        takes the greedy one."""
        table = {device: (greedy, sampled) for device, greedy, sampled in self.defaults}
        greedy, sampled = table.get(device_type, table.get("cpu", ((0, None), (0, None))))
        hot = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0
        return sampled if hot else greedy


# The fastest draft shapes measured with the default target and its bundled heads (docs/RESULTS.md,
# "Draft shapes", "The CPU's shapes", "A lookup branch", "At T = 1"). On a GPU in graph mode a wide
# tree, whose verification costs little more than a chain's, with a lookup branch of 16 beside its 64
# tokens (15 and 27 % more tokens a forward on the two validation sets, 1.08 and 1.19 x the tokens/s;
# 24 accepts more and is slower); at T > 0 (drafts drawn without replacement) a shallower tree: few
# steps reach levels 6 and 7 at T = 1. On a CPU, where verification grows with every row, a narrow
# tree of 6 tokens (depth 4, top-2): its 6 rows verify in about 1.3 one-row forwards; a lookup branch
# of 4 or 8 beside it accepted 6 to 10 % more and ran at 0.67 to 0.90 x, so it has none; at T > 0 the
# chain of 3, which led a chain of 2 and three 4-row trees at T = 1.
DEFAULT_TREES = {"cuda": TreeShape(8, 64, 16), "cpu": TreeShape(2, 6)}  # the tree a visitor picking one starts from
EAGLE_DEFAULTS = (("cuda", (7, DEFAULT_TREES["cuda"]), (5, TreeShape(8, 64))),
                  ("cpu", (4, DEFAULT_TREES["cpu"]), (3, None)))
# A copy costs no drafter pass, and a chain of it is verified beside its root: on a GPU, whose
# verification of 11 rows costs what one row's does, the longest chain the page offers (10 led 6 and 3
# on both validation sets); on a CPU, which pays for each row, the shortest measured: at k = 2 it
# about breaks even with target-only, at 3 and 4 it loses (docs/RESULTS.md, "The n-gram method").
# At T > 0 the same: not measured apart.
NGRAM_DEFAULTS = (("cuda", (10, None), (10, None)), ("cpu", (2, None), (2, None)))

REGISTRY: dict[str, Method] = {m.name: m for m in (  # in the order the page lists them: the baseline, then
    Method("none", "target only", None, trees=False, samples_drafts=False),  # the model-free, then the heads
    Method("ngram", "n-gram lookup", "ngram", trees=False, samples_drafts=False, defaults=NGRAM_DEFAULTS,
           color="#e0a030"),
    Method("eagle", "EAGLE", "drafter", trees=True, samples_drafts=True, defaults=EAGLE_DEFAULTS, color="#48b5c4"),
    Method("eagle3", "EAGLE-3", "drafter", trees=True, samples_drafts=True, defaults=EAGLE_DEFAULTS, color="#22559f"),
)}
METHODS = tuple(REGISTRY)  # every method a request may name
METHOD_LABELS = {name: m.label for name, m in REGISTRY.items()}
DRAFT_METHODS = tuple(name for name, m in REGISTRY.items() if m.needs_drafter)  # those loading a drafter per preset
DEFAULT_METHOD = "eagle3"  # what a request drafts with unless told

MODES = ("eager", "cudagraph")
MODE_LABELS = {"eager": "eager", "cudagraph": "CUDA graph"}
COMPILE_SCOPES = ("drafter", "all")  # --compile: all but the target's forward (default), or every step

# k, draft tokens per step. The engine takes up to MAX_SPEC_TOKENS (deeper chains accept almost
# nothing more); the app offers up to APP_MAX_SPEC_TOKENS, as many as its depth colours tell apart.
MAX_SPEC_TOKENS = 32
APP_MAX_SPEC_TOKENS = 10


def draft_depth(method: str, num_spec_tokens: int) -> int:
    """k of a request: its num_spec_tokens with a proposer, 0 for the target alone (a method not in
    the registry is refused by the request's checks)."""
    spec = REGISTRY.get(method)
    return 0 if spec is not None and spec.proposer is None else int(num_spec_tokens)


def default_draft(device_type: str, temperature=0.0, method: str = DEFAULT_METHOD) -> tuple[int, TreeShape | None]:
    """(k, tree) `method` offers first on a device at `temperature` (Method.default_draft)."""
    return REGISTRY[method].default_draft(device_type, temperature)


def default_tree(device_type: str) -> TreeShape:
    """The tree to offer when a visitor picks a tree: the fastest tree measured on the device."""
    return DEFAULT_TREES.get(device_type, DEFAULT_TREES["cpu"])


def mode_label(mode: str, compile_scope: str | bool | None = None) -> str:
    """"cudagraph+compile(drafter)" and the like: the mode as reports and the bench print it."""
    return mode + (f"+compile({compile_scope})" if compile_scope else "")


def dtype_label(dtype) -> str:
    """"bfloat16" for torch.bfloat16."""
    return str(dtype).removeprefix("torch.")
