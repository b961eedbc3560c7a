"""The speculative decoding engine: prefill, then one event per decoding step.

Each step is propose -> verify -> account:

1. propose (drafter): project the target's features, catch up on the tokens the last
   verification (or the prefill) emitted, paired with the target's features of the positions before
   them (token x[i+1] with feature h[i]); then either chain k-1 greedy single-token steps feeding
   back the drafter's own hidden state, or expand a tree of depth k (demo/tree.py), beside which a
   lookup branch may copy tokens from the text (demo/tree_lookup.py).
2. verify (target): one forward over [last token, drafts] (k+1 positions for a chain, the tree's
   nodes under a tree mask), then the acceptance rule of demo/sampling.py (chains) or
   demo/tree_verify.py (trees). Rejected positions stay in the caches and are overwritten later; a
   tree's accepted path is first moved next to the root.
3. account: one device-to-host read of the packed step result; demo/metrics.py counts it. In graph
   mode the next step is launched before this read (``Lane``), so the host's accounting and the
   event's consumer overlap the device's next step.

Every per-step tensor lives in a persistent buffer (``StepBuffers``, ``TreeBuffers``), so the same
step functions run eagerly or replay CUDA graphs captured before the first request: in graph mode a
whole decoding step (propose, verify and, at T = 0, the acceptance test) is one graph, and the
prefill one graph per prompt-length bucket (a GPU pads prompts to the next power of two in either
mode, so both compute the same and library plans are reused): graph mode changes nothing but time.
The engine works on token ids and knows nothing of tokenizers or user interfaces.
"""

from __future__ import annotations

import gc
import time
import types
import warnings
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator

import torch

from demo.config import LOOKUP_NGRAM, TREE_SCRATCH, DraftShape, GenerationConfig, SamplingParams
from demo.kernels.topk import row_topk
from demo.methods import COMPILE_SCOPES, DRAFT_SAMPLING, MAX_SPEC_TOKENS, MODES, dtype_label, mode_label
from demo.metrics import AcceptanceStats
from demo.sampling import CapturedSampling, Draws, ShownProbs, sampled_rule, target_probs, verify_greedy, verify_sampled
from demo.target import Target
from demo.tree import DraftTree, compact_path, draft_tree, tree_attention_mask, tree_seen_slots
from demo.tree_lookup import graft_branch, lookup_continuation
from demo.tree_verify import tree_pointmass_rule, tree_q_rule, tree_wor_rule, verify_tree_greedy


def target_only_width(shape: DraftShape, dtype: torch.dtype, rows_alike: bool = False) -> int:
    """The rows target-only decoding runs at to be the exact reference of a speculative run of
    `shape`: in fp32 one (every width rounds alike closely enough to keep greedy ties), in bf16 or fp16 the
    verification's width, unless the target computes every decoding row alike at any width (`rows_alike`,
    ``Target.rows_alike``): then one. A GPU's (and a CPU's) kernels compute a row the same whatever
    its index and the other rows, but not whatever the row count: a 1-row step and an 8-row
    verification round differently and flip greedy near-ties (in bf16 most replies of a few hundred
    tokens meet one). At the same width a chain's every token is computed as target-only computes it. A
    tree's are not quite: a node attends to its ancestors at scattered slots, so its sums run in
    another order. With demo.kernels.fused's kernels (a GPU's default) every width rounds a row alike and
    every decoding row attends in slot order (demo.kernels.attend): there the 1-row run is the reference,
    chains and trees."""
    return 1 if dtype == torch.float32 or rows_alike else shape.width


@dataclass
class StepEvent:
    """What one decoding step did. Step 0 is the prefill, which emits the target's first token."""

    step: int
    draft_ids: list[int]  # the drafts verified (target vocabulary): a chain's k, or a tree's nodes; []: none
    num_accepted: int  # drafts the target confirmed, along the accepted path
    token_ids: list[int]  # emitted: accepted drafts, then the target's own token (cut at stop/budget)
    token_probs: list[float]  # each emitted token's probability under the target's distribution
    resampled: bool  # T > 0 and the target's own token was drawn after a rejection
    draft_ms: float
    verify_ms: float  # prefill time at step 0
    stats: AcceptanceStats  # running totals after this step (a snapshot)
    finished: bool = False
    finish_reason: str | None = None  # "stop" (a stop token), "length" or "time" (gen.max_time_s)
    tree: DraftTree | None = None  # the step's drafts as a tree (a chain is a path), with q, p and the accepted path
    # what a step inspector shows: per emitted token, the target's TOP_SHOWN best (token, p) at its
    # position; per chain draft position, the drafter's (token, q) (trees: the tree's siblings are its candidates)
    target_top: list[list[tuple[int, float]]] = field(default_factory=list)
    draft_top: list[list[tuple[int, float]]] | None = None


PHASES = ("project", "catch_up", "draft", "verify", "accept")  # a step's, in order (Engine.step_phases)
TOP_SHOWN = 5  # candidates per position an event carries for inspection (the target's, a chain drafter's)
PREFILL_MIN_BUCKET = 64  # a GPU runs a prompt at the next power of two from this (at most the context)
ATTEND_ROUND = 64  # a CPU attends over the cache slots in use, rounded up to a multiple of this
ATTEND_MIN_BUCKET = 512  # a GPU attends over the next power of two from this (at most the context)


@dataclass
class StepBuffers:
    """Persistent tensors of one draft shape: every graph input and output lives here. A chain uses
    the verify_* and chain fields as they are; a tree (``tree`` set) stages its root in root_*,
    builds verify_* each step, and keeps the accepted path's features in catch_features."""

    shape: DraftShape
    verify_tokens: torch.Tensor  # [1, W] int64, W = shape.width: the target's last token, then the drafts
    verify_positions: torch.Tensor  # [1, W] int64
    # R = shape.reach: the drafter's depth D, plus a lookup branch's length (trees)
    catch_tokens: torch.Tensor  # [1, R+1] int64: tokens emitted by the last verification (padded)
    catch_positions: torch.Tensor  # [1, R+1] int64: the positions of the features they pair with
    catch_hidden: torch.Tensor  # [1, R+1, Hd] drafter input after project()
    catch_last: torch.Tensor  # [1] int64: index of the last emitted token (= accepted count)
    root_logits: torch.Tensor  # [1, 1, Vd] the drafter's logits at the last emitted token
    draft_hidden: torch.Tensor  # [1, 1, Hd] its hidden output there
    draft_position: torch.Tensor  # [1, 1] int64: the drafter position of the first draft's row
    result: torch.Tensor  # [packed_size(R, N)] float64: pack_result's layout (N: shape.verified)
    draws: Draws  # T > 0: the acceptance test's draws, made before the step: u [D] (a chain) or [N], noise [V]
    temperature: torch.Tensor  # [1] float32: the request's at T > 0 (a buffer: the graphs replay any)
    chain_logits: torch.Tensor | None = None  # [D, Vd]: a chain drafter's logits at each draft position
    prefill_ids: torch.Tensor | None = None  # [1, C] int64: the prompt, padded to its bucket (C: the context)
    prefill_positions: torch.Tensor | None = None  # [1, C] int64: 0..C-1
    prefill_last: torch.Tensor | None = None  # [1] int64: the prompt's last row
    catch_features: torch.Tensor | None = None  # [1, R+1, F] target features the catch-up projects (k > 0)
    lanes: dict = field(default_factory=dict)  # graph mode: attend bucket -> its two alternating steps [Lane]
    tree: "TreeBuffers | None" = None
    graphs: dict = field(default_factory=dict)  # name -> CapturedStep
    capture: "CaptureState | None" = None  # graph mode: what later captures of more buckets reuse

    @property
    def k(self) -> int:
        return self.shape.depth


@dataclass
class CaptureState:
    """What a shape's first capture sets up and its later ones (more attend buckets) reuse."""

    pool: object  # the shape's CUDA graph memory pool
    accept: Callable  # the (compiled) greedy acceptance test
    accept_sampled: Callable  # the acceptance test at T > 0, top-p 1 (CapturedSampling), on b.draws
    initial: list  # the state prepare() made (_state_tensors), which every capture starts from
    sampled: bool = False  # a generation at T > 0 asked for accept_sampled: every lane has it
    sampled_uncompiled: bool = False  # accept_sampled failed to compile and runs as eager runs it


@dataclass
class Lane:
    """One of a shape's two captured copies of the step (graph mode). Steps alternate between them so
    that step s + 1 is launched before the host reads step s: the host's work between two steps
    (reading the result, accounting, the consumer of the event) overlaps the device's next step
    instead of leaving the device idle. Each copy records its own timing events, so reading step s's
    times is not disturbed by step s + 1 recording its own."""

    graphs: dict  # "step" (greedy, acceptance included) and/or "step_sampled" and "accept_sampled" -> CapturedStep
    marks: tuple  # (start, after propose): recorded inside this lane's graphs
    end: "torch.cuda.Event"  # after the step (and, at T > 0, its acceptance test)
    copied: "torch.cuda.Event"  # after the packed result reached `host`
    host: torch.Tensor  # pinned host copy of StepBuffers.result


@dataclass
class TreeBuffers:
    """A tree step's own persistent tensors (N draft nodes, a lookup branch's included; W = N + 1 verified)."""

    root_token: torch.Tensor  # [1] int64: the last emitted token, the tree's root
    root_slot: torch.Tensor  # [1] int64: its position, and the slot where the tree starts
    verify_slots: torch.Tensor  # [1, W] int64: root_slot + node index
    verify_mask: torch.Tensor  # [1, 1, W, S] bool (tree_attention_mask), or int32 in slot order (Target.ordered_masks)
    parents: torch.Tensor  # [W] int64
    depths: torch.Tensor  # [W] int64
    draft_logq: torch.Tensor  # [W] float32: log q of each node's token at its parent
    q_row: torch.Tensor  # [W] int64: the row of q each node was drawn from (sampled drafts)
    q: torch.Tensor | None  # [R, V] float32: the drafter's q over the target vocabulary (sampled drafts)
    uniforms: torch.Tensor | None  # the draws of sampled drafts, made before the step: [D, K*K] float32 (i.i.d.), [D, K, Vd] (wor)
    draft_to_target: torch.Tensor | None  # [Vd] int64: target id of every draft id; None: the same ids
    # [C + R + 2] int64: the prompt and every emitted token, by position (C: the context), which a lookup
    # branch copies from; None: no branch. Written by the prefill and each acceptance test, past the
    # accepted tokens too: a position's entry is final once the text reaches it.
    history: torch.Tensor | None = None


def prefill_rows(n: int, max_context: int) -> int:
    """The bucket of a prompt of n tokens: the next power of two from PREFILL_MIN_BUCKET, at most the
    context. A GPU runs every prompt so, in eager mode as in graph mode (so both compute the same),
    and each bucket's graph and library plans are made once."""
    return min(max(PREFILL_MIN_BUCKET, 1 << (n - 1).bit_length()), max_context)


def compile_step(fn: Callable[[], object]):
    """torch.compile a step function before capture: static shapes, one graph, and eager's rounding
    points kept (inductor's emulate_precision_casts rounds fused intermediates to the tensor dtype
    where eager would), so that compiling changes time, not tokens. Without it, fused bf16 norms keep
    fp32 intermediates and flip argmax near-ties: the tokens move, and acceptance with them.

    Each call compiles a function with a code object of its own. Dynamo keys compiled code, and its
    recompile limit (8), on the code object, and every engine's steps are closures of the same few
    lambdas: with a shared one, the ninth capture in one process (engines, depths, drafter swaps)
    fails outright under fullgraph. Its own code object also frees the compiled code with the step."""
    return torch.compile(_own_code(fn), fullgraph=True, dynamic=False, options={"emulate_precision_casts": True})


def _own_code(fn: Callable[[], object]) -> Callable[[], object]:
    """The same function (globals, closure, defaults) over a fresh copy of its code object."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"compile_step takes a plain function or lambda, not {type(fn).__name__}")
    clone = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    return clone


def _state_tensors(b: StepBuffers) -> list[torch.Tensor]:
    """Every persistent tensor of a shape's step (its own and its tree's)."""
    parts = [b] + ([b.tree] if b.tree is not None else [])
    return [t for part in parts for f in fields(part) if isinstance(t := getattr(part, f.name), torch.Tensor)]


class CapturedStep:
    """A step function over persistent buffers, captured once as a CUDA graph and replayed."""

    def __init__(self, fn: Callable[[], object], pool, warmup: int = 2):
        # the first run is on the current stream, as eager mode's first run is, so that the
        # libraries' per-shape choices (cuBLAS heuristics, SDPA backend) are made as eager makes
        # them; the rest on a side stream, as PyTorch advises before a capture. Either also
        # triggers torch.compile before the capture.
        fn()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup - 1):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # no garbage collection while capturing (as SGLang's capture freezes it): a collection there
        # frees what an earlier engine left in reference cycles, its graphs and pinned buffers, and
        # such CUDA calls are not allowed during a capture ("operation failed due to a previous error
        # during capture")
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                self.output = fn()
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize()
        self.replays = 0  # launches since capture: proof that generation ran the graph

    def __call__(self):
        self.graph.replay()
        self.replays += 1
        return self.output


class Engine:
    """Target plus optional drafter, run eagerly or from CUDA graphs captured before generation."""

    def __init__(self, target: Target, drafter=None, *, mode: str = "eager", compile: bool | str = False,
                 max_context: int = 2048, drafter_dtype: torch.dtype | None = None, drafter_int8: bool | str = False):
        """compile: False; "drafter" or True (the drafter's captured steps, as in the vLLM change
        this project comes from, and the greedy acceptance test, which takes argmaxes and moves
        state, exact compiled or not: the target's forward keeps eager's numerics, so the output
        stays eager's token for token and only drafting time can move); or "all" (every captured
        step, the target's forward too: fastest, but the target's rounding changes, so the text may
        move at near-ties).

        drafter_dtype: what the drafter computes in; None: the target's. Drafts never change the
        output, only how many are accepted (``demo.drafter_common.drafter_dtype`` picks bf16 beside
        an fp32 target on a CPU that multiplies bf16 natively). drafter_int8: on a CPU, the drafter's
        own head and its decoder layer's projections multiply through int8 copies
        (``DrafterBase.use_int8``; ``demo.drafter_common.drafter_int8`` says where that is the
        quicker); "head": the head alone (what the bench compares against)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        compile = "drafter" if compile is True else compile
        if compile and compile not in COMPILE_SCOPES:
            raise ValueError(f"compile must be False, True or one of {COMPILE_SCOPES}, not {compile!r}")
        if mode == "cudagraph" and target.device.type != "cuda":
            raise ValueError("cudagraph mode needs a CUDA device; this engine runs on "
                             f"{target.device.type} (use mode='eager')")
        self.target = target
        self.drafter_dtype = drafter_dtype or target.dtype
        self.drafter_int8 = drafter_int8 if drafter_int8 in (True, "head") and target.device.type == "cpu" else False
        self.mode = mode
        self.compile = compile
        self.max_context = min(max_context, target.config.max_position_embeddings)
        # every prompt runs padded to its bucket (prefill_bucket), in eager mode as in graph mode
        self.pad_prefill = True
        self.eos_token_ids = target.eos_token_ids
        self._buffers: dict[DraftShape, StepBuffers] = {}
        self.capture_s = 0.0  # time spent capturing (and compiling) graphs, reported separately
        self.target.setup_cache(self.max_context)
        self.drafter = None
        self.aux_layers: tuple[int, ...] = ()  # target feature layers the drafter reads (EAGLE-3)
        self.set_drafter(drafter)

    # ------------------------------------------------------------------ setup
    @property
    def method(self) -> str:
        return "none" if self.drafter is None else self.drafter.cfg.method

    def _features_of(self, k: int) -> tuple[int, ...] | None:
        """Which target features a step of depth k needs: aux layer ids, () for the final hidden,
        None for none (target-only)."""
        if k == 0:
            return None
        return self.aux_layers if self.drafter.feature == "aux" else ()

    @property
    def device(self) -> torch.device:
        return self.target.device

    def set_drafter(self, drafter) -> None:
        """Swap the drafter (or None for target-only) without reloading the target."""
        aux = ()
        if drafter is not None and drafter.feature == "aux":
            aux = tuple(drafter.cfg.aux_layer_ids or self.target.config.default_aux_layers())
            self.target.check_aux_layers(aux)
        self.drafter, self.aux_layers = drafter, aux
        self._buffers = {s: b for s, b in self._buffers.items() if s.depth == 0}  # drafter graphs are stale
        if drafter is None:
            return
        drafter.to(device=self.target.device, dtype=self.drafter_dtype).eval().requires_grad_(False)
        drafter.share_target(self.target)  # after the move: a head borrowed in another dtype is copied
        if hasattr(drafter, "use_int8"):  # a drafter without weights of its own (an oracle) has none to quantize
            drafter.use_int8(bool(self.drafter_int8), layer=self.drafter_int8 is True)
        # the context, then scratch slots for the rows of a tree's frontier nodes (demo/tree.py)
        drafter.setup_cache(self.max_context + TREE_SCRATCH)

    def describe(self) -> dict:
        return {"method": self.method, "mode": mode_label(self.mode, self.compile),
                "device": str(self.device), "dtype": dtype_label(self.target.dtype), "max_context": self.max_context}

    @torch.inference_mode()
    def prepare(self, shape: DraftShape | int, used: int | None = None, sampled: bool = False) -> StepBuffers:
        """Allocate the persistent buffers for a draft shape (an int k: a chain of k) and, in
        cudagraph mode, capture its steps now, never in the middle of a generation: over every
        attend bucket up to the one `used` slots need (a generation's reach), None: all of them;
        with `sampled` (a generation at T > 0; always for drafts drawn from q) the acceptance test
        at T > 0 too, from then on with every bucket. Always in inference mode, as generate() is:
        buffers a generation allocated are inference tensors, which a later capture outside
        inference mode could not restore in place. A capture runs steps over the target's cache, so it
        holds the cache as a generation does (CacheInUse while one is open)."""
        with self.target.hold_cache(self):
            return self._prepare(shape, used, sampled)

    def _prepare(self, shape: DraftShape | int, used: int | None, sampled: bool) -> StepBuffers:
        shape = DraftShape.of(shape, None, False) if isinstance(shape, int) else shape
        b = self._buffers.get(shape) or self._allocate(shape)
        if self.mode == "cudagraph":
            reach = self.max_context if used is None else self.attended(used)
            # a step attends over at least one prompt token, the token before it and its own rows:
            # a smaller bucket is never chosen, and its capture would write past its cache views
            least = shape.width + 2
            missing = [a for a in self.attend_buckets() if least <= a <= reach and a not in b.lanes]
            start = time.perf_counter()
            if missing:
                self._capture(b, missing)
            if (sampled or shape.sampled) and b.capture is not None and not b.capture.sampled:
                b.capture.sampled = True
                for attend, lanes in b.lanes.items():
                    for i, lane in enumerate(lanes):
                        self._capture_accept_sampled(b, lane.graphs, attend, i)
                self._restore(b)
            self.capture_s += time.perf_counter() - start
        return b

    def _allocate(self, shape: DraftShape) -> StepBuffers:
        """The persistent buffers of a draft shape, in the state every step function starts from."""
        shape.check()
        dev, t, k, reach = self.device, self.target, shape.depth, shape.reach
        hd = self.drafter.cfg.hidden_size if k else 1
        vd = self.drafter.drafting_vocab if k else 1
        zeros = lambda *s, dtype=torch.int64: torch.zeros(*s, dtype=dtype, device=dev)  # noqa: E731
        b = StepBuffers(
            shape=shape,
            verify_tokens=zeros(1, shape.width),
            verify_positions=torch.arange(shape.width, device=dev).view(1, -1),
            catch_tokens=zeros(1, reach + 1),
            catch_positions=torch.arange(reach + 1, device=dev).view(1, -1),
            catch_hidden=zeros(1, reach + 1, hd, dtype=self.drafter_dtype),
            catch_last=zeros(1),
            root_logits=zeros(1, 1, vd, dtype=t.dtype),
            draft_hidden=zeros(1, 1, hd, dtype=self.drafter_dtype),
            draft_position=zeros(1, 1),
            result=zeros(packed_size(reach, shape.verified), dtype=torch.float64),
            # noise of ones: a capture's runs over them divide by it
            draws=Draws(zeros(shape.width - 1 if shape.tree else k, dtype=torch.float32),
                        torch.ones(t.config.vocab_size, device=dev)),
            temperature=torch.ones(1, device=dev),
            chain_logits=zeros(max(k, 1), vd, dtype=t.dtype),
            prefill_ids=zeros(1, self.max_context),
            prefill_positions=torch.arange(self.max_context, device=dev).view(1, -1),
            prefill_last=zeros(1),
        )
        if k:  # written by copy, never rebound: a replayed graph and an eager step must share it
            width = t.config.hidden_size * (len(self.aux_layers) if self.drafter.feature == "aux" else 1)
            b.catch_features = zeros(1, reach + 1, width, dtype=t.dtype)
        if shape.tree:
            w, r = shape.width, 1 + (k - 1) * shape.topk
            to_target = self.drafter.to_target(torch.arange(vd, device=dev))  # [Vd]
            same_ids = vd == t.config.vocab_size and bool((to_target == torch.arange(vd, device=dev)).all())
            b.tree = TreeBuffers(
                root_token=zeros(1), root_slot=zeros(1), verify_slots=torch.arange(w, device=dev).view(1, -1),
                verify_mask=zeros(1, 1, w, t.cache.capacity, dtype=torch.int32 if t.ordered_masks(w) else torch.bool),
                parents=zeros(w), depths=zeros(w),
                draft_logq=zeros(w, dtype=torch.float32), q_row=zeros(w),
                q=zeros(r, t.config.vocab_size, dtype=torch.float32) if shape.sampled else None,
                uniforms=(zeros(*((k, shape.topk, vd) if shape.without_replacement else (k, shape.topk ** 2)),
                                dtype=torch.float32) if shape.sampled else None),
                draft_to_target=None if same_ids else to_target,
                history=zeros(self.max_context + reach + 2) if shape.lookup else None)
        self._buffers[shape] = b
        return b

    def prefill_bucket(self, n: int) -> int:
        """The rows a prompt of n tokens runs at (n itself unless pad_prefill): on a GPU its
        ``prefill_rows`` (a graph each); on a CPU the next multiple of ATTEND_ROUND. A CPU's libraries
        keep what they make for each new shape (oneDNN a primitive per row count), so an app that ran
        every prompt at its own length grew its memory with each new length (23 MB over 80 prompts of
        the bundled set); rounded, a 2,048-token context has 32 prompt shapes, for at most 63 padding rows."""
        if not self.pad_prefill:
            return n
        if self.device.type == "cpu":
            return min(-(-n // ATTEND_ROUND) * ATTEND_ROUND, self.max_context)
        return prefill_rows(n, self.max_context)

    def prefill_buckets(self) -> list[int]:
        """Every bucket a prompt can fall in on a GPU (one prefill graph each)."""
        sizes, b = [], PREFILL_MIN_BUCKET
        while b < self.max_context:
            sizes.append(b)
            b *= 2
        return sizes + [self.max_context]

    def _capture(self, b: StepBuffers, buckets: list[int]) -> None:
        """Capture one graph per decoding step and attend bucket (propose, verify and, at T = 0, the
        acceptance test; at T > 0 "step_sampled", and once a sampled generation asked for it
        "accept_sampled" over its output, on the draws made before the step) and, the first time,
        one prefill graph per prompt bucket. Two timing events recorded inside the step graph split
        its time into propose and verify."""
        first = b.capture is None
        if first:
            # one memory pool per shape, alive exactly as long as its graphs: capturing into a pool
            # whose graphs were all released (a drafter swap drops them) trips the CUDA caching
            # allocator's assert
            self.target.stack_weights()  # compiled code reads the stacks made before it (demo.layers.stacked)
            if self.drafter is not None:
                self.drafter.stack_weights()
            accept_fn = self._acceptance(b)
            # a capture runs its step three times, and each run moves the positions on: every capture
            # starts from the state prepare() made, or a small bucket's warm-ups would write past its slots
            b.capture = CaptureState(
                torch.cuda.graph_pool_handle(),
                self._maybe_compile(lambda logits, features: accept_fn(b, logits, features, SamplingParams()), "accept"),
                self._maybe_compile(self._sampled_acceptance(b), "accept"),
                [t.clone() for t in _state_tensors(b)])
        accept = b.capture.accept
        captured = lambda fn: self._captured(b, fn)  # noqa: E731
        for attend in buckets:  # the step over each bucket of attended slots
            propose = self._maybe_compile(lambda a=attend: self._propose(b, a), "propose") if b.k else None
            verify = self._maybe_compile(lambda a=attend: self._verify_forward(b, a), "verify")

            def step(greedy: bool, marks: tuple, propose=propose, verify=verify):
                marks[0].record()
                if propose is not None:
                    propose()
                marks[1].record()
                logits, features = verify()
                if greedy:
                    accept(logits, features)
                return logits, features

            lanes = []  # the bucket's entry appears once both lanes are captured, never half made
            for i in range(2):  # two lanes (Lane): the same compiled functions, captured twice
                marks = tuple(torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
                graphs = {}
                if not b.shape.sampled:  # drafts sampled from q exist only at T > 0
                    graphs["step"] = captured(lambda marks=marks, step=step: step(True, marks))
                graphs["step_sampled"] = captured(lambda marks=marks, step=step: step(False, marks))
                b.graphs.update({self._graph_name(name, attend, i): g for name, g in graphs.items()})
                if b.capture.sampled:
                    self._capture_accept_sampled(b, graphs, attend, i)
                lanes.append(Lane(graphs, marks, torch.cuda.Event(enable_timing=True), torch.cuda.Event(),
                                  torch.empty(b.result.shape, dtype=b.result.dtype, pin_memory=b.result.is_cuda)))
            b.lanes[attend] = lanes
        if first:
            for size in self.prefill_buckets():
                b.graphs[f"prefill{size}"] = captured(
                    lambda size=size: self._prefill_forward(b, size, self.attended(size)))
        self._restore(b)

    def _graph_name(self, name: str, attend: int, lane: int) -> str:
        """A step graph's name in StepBuffers.graphs: "step", "step@512", "step_sampled@1024.1", ..."""
        return name + ("" if attend == self.max_context else f"@{attend}") + ("" if lane == 0 else f".{lane}")

    @staticmethod
    def _restore(b: StepBuffers) -> None:
        """b's state as prepare() made it, which every capture starts from (a capture runs its step
        three times, each moving the positions on)."""
        for t, f in zip(_state_tensors(b), b.capture.initial):
            t.copy_(f)

    def _captured(self, b: StepBuffers, fn) -> CapturedStep:
        self._restore(b)
        return CapturedStep(fn, b.capture.pool)

    def _capture_accept_sampled(self, b: StepBuffers, graphs: dict, attend: int, lane: int) -> None:
        """A lane's "accept_sampled": the T > 0 acceptance test over the lane's verification, which
        its step graph leaves in its outputs. Compiled with the drafter's steps, and captured
        uncompiled (with a warning) should inductor fail on the rules' unrolled loops."""
        accept = lambda stepped=graphs["step_sampled"]: b.capture.accept_sampled(*stepped.output)  # noqa: E731
        try:
            graphs["accept_sampled"] = self._captured(b, accept)
        except Exception as e:  # noqa: BLE001  (torch.compile's failures have no common type)
            if not self.compiles("accept") or b.capture.sampled_uncompiled:
                raise
            warnings.warn(f"the T > 0 acceptance test did not compile; captured uncompiled: {e}")
            b.capture.accept_sampled, b.capture.sampled_uncompiled = self._sampled_acceptance(b), True
            graphs["accept_sampled"] = self._captured(b, accept)
        b.graphs[self._graph_name("accept_sampled", attend, lane)] = graphs["accept_sampled"]

    def compiles(self, phase: str) -> bool:
        """Whether captured steps run `phase` ("propose", "verify" or "accept") compiled: compile
        "drafter" all but the target's forward (verify), "all" every phase of a step. (Eagerly, a
        64-node tree's acceptance test launches 120 kernels, a chain of 7's 67.)"""
        return self.compile == "all" or (self.compile == "drafter" and phase != "verify")

    def _maybe_compile(self, fn, name: str):
        return compile_step(fn) if self.compiles(name) else fn

    # ------------------------------------------------------------------ step functions
    # These read and write only persistent buffers and caches, and never sync with the host.
    def _verify_forward(self, b: StepBuffers, attend: int | None = None):
        """Target forward over [last token, drafts]; returns (logits [1,W,V], features [1,W,F]).
        attend: the cache slots to attend over (``attended``), None: all."""
        feats = self._features_of(b.k)
        tree = b.tree
        out = self.target.forward(b.verify_tokens, b.verify_positions, aux_layers=feats or (),
                                  slots=tree.verify_slots if tree else None, mask=tree.verify_mask if tree else None,
                                  attend=attend)
        return out.logits, (out.aux if feats else out.hidden)

    def attended(self, used: int) -> int:
        """The cache slots a forward attends over, given `used` (every slot its queries may see or
        write): on a CPU those, rounded up to ATTEND_ROUND (attending over the whole cache cost a
        1-token forward of the default target on 2 cores about as much as its weights at a 2,048-token
        context); in graph mode the smallest of ``attend_buckets`` that holds them (one captured step
        each), and so on a GPU in eager mode too, so that eager computes what graph mode replays, bit
        for bit. A draft tree's drafter rows go to scratch slots just past them (``_draft_tree``)."""
        capacity = self.target.cache.capacity
        if self.device.type == "cpu" and self.mode != "cudagraph":
            return min(capacity, -(-used // ATTEND_ROUND) * ATTEND_ROUND)
        return next((a for a in self.attend_buckets() if a >= used), capacity)

    def attend_buckets(self) -> list[int]:
        """A GPU's attended-slot buckets: powers of two from ATTEND_MIN_BUCKET, then the context.
        The attention of a 1- to 97-row forward over a static cache costs about as much per slot
        as it has slots, masked or not; a bench reply uses a few hundred of 2,048."""
        sizes, a = [], ATTEND_MIN_BUCKET
        while a < self.max_context:
            sizes.append(a)
            a *= 2
        return sizes + [self.max_context]

    def _propose(self, b: StepBuffers, attend: int | None = None):
        """The drafter's part of a step: project the features the last verification (or the prefill)
        staged, catch up on its emitted tokens, then draft the chain or tree. attend: as the target's
        (``attended``), None: the whole context."""
        b.catch_hidden.copy_(self.drafter.project(b.catch_features))
        self._catch_up(b, attend)
        if b.tree is not None:
            self._draft_tree(b, attend)
        else:
            self._chain(b, attend)

    def _catch_up(self, b: StepBuffers, attend: int | None = None):
        """Drafter pass over the R+1 slots of the last verification's emitted tokens; keeps the row
        of the last emitted token as the start of the next draft. Rows after it write stale K/V that
        later steps overwrite before any query can see them."""
        logits, hidden = self.drafter.forward(b.catch_tokens, b.catch_positions, b.catch_hidden, attend=attend)
        last = b.catch_last
        b.root_logits.copy_(logits.index_select(1, last))  # [1, 1, Vd]
        b.draft_hidden.copy_(hidden.index_select(1, last))  # [1, 1, Hd]
        b.draft_position.copy_(b.catch_positions.index_select(1, last) + 1)  # [1, 1]

    def _chain(self, b: StepBuffers, attend: int | None = None):
        """k greedy drafts from the root's logits, k-1 single-token drafter steps; drafts go to
        verify_tokens[1:]."""
        token = self.drafter.select(b.root_logits)  # [1, 1]
        hidden, position = b.draft_hidden, b.draft_position
        b.verify_tokens[:, 1:2].copy_(token)
        b.chain_logits[0].copy_(b.root_logits.view(-1))  # kept for the event's candidates (one copy a draft)
        for j in range(1, b.k):
            logits, hidden = self.drafter.forward(token, position, hidden, attend=attend)
            token = self.drafter.select(logits)  # [1, 1]
            position = position + 1
            b.verify_tokens[:, j + 1:j + 2].copy_(token)
            b.chain_logits[j].copy_(logits.view(-1))

    def _draft_tree(self, b: StepBuffers, attend: int | None = None):
        """Expand and prune the step's tree (demo/tree.py), hang a lookup branch on it (if the shape has
        one); stage its tokens, positions, slots and mask. The frontier's drafter rows go to scratch
        slots right after the `attend` ones (the context's without it), which no committed row reaches
        before a catch-up rewrites it."""
        tb, shape = b.tree, b.shape
        scratch = self.max_context if attend is None else attend
        draft = draft_tree(self.drafter, shape, tb.root_token, b.root_logits.view(-1), b.draft_hidden.view(-1),
                           b.draft_position.view(()), scratch, tb.uniforms, b.temperature)
        tokens, parents, depths, logq, q_row = draft.tokens, draft.parents, draft.depths, draft.draft_logq, draft.q_row
        if shape.lookup:  # what followed the text's last tokens where they last appeared, past the drafter's reach
            branch, _ = lookup_continuation(tb.history, tb.root_slot.view(()) + 1, shape.reach, LOOKUP_NGRAM)  # [R]
            tokens, parents, depths = graft_branch(tokens, parents, depths, branch, shape.depth, shape.lookup)
            # copied, not drafted: no q of the drafter's (the event's tree says which nodes: DraftTree.copied)
            logq = torch.cat((logq, logq.new_full((shape.lookup,), float("-inf"))))
            q_row = torch.cat((q_row, q_row.new_zeros(shape.lookup)))
        b.verify_tokens.copy_(tokens.view(1, -1))
        b.verify_positions.copy_((tb.root_slot + depths).view(1, -1))
        tb.verify_slots.copy_((tb.root_slot + torch.arange(shape.width, device=self.device)).view(1, -1))
        S = self.target.cache.capacity if attend is None else attend  # the slots the verification attends over
        if tb.verify_mask.dtype == torch.int32:  # in slot order here, with the drafting (compiled), not in the forward
            mask = tree_seen_slots(parents, depths, shape.reach, tb.root_slot.view(()), S)
        else:
            mask = tree_attention_mask(parents, shape.reach, tb.root_slot.view(()), S)  # [1, 1, W, S] bool
        tb.verify_mask[..., :S].copy_(mask)
        tb.parents.copy_(parents)
        tb.depths.copy_(depths)
        tb.draft_logq.copy_(logq)
        tb.q_row.copy_(q_row)
        if tb.q is not None and tb.draft_to_target is None:  # the drafter's q over the target vocabulary,
            tb.q.copy_(draft.q)  # for the acceptance test (drafting over the target's own ids)
        elif tb.q is not None:  # a draft vocabulary of its own, or hot tokens: 0 for the target ids it lacks
            tb.q.zero_().index_copy_(1, tb.draft_to_target, draft.q)

    def step_phases(self, b: StepBuffers, params: SamplingParams = SamplingParams(), generator=None) -> dict:
        """A decoding step of b's shape as its phases, in step order: name (PHASES) -> a function over
        b's persistent buffers, run as the step runs it, eagerly (what demo/bench/perf.py times one by
        one). "accept" reads the last "verify"'s output and moves the state on by one step."""
        attend = self.attended(self.last_slot(b) + 1)
        fns = {}
        if b.k:
            fns["project"] = lambda: b.catch_hidden.copy_(self.drafter.project(b.catch_features))
            fns["catch_up"] = lambda: self._catch_up(b, attend)
            fns["draft"] = (lambda: self._draft_tree(b, attend)) if b.tree is not None else (lambda: self._chain(b, attend))
        verified = []  # the last verification's (logits, features), which the acceptance test reads

        def verify():
            verified[:] = [self._verify_forward(b, attend)]
        fns["verify"] = verify
        accept = self._acceptance(b)

        def accept_step():
            if not params.greedy:
                b.draws.draw_(generator)
            accept(b, *verified[-1], params)
        fns["accept"] = accept_step
        return fns

    @staticmethod
    def last_slot(b: StepBuffers) -> int:
        """The last cache slot b's next verification writes (a host read: for measurement only). A
        tree's slots are staged by its drafting, so they are read off the next root."""
        if b.tree is not None:
            return int(b.tree.root_slot) + b.shape.width - 1
        return int(b.verify_positions.max())

    def _acceptance(self, b: StepBuffers):
        """The acceptance test of b's shape: a tree's or a chain's."""
        return self._accept_tree if b.tree is not None else self._accept

    def _sampled_acceptance(self, b: StepBuffers) -> Callable:
        """b's acceptance test at T > 0 as a graph runs it: (logits, features), the temperature read
        from b.temperature, the draws from b.draws (top-p 1)."""
        accept = self._acceptance(b)
        return lambda logits, features: accept(b, logits, features, CapturedSampling(b.temperature))

    def _accept(self, b: StepBuffers, logits: torch.Tensor, features: torch.Tensor, params: SamplingParams):
        """Chain acceptance test on the device; stages the next step's inputs and the packed result."""
        k = b.k
        logits = logits[:, : k + 1]  # [1, k+1, V]: a padded target-only step's padding rows are dropped
        drafts = b.verify_tokens[0, 1 : k + 1]  # [k]
        shown = ShownProbs(logits[0], params)  # [k+1, V]
        if params.greedy:
            n, tokens = verify_greedy(drafts, logits[0])
        else:
            n, tokens = sampled_rule(drafts, shown.probs, b.draws.u, b.draws.noise)
        positions = torch.arange(k + 1, device=drafts.device)  # [k+1]
        token_probs = shown.at(positions, tokens)  # [k+1]
        draft_p = shown.at(positions[:k], drafts)  # [k] p of each draft at its position
        # the drafter next pairs these tokens with this verification's features, at its positions
        b.catch_tokens[0].copy_(tokens)
        b.catch_positions.copy_(b.verify_positions[:, : k + 1])
        b.catch_last.copy_(n.view(1))
        if k:
            b.catch_features.copy_(features)
        # the next verification starts from the target's own token, one past the last emitted
        b.verify_tokens[:, :1].copy_(tokens.index_select(0, n.view(1)).view(1, 1))
        b.verify_positions.add_(n + 1)
        chain = torch.arange(k, device=drafts.device)  # [k] node i+1's parent is node i
        top_values, top_ids = shown.top(positions, TOP_SHOWN)  # [k+1, TOP_SHOWN] at each emitted position
        if k:  # the drafter's candidates at every draft position, in one softmax and one top-k
            q = torch.softmax(b.chain_logits.float(), dim=-1)  # [k, Vd]
            draft_q = q.gather(1, b.chain_logits.argmax(-1, keepdim=True)).view(-1)  # [k] q of each draft
            q_values, q_top = row_topk(q, TOP_SHOWN)
            q_ids = self.drafter.to_target(q_top)  # [k, TOP_SHOWN]
        else:  # target only: no drafts
            draft_q, q_ids, q_values = draft_p, tokens.new_zeros(0, TOP_SHOWN), draft_p.new_zeros(0, TOP_SHOWN)
        b.result.copy_(pack_result(n, tokens, token_probs, chain + 1, drafts, chain, draft_q, draft_p,
                                   top_ids, top_values, q_ids, q_values))

    def _accept_tree(self, b: StepBuffers, logits: torch.Tensor, features: torch.Tensor, params: SamplingParams):
        """Tree acceptance test on the device; moves the accepted path's target K/V next to the root,
        stages the catch-up over the path and the next root, and packs the result. D: the most a step
        accepts (a lookup branch reaches past the drafter's depth)."""
        tb, shape, D = b.tree, b.shape, b.shape.reach
        tokens = b.verify_tokens[0]  # [W]
        shown = ShownProbs(logits[0], params)  # [W, V]
        if params.greedy:
            n, path, out = verify_tree_greedy(tokens, tb.parents, tb.depths, logits[0], D)
        elif shape.sampled:
            rule = tree_wor_rule if shape.without_replacement else tree_q_rule
            n, path, out = rule(tokens, tb.parents, tb.depths, shown.probs, tb.q, tb.q_row, D, b.draws.u,
                                b.draws.noise, max_children=shape.topk)
        else:
            n, path, out = tree_pointmass_rule(tokens, tb.parents, tb.depths, shown.probs, D, b.draws.u, b.draws.noise)
        rows = torch.cat((path.new_zeros(1), path))  # [D+1] the root, then the path's nodes
        token_probs = shown.at(rows, out)  # [D+1] each emitted token under the target at its parent
        root = tb.root_slot.view(())
        compact_path(self.target.cache, root, path)
        b.catch_tokens[0].copy_(out)
        b.catch_positions.copy_((root + torch.arange(D + 1, device=self.device)).view(1, -1))
        b.catch_last.copy_(n.view(1))
        b.catch_features.copy_(features.index_select(1, rows))  # [1, D+1, F]
        if tb.history is not None:  # the emitted tokens at their positions (those past n are rewritten later)
            tb.history.index_copy_(0, root + 1 + torch.arange(D + 1, device=self.device), out)
        tb.root_token.copy_(out.index_select(0, n.view(1)))
        tb.root_slot.add_(n + 1)
        nodes = tokens[1:]  # [N]
        node_p = shown.at(tb.parents[1:], nodes)  # [N] p of each node's token at its parent
        top_values, top_ids = shown.top(rows, TOP_SHOWN)  # [D+1, TOP_SHOWN] at each emitted position
        if shape.sampled and shape.topk == 1:  # a sampled chain: node d was drawn from q row d - 1 (over the
            # target's vocabulary), whose likeliest tokens are the drafter's other candidates there
            q_values, q_ids = row_topk(tb.q.index_select(0, tb.q_row[1:]), TOP_SHOWN)  # [D, TOP_SHOWN]
        else:  # a tree's candidates are its siblings
            q_ids = q_values = torch.full((D, TOP_SHOWN), -1.0, device=self.device)
        b.result.copy_(pack_result(n, out, token_probs, path, nodes, tb.parents[1:], tb.draft_logq[1:].exp(), node_p,
                                   top_ids, top_values, q_ids, q_values))

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], gen: GenerationConfig) -> Iterator[StepEvent]:
        """Yield one StepEvent per decoding step (step 0: prefill). Engine time excludes the time
        the consumer spends between events; in graph mode the device runs the next step meanwhile,
        so a step counts at least its own device time however long the consumer held it."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if gen.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if gen.draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"draft_sampling must be one of {DRAFT_SAMPLING}, not {gen.draft_sampling!r}")
        k = gen.num_spec_tokens if self.drafter is not None else 0
        if not 0 <= k <= MAX_SPEC_TOKENS:
            raise ValueError(f"num_spec_tokens must be in 0..{MAX_SPEC_TOKENS}, not {k}")
        shape = gen.draft_shape(k)
        shape.check()
        reach = shape.reach  # the most drafts a step accepts: it emits reach + 1 tokens at most
        need = len(prompt_ids) + gen.max_new_tokens + shape.width
        if need > self.max_context:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({gen.max_new_tokens}) + "
                             f"{shape.width} verified per step = {need} exceeds the context of {self.max_context} tokens")
        with self.target.hold_cache(self):  # one generation at a time on the target's cache (CacheInUse)
            yield from self._generate(prompt_ids, gen, shape, need)

    def _generate(self, prompt_ids: list[int], gen: GenerationConfig, shape: DraftShape, need: int
                  ) -> Iterator[StepEvent]:
        """generate's loop, with the target's cache held."""
        k, reach, params = shape.depth, shape.reach, gen.sampling
        # the most slots a step attends over (see the loop's bound)
        b = self._prepare(shape, need + reach, sampled=not params.greedy)
        b.temperature.fill_(params.temperature if params.temperature > 0 else 1.0)
        stop = set(gen.stop_token_ids if gen.stop_token_ids is not None else self.eos_token_ids)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(gen.seed)
        stats = AcceptanceStats(num_spec_tokens=reach)
        timer = _StepTimer(self.device)
        clock = began = time.perf_counter()
        out_of_time = (lambda: False) if gen.max_time_s is None else (  # noqa: E731
            lambda: time.perf_counter() - began >= gen.max_time_s)

        # prefill: target over the prompt, first token, drafter over the prompt
        timer.start()
        first, first_prob, first_top = self._prefill(b, prompt_ids, params, generator)
        timer.mark()
        (prefill_ms,) = timer.read()
        stats.observe_prefill(prefill_ms)
        done = first in stop or gen.max_new_tokens == 1
        reason = ("stop" if first in stop else "length") if done else ("time" if out_of_time() else None)
        done = reason is not None
        stats.elapsed_s += time.perf_counter() - clock
        yield StepEvent(0, [], 0, [first], [first_prob], False, 0.0, prefill_ms, stats.snapshot(), done, reason,
                        target_top=[first_top])
        clock = time.perf_counter()
        generated = 1
        step = 0
        accept = self._acceptance(b)
        lane, ahead = 0, False  # graph mode: the lane of the next step; whether it is already launched
        # the slots a step attends over are bounded before the step before it is read (the step runs
        # ahead in graph mode), so eager bounds them the same way: from the previous step's start plus
        # the most it can emit; step 1 knows its start
        previous = generated - (reach + 1)
        while not done:
            step += 1
            attend = self.attended(len(prompt_ids) + previous + reach + 1 + shape.width)
            previous = generated
            if b.lanes:
                if not ahead:
                    self._launch(b, b.lanes[attend][lane], params, generator)
                current, lane = b.lanes[attend][lane], 1 - lane
                # run the next step ahead, unless this one may end on the budget (then the next one
                # might not fit the context); a step ending on a stop token wastes the one ahead
                ahead = generated + reach + 1 < gen.max_new_tokens
                if ahead:
                    ahead_lane = b.lanes[self.attended(len(prompt_ids) + generated + reach + 1 + shape.width)][lane]
                    self._launch(b, ahead_lane, params, generator)
                current.copied.synchronize()  # the one device-to-host sync of this step
                packed = current.host.tolist()
                draft_ms, verify_ms = current.marks[0].elapsed_time(current.marks[1]), \
                    current.marks[1].elapsed_time(current.end)
            else:
                self._draw(b, params, generator)
                timer.start()
                if k:
                    self._propose(b, attend)
                timer.mark()
                logits, features = self._verify_forward(b, attend)
                accept(b, logits, features, params)
                timer.mark()
                packed = b.result.tolist()  # the one device-to-host sync of this step
                draft_ms, verify_ms = timer.read()
            n, tokens, probs, tree, target_top, draft_top = unpack_result(packed, reach, shape.verified, shape.lookup)
            emitted, reason = _cut(tokens, stop, gen.max_new_tokens - generated)
            if reason is None and out_of_time():
                reason = "time"
            kept = min(n, len(emitted))  # accepted drafts the reply keeps: none past its end
            if k:
                stats.observe_draft(reach, kept)
            generated += len(emitted)
            done = reason is not None
            if done and ahead:  # the step run ahead was wasted: this generation pays for it
                ahead_lane.copied.synchronize()
            stats.observe_step(len(emitted), draft_ms, verify_ms, kept)
            # graph mode runs the next step while the consumer holds this one: the wall clock without
            # the consumer's time can be shorter than the step's own device time, which is the least
            # a step costs (a slow consumer, such as a page drawing each step, must not speed it up)
            wall = time.perf_counter() - clock
            stats.elapsed_s += max(wall, (draft_ms + verify_ms) / 1e3) if b.lanes else wall
            end = tree.path[n - 1] if n else 0  # the deepest accepted node: were any of its children rejected?
            resampled = not params.greedy and end in tree.parents and len(emitted) == n + 1
            yield StepEvent(step, tree.tokens, n, emitted, probs[: len(emitted)], resampled, draft_ms, verify_ms,
                            stats.snapshot(), done, reason, tree if k else None, target_top[: len(emitted)], draft_top)
            clock = time.perf_counter()

    @staticmethod
    def _draw(b: StepBuffers, params: SamplingParams, generator) -> None:
        """A step's draws at T > 0, from the request's generator and outside any graph, in the order
        eager and graph mode both take them: the sampled drafts' uniforms, then the acceptance
        test's (Draws)."""
        if params.greedy:
            return
        if b.shape.sampled:
            b.tree.uniforms.uniform_(generator=generator)
        b.draws.draw_(generator)

    def _launch(self, b: StepBuffers, lane: Lane, params: SamplingParams, generator) -> None:
        """Queue one whole step on a lane (graph mode), without waiting: the step's draws, its graph
        (at T > 0 the step's, then its acceptance test's; eagerly at top-p < 1: CapturedSampling),
        and the copy of the packed result to the lane's pinned host buffer."""
        self._draw(b, params, generator)
        if params.greedy:
            lane.graphs["step"]()
        else:
            logits, features = lane.graphs["step_sampled"]()
            if params.top_p < 1.0:
                self._acceptance(b)(b, logits, features, params)
            else:
                lane.graphs["accept_sampled"]()
        lane.end.record()
        lane.host.copy_(b.result, non_blocking=True)
        lane.copied.record()

    def _prefill_forward(self, b: StepBuffers, rows: int, attend: int | None = None) -> torch.Tensor:
        """Target over the prompt (padded to `rows`), logits at its last row; the drafter's cache over
        rows 0..rows-2 (row i pairs x[i+1] with h[i]); the last row's features staged for the first
        catch-up. Returns logits [1, 1, V]. Padding rows write K/V past the prompt, which no query
        sees before the steps rewrite them."""
        ids, positions = b.prefill_ids[:, :rows], b.prefill_positions[:, :rows]  # [1, rows]
        feats = self._features_of(b.k)
        out = self.target.forward(ids, positions, aux_layers=feats or (), logits_rows=b.prefill_last, attend=attend)
        if b.k:
            features = out.aux if feats else out.hidden  # [1, rows, F]
            b.catch_features[:, :1].copy_(features.index_select(1, b.prefill_last))
            if rows > 1:
                hidden = self.drafter.project(features[:, : rows - 1])
                self.drafter.forward(ids[:, 1:], positions[:, : rows - 1], hidden, logits=False, attend=attend)
        return out.logits

    def _prefill(self, b: StepBuffers, prompt_ids: list[int], params: SamplingParams, generator):
        """Fill both caches with the prompt; stage the first catch-up and verification. Returns (token,
        its probability, the target's TOP_SHOWN (token, p) there)."""
        dev, k = self.device, b.k
        P = len(prompt_ids)
        rows = self.prefill_bucket(P)
        b.prefill_ids[0, :P].copy_(torch.tensor(prompt_ids, dtype=torch.int64))
        b.prefill_ids[0, P:rows].zero_()
        b.prefill_last.fill_(P - 1)
        graph = b.graphs.get(f"prefill{rows}")
        logits = (graph() if graph is not None else self._prefill_forward(b, rows, self.attended(rows)))[0]  # [1, V]
        probs = target_probs(logits, params)
        if params.greedy:
            token = logits.argmax(-1)  # [1]
        else:
            token = verify_sampled(logits.new_zeros(0, dtype=torch.int64), probs, generator)[1]
        if b.tree is not None:
            b.tree.root_token.copy_(token.view(1))
            b.tree.root_slot.fill_(P)
            if b.tree.history is not None:  # what a lookup branch copies from: the prompt, then the first token
                b.tree.history[:P].copy_(b.prefill_ids[0, :P])
                b.tree.history[P:P + 1].copy_(token.view(1))
        else:
            b.verify_tokens[:, :1].copy_(token.view(1, 1))
            b.verify_positions.copy_(torch.arange(P, P + b.shape.width, device=dev).view(1, -1))
        if k:  # the first catch-up redoes the prompt's last drafter row: (first token, h[P-1]) at P-1
            # its other rows are unused, but the previous generation's would reach row 0 through a
            # CPU's int8 drafter, whose activation scale is taken over all of a call's rows
            b.catch_tokens[0, 1:].zero_()
            if b.catch_features is not None:
                b.catch_features[:, 1:].zero_()
            b.catch_tokens[0, :1].copy_(token.view(1))
            b.catch_positions.copy_(torch.arange(P - 1, P + b.shape.reach, device=dev).view(1, -1))
            b.catch_last.zero_()
        top = probs[0].topk(TOP_SHOWN)
        packed = torch.cat((token.view(1).double(), probs[0].gather(0, token.view(1)).double(),
                            top.indices.double(), top.values.double())).tolist()  # the prefill's one host sync
        first = int(packed[0])
        ids, ps = packed[2:2 + TOP_SHOWN], packed[2 + TOP_SHOWN:]
        return first, packed[1], [(int(t), p) for t, p in zip(ids, ps)]


# ---------------------------------------------------------------------- the packed step result
# One float64 tensor per step, read with one host sync (token ids below 2**53 are exact):
# [accepted n, emitted tokens (D+1), their target probabilities (D+1), accepted path (D node ids),
#  draft node tokens (N), their parents (N), q (N; -1: not computed), p (N),
#  the target's top ids and p at each emitted position (2 x (D+1) x TOP_SHOWN),
#  a chain drafter's top ids and q at each draft position (2 x D x TOP_SHOWN; q -1: not kept)].
# A chain of k is the tree whose node i+1 hangs from node i (D = N = k).
def packed_size(depth: int, nodes: int) -> int:
    return 1 + 2 * (depth + 1) + depth + 4 * nodes + 2 * TOP_SHOWN * (2 * depth + 1)


def pack_result(n: torch.Tensor, tokens: torch.Tensor, token_probs: torch.Tensor, path: torch.Tensor,
                nodes: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                target_top_ids: torch.Tensor, target_top_p: torch.Tensor, draft_top_ids: torch.Tensor,
                draft_top_q: torch.Tensor) -> torch.Tensor:
    """n: []; tokens, token_probs: [D+1]; path: [D]; nodes, parents, draft_probs, target_probs: [N];
    target_top_*: [D+1, TOP_SHOWN]; draft_top_*: [D, TOP_SHOWN] -> [packed_size(D, N)] float64 (on the device)."""
    parts = (n.view(1), tokens, token_probs, path, nodes, parents, draft_probs, target_probs,
             target_top_ids, target_top_p, draft_top_ids, draft_top_q)
    return torch.cat([p.reshape(-1).double() for p in parts])


def unpack_result(packed: list[float], depth: int, nodes: int, copied: int = 0):
    """The host's reading of pack_result: (accepted n, the n+1 emitted tokens, their probabilities, the
    tree, the target's top (token, p) per emitted position, a chain drafter's top (token, q) per draft
    position or None). depth: the most a step accepts (DraftShape.reach); nodes: its verified ones, of
    which the last `copied` are a lookup branch's."""
    D, N = depth, nodes
    n = int(packed[0])
    at = 1
    def take(count):  # noqa: E306
        nonlocal at
        part = packed[at:at + count]
        at += count
        return part
    tokens = [int(t) for t in take(D + 1)][: n + 1]
    probs = take(D + 1)[: n + 1]
    path = [int(i) for i in take(D)][:n]
    node_tokens = [int(t) for t in take(N)]
    parents = [int(i) for i in take(N)]
    q = take(N)
    tree = DraftTree(node_tokens, parents, None if any(x < 0 for x in q) else q, take(N), path, copied)
    def tops(rows):  # noqa: E306
        ids, values = take(rows * TOP_SHOWN), take(rows * TOP_SHOWN)
        return [[(int(t), v) for t, v in zip(ids[r * TOP_SHOWN:(r + 1) * TOP_SHOWN], values[r * TOP_SHOWN:(r + 1) * TOP_SHOWN])]
                for r in range(rows)]
    target_top = tops(D + 1)[: n + 1]
    draft_top = tops(D)
    if not draft_top or any(v < 0 for row in draft_top for _, v in row):
        draft_top = None
    return n, tokens, probs, tree, target_top, draft_top


def _cut(tokens: list[int], stop: set[int], budget: int) -> tuple[list[int], str | None]:
    """Cut emitted tokens after the first stop token or at the token budget."""
    for i, t in enumerate(tokens[:budget]):
        if t in stop:
            return tokens[: i + 1], "stop"
    if len(tokens) >= budget:
        return tokens[:budget], "length"
    return tokens, None


class _StepTimer:
    """Marks within a step: CUDA events on a GPU (read after the step's sync), wall clock on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def _now(self):
        if self.cuda:
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
