"""One measurement, as plain data: what ``python -m demo.bench``'s flags describe and what the app's
Benchmark tab builds for each configuration of its plan (demo/bench/plan.py). ``check`` refuses a
config that cannot run, in one sentence naming the flag; nothing here loads a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from demo.bench.faults import FAULT_SHORT, FAULTS, capture_label, check_fault
from demo.bench.report import shape_label
from demo.config import DEFAULT_DRAFT_SAMPLING, DRAFT_SAMPLING, DraftShape, GenerationConfig, TreeShape
from demo.kernels.runtime import DEFAULT_KERNELS, KERNELS
from demo.methods import (
    COMPILE_SCOPES,
    DEFAULT_METHOD,
    MAX_SPEC_TOKENS,
    METHOD_LABELS,
    METHODS,
    MODE_LABELS,
    MODES,
    REGISTRY,
    draft_depth,
)

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "questions.jsonl"
WARMUP_MAX_NEW_TOKENS = 16  # enough to capture and compile every step function; kept short for CPU runs
HOT_TOKENS = ("auto", "on", "off")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DRAFTER_DTYPES = ("auto", "target", "float32", "bfloat16", "int8", "int8-head")


SHAPE_FIELDS = ("num_spec_tokens", "tree_topk", "num_draft_tokens", "lookup")  # the CLI's shape flags


def device_type(device: str) -> str:
    """"cpu" or "cuda": the device --device names, auto resolved as build_engine's load_target resolves
    it (demo.models.loading.resolve_device: CUDA where there is one)."""
    if device != "auto":
        return device
    from demo.models.loading import resolve_device

    return resolve_device(device).type


def default_shape(method: str, device: str, temperature: float) -> dict:
    """The shape fields of the draft `method` offers first on the device `device` runs on at
    `temperature` (demo.methods.default_draft: the Chat tab's starting shape), with shape_default_on
    naming that device; {} for a method that drafts nothing (the target alone) or is not registered."""
    spec = REGISTRY.get(method)
    if spec is None or spec.proposer is None:
        return {}
    on = device_type(device)
    k, tree = spec.default_draft(on, temperature)
    return dict(num_spec_tokens=k, tree_topk=tree.topk if tree else None, num_draft_tokens=tree.size if tree else 0,
                lookup=tree.lookup if tree else 0, shape_default_on=on)


class BenchConfigError(ValueError):
    """A config that cannot run; the message is one sentence that names the flag."""


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Models, engine, generation and prompts of one measurement (the CLI's flags, by name)."""

    # models
    target: str = "default"  # 'default' (the embedded SmolLM2-135M-Instruct), a local directory or a hub id
    drafter: str | None = None  # None: the bundled drafter of `method` (default target only)
    hot_tokens: str = "auto"  # a shared-head EAGLE-3's hot_tokens.json: auto (on a CPU), on, off
    method: str = DEFAULT_METHOD
    num_spec_tokens: int = 3  # k: draft tokens per step, or a tree's depth
    tree_topk: int | None = None  # a tree: children per node (None: a chain)
    num_draft_tokens: int = 0  # a tree's tokens verified per step, the root included (0: every node)
    lookup: int = 0  # a tree's prompt-lookup branch: tokens verified beside the drafter's (TreeShape.lookup)
    # the device type ("cpu", "cuda") whose default draft the four fields above hold (default_shape: the CLI
    # given no shape flag); None: the shape was given
    shape_default_on: str | None = None
    draft_sampling: str = DEFAULT_DRAFT_SAMPLING  # at T > 0 (demo.config.DRAFT_SAMPLING)
    ceiling: bool = False  # draft with the target itself (q = p): each rule's acceptance with a perfect drafter
    # engine
    mode: str = "eager"
    compile: str | None = None  # None, "drafter" or "all" (cudagraph mode)
    kernels: str = DEFAULT_KERNELS  # what the target's forwards run on a GPU (demo/kernels/runtime.py)
    device: str = "auto"
    dtype: str = "auto"
    max_context: int = 2048
    drafter_dtype: str = "auto"
    # generation
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 256
    # prompts, run
    prompt: str | None = None  # one prompt text, instead of a file
    prompts: str | None = None  # MT-bench-format JSONL (None: DEFAULT_PROMPTS)
    num_prompts: int | None = None  # the first N questions
    all_turns: bool = False
    warmup: int = 1  # uncounted warm-up generations (capture and compilation happen here)
    check_lossless: bool = False  # also decode target-only and compare tokens (T = 0)
    # the capture lab (demo/bench/faults.py): None, the product's engine; a fault's name (or "none"),
    # the capture lab's (lab_engine), its steps captured (mode cudagraph) or replayed by the CPU stand-in (eager)
    fault: str | None = None
    check_parity: bool = False  # also decode eagerly and compare acceptance counts (demo/bench/parity.py)

    @property
    def k(self) -> int:
        """Drafts per step: num_spec_tokens with a drafter, 0 for the target alone."""
        return draft_depth(self.method, self.num_spec_tokens)

    @property
    def tree(self) -> TreeShape | None:
        return TreeShape(self.tree_topk, self.num_draft_tokens, self.lookup) if self.tree_topk else None

    @property
    def spec(self):
        """The method's registry entry (demo.methods.REGISTRY); check() refuses a method not in it."""
        return REGISTRY.get(self.method, REGISTRY["none"])

    @property
    def shape(self) -> DraftShape:
        """What each step drafts: a chain of k, a tree of depth k, or nothing."""
        return self.generation().draft_shape(self.k, self.spec.samples_drafts)

    @property
    def width(self) -> int:
        """Tokens the target verifies per step."""
        return self.shape.width

    @property
    def drafts_label(self) -> str:
        """"k=3" or "tree 7 × 8, 64" (depth × top-k, tokens verified per step); '' for target only."""
        return shape_label({"k": self.k, "shape": asdict(self.shape)}, short=True) if self.k else ""

    @property
    def label(self) -> str:
        """"EAGLE-3 k=3 · eager", "EAGLE-3 tree 7 × 8, 64 · eager": the configuration as a table row names it."""
        drafts = f" {self.drafts_label}" if self.k else ""
        if self.fault is not None:
            return f"{METHOD_LABELS[self.method]}{drafts} · {capture_label(self.mode)} · {FAULT_SHORT[self.fault]}"
        return f"{METHOD_LABELS[self.method]}{drafts} · {MODE_LABELS[self.mode]}"

    @property
    def captures(self) -> bool:
        """Whether its steps are captured (CUDA graphs, or the capture lab's stand-in)."""
        return self.mode == "cudagraph" or self.fault is not None

    def generation(self, speculate: bool = True, max_new_tokens: int | None = None) -> GenerationConfig:
        """The engine's settings; speculate=False: the same run with the target alone."""
        return GenerationConfig(max_new_tokens=max_new_tokens or self.max_new_tokens,
                                num_spec_tokens=self.k if speculate else 0, tree=self.tree,
                                draft_sampling=self.draft_sampling, temperature=self.temperature, top_p=self.top_p,
                                seed=self.seed)

    def drafter_spec(self) -> str | None:
        """The drafter to load: `drafter`, else the bundled one of `method` (None for a method that
        loads none, and for the ceiling, whose drafter is the target)."""
        if not self.spec.needs_drafter or self.ceiling:
            return None
        if self.drafter:
            return self.drafter
        from demo.models.presets import bundled_drafter_dir

        return str(bundled_drafter_dir(self.method))

    def check(self) -> "BenchConfig":
        """Refuse what cannot run (BenchConfigError, one sentence); returns the config."""
        for flag, value, allowed in (("--method", self.method, METHODS), ("--mode", self.mode, MODES),
                                     ("--kernels", self.kernels, KERNELS), ("--hot-tokens", self.hot_tokens, HOT_TOKENS),
                                     ("--draft-sampling", self.draft_sampling, DRAFT_SAMPLING),
                                     ("--device", self.device, DEVICES), ("--dtype", self.dtype, DTYPES),
                                     ("--drafter-dtype", self.drafter_dtype, DRAFTER_DTYPES)):
            if value not in allowed:
                raise BenchConfigError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
        if self.compile is not None and self.compile not in COMPILE_SCOPES:
            raise BenchConfigError(f"--compile must be one of {', '.join(COMPILE_SCOPES)}, not {self.compile!r}")
        self._check_drafts()
        self._check_run()
        return self

    def _check_drafts(self) -> None:
        spec = self.spec
        if spec.proposer is not None and not 1 <= self.num_spec_tokens <= MAX_SPEC_TOKENS:
            raise BenchConfigError(f"--num-spec-tokens must be in 1..{MAX_SPEC_TOKENS}, not {self.num_spec_tokens}")
        if not spec.needs_drafter and self.drafter:
            raise BenchConfigError(f"--drafter has no use with --method {self.method}, which loads none")
        if self.ceiling and (not spec.needs_drafter or self.drafter):
            raise BenchConfigError("--ceiling drafts with the target itself: it needs a drafter's --method and no "
                                   "--drafter")
        if spec.needs_drafter and self.drafter is None and self.target != "default" and not self.ceiling:
            raise BenchConfigError(f"--drafter is required for target {self.target!r}: the bundled drafters fit the "
                                   "default target only")
        if spec.proposer is None and (self.tree_topk or self.num_draft_tokens):
            raise BenchConfigError("--tree-topk and --num-draft-tokens shape the drafts: --method none has none")
        if self.tree_topk and spec.proposer is not None and not spec.trees:
            raise BenchConfigError(f"--method {self.method} drafts chains: leave out --tree-topk")
        if self.num_draft_tokens and not self.tree_topk:
            raise BenchConfigError("--num-draft-tokens sizes a tree: give --tree-topk too")
        if self.lookup and not self.tree_topk:
            raise BenchConfigError("--lookup hangs a branch on a tree: give --tree-topk too")
        if spec.proposer is not None:
            try:
                self.shape.check()
            except ValueError as e:
                raise BenchConfigError(str(e)) from None

    def _check_run(self) -> None:
        if self.compile and self.mode != "cudagraph":
            raise BenchConfigError("--compile compiles the captured step functions: use it with --mode cudagraph")
        if self.compile == "drafter" and self.spec.proposer is None:
            raise BenchConfigError("--compile compiles the drafter's steps, and --method none has none: use "
                                   "--compile all")
        if self.temperature < 0:
            raise BenchConfigError(f"--temperature must be >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise BenchConfigError(f"--top-p must be in (0, 1], not {self.top_p}")
        if self.check_lossless and self.temperature > 0:
            raise BenchConfigError("--check-lossless compares greedy decodes token for token: it needs --temperature "
                                   "0 (sampled outputs are lossless in distribution, not token for token)")
        for flag, value, least in (("--max-new-tokens", self.max_new_tokens, 1), ("--warmup", self.warmup, 0),
                                   ("--max-context", self.max_context, 2)):
            if value < least:
                raise BenchConfigError(f"{flag} must be at least {least}, not {value}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise BenchConfigError(f"--num-prompts must be at least 1, not {self.num_prompts}")
        self._check_capture()

    def _check_capture(self) -> None:
        if self.fault is not None:
            if self.fault not in FAULTS:
                raise BenchConfigError(f"--fault must be one of {', '.join(FAULTS)}, not {self.fault!r}")
            try:
                check_fault(self.fault, self.k, self.tree is not None)
            except ValueError as e:
                default = (f" (without shape flags the bench drafts the default on {self.shape_default_on}, "
                           f"{self.drafts_label}: give -k)" if self.shape_default_on else "")
                raise BenchConfigError(f"--fault: {e}{default}") from None
        if self.check_parity and not self.captures:
            raise BenchConfigError("--check-parity holds a captured run's acceptance counts to eager's: give "
                                   "--mode cudagraph or --fault")
        if self.check_parity and self.temperature > 0:
            raise BenchConfigError("--check-parity compares greedy runs count for count: it needs --temperature 0")
