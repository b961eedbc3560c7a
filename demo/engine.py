"""The speculative decoding engine: the loop. Prefill, then one event per decoding step, each step
propose -> verify -> accept -> account:

1. propose: the method's proposer (demo/proposers/: EAGLE-1 and EAGLE-3 over the drafter, the
   model-free n-gram lookup) writes the step's draft, a chain or a tree, into the shape's persistent
   buffers (demo/step_buffers.py);
2. verify: one target forward over [last token, drafts] (k+1 positions for a chain, the tree's nodes
   under a tree mask);
3. accept: the acceptance test on the device (demo/accept.py), which stages the next step and packs
   the result; rejected positions stay in the caches and are overwritten later;
4. account: one device-to-host read of the packed step result (demo/step_result.py), counted by
   demo/metrics.py. In graph mode the next step is launched before this read (``Replica``), so the
   host's accounting and the event's consumer overlap the device's next step.

Every per-step tensor lives in a persistent buffer, so the same step functions run eagerly or replay
CUDA graphs captured before the first request (demo/capture.py): in graph mode a whole decoding step
is one graph, and the prefill one graph per prompt-length bucket (a GPU pads prompts to the next
power of two in either mode, so both compute the same and library plans are reused): graph mode
changes nothing but time. The engine works on token ids and knows nothing of tokenizers or user
interfaces; a generation holds the target's KV cache from its prefill to its last step
(``Target.hold_cache``).
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import torch

from demo.accept import accept_chain, accept_tree
from demo.capture import capture_accept_sampled, capture_steps, compile_step, restore
from demo.config import DRAFT_SAMPLING, DraftShape, GenerationConfig, SamplingParams
from demo.methods import COMPILE_SCOPES, MAX_SPEC_TOKENS, MODES, dtype_label, mode_label
from demo.metrics import AcceptanceStats, StepTimer
from demo.proposers import EagleProposer
from demo.sampling import CapturedSampling, target_probs, verify_sampled
from demo.step_buffers import StepBuffers, allocate
from demo.step_result import TOP_SHOWN, StepEvent, cut, unpack_result
from demo.target import Target

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


PHASES = ("project", "catch_up", "draft", "verify", "accept")  # a step's, in order (Engine.step_phases)
PREFILL_MIN_BUCKET = 64  # a GPU runs a prompt at the next power of two from this (at most the context)
ATTEND_ROUND = 64  # a CPU attends over the cache slots in use, rounded up to a multiple of this
ATTEND_MIN_BUCKET = 512  # a GPU attends over the next power of two from this (at most the context)


def prefill_rows(n: int, max_context: int) -> int:
    """The bucket of a prompt of n tokens: the next power of two from PREFILL_MIN_BUCKET, at most the
    context. A GPU runs every prompt so, in eager mode as in graph mode (so both compute the same),
    and each bucket's graph and library plans are made once."""
    return min(max(PREFILL_MIN_BUCKET, 1 << (n - 1).bit_length()), max_context)


class Binding:
    """Which buffers a step function runs over: a shape's own (this default). The capture lab
    (demo/bench/capture_lab.py) swaps in one that replays the binding a capture saw."""

    def allocated(self, b: StepBuffers) -> None:
        """A shape's buffers were just allocated."""

    def __call__(self, b: StepBuffers) -> StepBuffers:
        return b


class Engine:
    """A target and the proposer of one drafting method (or none: the target alone), run eagerly or
    from CUDA graphs captured before generation."""

    def __init__(self, target: Target, proposer=None, *, mode: str = "eager", compile: bool | str = False,
                 max_context: int = 2048, drafter_dtype: torch.dtype | None = None, drafter_int8: bool | str = False,
                 binding: Binding | None = None):
        """proposer: a proposer of demo/proposers/, a drafter (an EAGLE or EAGLE-3 head, which
        ``EagleProposer`` wraps), or None for target-only decoding. compile: False; "drafter" or True
        (the proposer's captured steps, as in the vLLM change this project comes from, and the greedy
        acceptance test: the target's forward keeps eager's numerics, so only drafting time moves);
        or "all" (the target's forward too: fastest, but its rounding changes, so the text may move
        at near-ties). drafter_dtype: what a drafter computes in (None: the target's); drafter_int8:
        on a CPU its head and layer (True) or head ("head") multiply through int8 copies
        (demo/drafter_common.py says where each is the quicker). binding: the buffers the step
        functions run over (``Binding``)."""
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
        self.binding = binding or Binding()
        self._buffers: dict[DraftShape, StepBuffers] = {}
        self.capture_s = 0.0  # time spent capturing (and compiling) graphs, reported separately
        self.target.setup_cache(self.max_context)
        self.proposer = None
        self.set_proposer(proposer)

    # ------------------------------------------------------------------ setup
    @property
    def method(self) -> str:
        return "none" if self.proposer is None else self.proposer.method

    @property
    def drafter(self):
        """The proposer's drafter (None: the target alone, or a method without one)."""
        return getattr(self.proposer, "drafter", None)

    @property
    def device(self) -> torch.device:
        return self.target.device

    def set_proposer(self, proposer) -> None:
        """Swap the proposer (a drafter is wrapped in an EagleProposer; None: target-only) without
        reloading the target. Buffers and graphs of drafting shapes go with the old one."""
        if proposer is not None and not hasattr(proposer, "propose"):
            proposer = EagleProposer(proposer)
        self._buffers = {s: b for s, b in self._buffers.items() if s.depth == 0}  # drafting graphs are stale
        self.proposer = proposer
        if proposer is not None:
            proposer.bind(self.target, self.max_context, self.drafter_dtype, self.drafter_int8)

    def release_graphs(self) -> None:
        """Drop every shape's step buffers and graphs (the next generation captures anew): ZeroGPU's per call."""
        self._buffers.clear()

    def describe(self) -> dict:
        return {"method": self.method, "mode": mode_label(self.mode, self.compile),
                "device": str(self.device), "dtype": dtype_label(self.target.dtype), "max_context": self.max_context}

    def _features_of(self, k: int) -> tuple[int, ...] | None:
        """Which target features a step of depth k reads: aux layer ids, () for the final hidden, None
        for none (target-only, or a proposer that reads none)."""
        return None if k == 0 or self.proposer is None else self.proposer.features

    @torch.inference_mode()
    def prepare(self, shape: DraftShape | int, used: int | None = None, sampled: bool = False) -> StepBuffers:
        """Allocate the persistent buffers of a draft shape (an int k: a chain of k) and, in graph
        mode, capture its steps now, never in the middle of a generation: over every attend bucket up
        to the one `used` slots need (None: all); with `sampled` (T > 0) the acceptance test at T > 0
        too. In inference mode, as generate() is (a capture outside it could not restore a generation's
        inference tensors in place); holding the target's cache, as a capture runs steps over it."""
        with self.target.hold_cache(self):
            return self._prepare(shape, used, sampled)

    def _prepare(self, shape: DraftShape | int, used: int | None, sampled: bool) -> StepBuffers:
        shape = DraftShape.of(shape, None) if isinstance(shape, int) else shape
        b = self._buffers.get(shape) or self._allocate(shape)
        if self.mode == "cudagraph":
            reach = self.max_context if used is None else self.attended(used)
            # a step attends over at least one prompt token, the token before it and its own rows:
            # a smaller bucket is never chosen, and its capture would write past its cache views
            least = shape.width + 2
            missing = [a for a in self.attend_buckets() if least <= a <= reach and a not in b.replicas]
            start = time.perf_counter()
            if missing:
                capture_steps(self, b, missing)
            if (sampled or shape.sampled) and b.capture is not None and not b.capture.sampled:
                b.capture.sampled = True
                for attend, replicas in b.replicas.items():
                    for i, replica in enumerate(replicas):
                        capture_accept_sampled(self, b, replica.graphs, attend, i)
                restore(b)
            self.capture_s += time.perf_counter() - start
        return b

    def _allocate(self, shape: DraftShape) -> StepBuffers:
        if shape.depth and self.proposer is None:
            raise ValueError("a draft of depth > 0 needs a proposer; this engine decodes with the target alone")
        b = allocate(shape, self.target, self.proposer, self.max_context, self.drafter_dtype)
        self.binding.allocated(b)
        self._buffers[shape] = b
        return b

    def prefill_bucket(self, n: int) -> int:
        """The rows a prompt of n tokens runs at (n itself unless pad_prefill): on a GPU its
        ``prefill_rows`` (a graph each); on a CPU the next multiple of ATTEND_ROUND, since its libraries
        keep what they make for each new row count (oneDNN a primitive each): an app's memory grew with
        every new prompt length, and a 2,048-token context has 32 such shapes, for at most 63 padding rows."""
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

    def attended(self, used: int) -> int:
        """The cache slots a forward attends over, given `used` (every slot its queries may see or
        write): on a CPU those, rounded up to ATTEND_ROUND (attending over the whole cache cost a
        1-token forward of the default target on 2 cores about as much as its weights at a 2,048-token
        context); in graph mode the smallest of ``attend_buckets`` that holds them (one captured step
        each), and so on a GPU in eager mode too, so that eager computes what graph mode replays, bit
        for bit. A draft tree's drafter rows go to scratch slots just past them (demo/proposers/eagle.py)."""
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

    def compiles(self, phase: str) -> bool:
        """Whether captured steps run `phase` ("propose", "verify" or "accept") compiled: compile
        "drafter" all but the target's forward (verify), "all" every phase of a step. (Eagerly, a
        64-node tree's acceptance test launches 120 kernels, a chain of 7's 67.)"""
        return self.compile == "all" or (self.compile == "drafter" and phase != "verify")

    def maybe_compile(self, fn, phase: str):
        return compile_step(fn) if self.compiles(phase) else fn

    # ------------------------------------------------------------------ the step's phases
    # Each reads and writes only persistent buffers and caches, and never syncs with the host. Capture
    # (demo/capture.py) and the profiler (demo/bench/tools/perf.py) call them as the loop does.
    def propose(self, b: StepBuffers, attend: int | None = None) -> None:
        """The proposer's draft into b. attend: the cache slots the target attends over (``attended``);
        None: all."""
        self.proposer.propose(self.binding(b), attend)

    def verify(self, b: StepBuffers, attend: int | None = None):
        """Target forward over [last token, drafts]; returns (logits [1, W, V], features [1, W, F]).
        attend: the cache slots to attend over (``attended``), None: all."""
        b = self.binding(b)
        feats = self._features_of(b.k)
        tree = b.tree
        out = self.target.forward(b.verify_tokens, b.verify_positions, aux_layers=feats or (),
                                  slots=tree.verify_slots if tree else None, mask=tree.verify_mask if tree else None,
                                  attend=attend)
        return out.logits, (out.aux if feats else out.hidden)

    def acceptance(self, b: StepBuffers) -> Callable:
        """The acceptance test of b's shape, (b, logits, features, params): a tree's or a chain's."""
        proposer, cache = self.proposer, self.target.cache
        if b.tree is not None:
            return lambda b, logits, features, params: accept_tree(self.binding(b), proposer, cache, logits, features,
                                                                  params)
        return lambda b, logits, features, params: accept_chain(self.binding(b), proposer, logits, features, params)

    def sampled_acceptance(self, b: StepBuffers) -> Callable:
        """b's acceptance test at T > 0 as a graph runs it: (logits, features), the temperature read
        from b.temperature, the draws from b.draws (top-p 1)."""
        accept = self.acceptance(b)
        return lambda logits, features: accept(b, logits, features, CapturedSampling(b.temperature))

    def prefill_forward(self, b: StepBuffers, rows: int, attend: int | None = None) -> torch.Tensor:
        """Target over the prompt (padded to `rows`), logits at its last row; then what the proposer
        keeps of the prompt. Returns logits [1, 1, V]. Padding rows write K/V past the prompt, which no
        query sees before the steps rewrite them."""
        b = self.binding(b)
        ids, positions = b.prefill_ids[:, :rows], b.prefill_positions[:, :rows]  # [1, rows]
        feats = self._features_of(b.k)
        out = self.target.forward(ids, positions, aux_layers=feats or (), logits_rows=b.prefill_last, attend=attend)
        if b.k:
            self.proposer.prefill(b, ids, positions, out.aux if feats else out.hidden, rows, attend)
        return out.logits

    def step_phases(self, b: StepBuffers, params: SamplingParams = SamplingParams(), generator=None) -> dict:
        """A decoding step of b's shape as its phases, in step order: name (PHASES) -> a function over
        b's persistent buffers, run as the step runs it, eagerly (what demo/bench/tools/perf.py times one by
        one): the proposer's (``phases``), then "verify" and "accept", which reads the last "verify"'s
        output and moves the state on by one step."""
        attend = self.attended(self.last_slot(b) + 1)
        fns = dict(self.proposer.phases(b, attend)) if b.k else {}
        verified = []  # the last verification's (logits, features), which the acceptance test reads

        def verify():
            verified[:] = [self.verify(b, attend)]
        fns["verify"] = verify
        accept = self.acceptance(b)

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
        k = gen.num_spec_tokens if self.proposer is not None else 0
        if not 0 <= k <= MAX_SPEC_TOKENS:
            raise ValueError(f"num_spec_tokens must be in 0..{MAX_SPEC_TOKENS}, not {k}")
        shape = gen.draft_shape(k, getattr(self.proposer, "samples_drafts", True))
        shape.check()
        if shape.tree and k and not self.proposer.trees:
            raise ValueError(f"the {self.method} proposer drafts chains, not trees")
        need = len(prompt_ids) + gen.max_new_tokens + shape.width
        if need > self.max_context:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({gen.max_new_tokens}) + "
                             f"{shape.width} verified per step = {need} exceeds the context of {self.max_context} tokens")
        with self.target.hold_cache(self):  # one generation at a time on the target's cache (CacheInUse)
            yield from self._generate(prompt_ids, gen, shape, need)

    def _generate(self, prompt_ids: list[int], gen: GenerationConfig, shape: DraftShape, need: int
                  ) -> Iterator[StepEvent]:
        """generate's loop, with the target's cache held."""
        k, reach, params = shape.depth, shape.reach, gen.sampling  # reach: the most drafts a step accepts
        # the most slots a step attends over (see the loop's bound)
        b = self._prepare(shape, need + reach, sampled=not params.greedy)
        b.temperature.fill_(params.temperature if params.temperature > 0 else 1.0)
        stop = set(gen.stop_token_ids if gen.stop_token_ids is not None else self.eos_token_ids)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(gen.seed)
        stats = AcceptanceStats(reach=reach)
        copied = shape.verified if getattr(self.proposer, "copies", False) else shape.lookup  # drafts copied from the text
        timer = StepTimer(self.device)
        clock = began = time.perf_counter()
        out_of_time = (lambda: False) if gen.max_time_s is None else (  # noqa: E731
            lambda: time.perf_counter() - began >= gen.max_time_s)

        # prefill: target over the prompt, first token, proposer over the prompt
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
        accept = self.acceptance(b)
        replica, ahead = 0, False  # graph mode: the replica of the next step; whether it is already launched
        # the slots a step attends over are bounded before the step before it is read (the step runs
        # ahead in graph mode), so eager bounds them the same way: from the previous step's start plus
        # the most it can emit; step 1 knows its start
        previous = generated - (reach + 1)
        while not done:
            step += 1
            attend = self.attended(len(prompt_ids) + previous + reach + 1 + shape.width)
            previous = generated
            if b.replicas:
                if not ahead:
                    self._launch(b, b.replicas[attend][replica], params, generator)
                current, replica = b.replicas[attend][replica], 1 - replica
                # run the next step ahead, unless this one may end on the budget (then the next one
                # might not fit the context); a step ending on a stop token wastes the one ahead
                ahead = generated + reach + 1 < gen.max_new_tokens
                if ahead:
                    attend_ahead = self.attended(len(prompt_ids) + generated + reach + 1 + shape.width)
                    ahead_replica = b.replicas[attend_ahead][replica]
                    self._launch(b, ahead_replica, params, generator)
                current.copied.synchronize()  # the one device-to-host sync of this step
                packed = current.host.tolist()
                draft_ms, verify_ms = current.marks[0].elapsed_time(current.marks[1]), \
                    current.marks[1].elapsed_time(current.end)
            else:
                self._draw(b, params, generator)
                timer.start()
                if k:
                    self.propose(b, attend)
                timer.mark()
                logits, features = self.verify(b, attend)
                accept(b, logits, features, params)
                timer.mark()
                packed = b.result.tolist()  # the one device-to-host sync of this step
                draft_ms, verify_ms = timer.read()
            n, tokens, probs, tree, target_top, draft_top = unpack_result(packed, reach, shape.verified, copied)
            emitted, reason = cut(tokens, stop, gen.max_new_tokens - generated)
            if reason is None and out_of_time():
                reason = "time"
            kept = min(n, len(emitted))  # accepted drafts the reply keeps: none past its end
            if k:
                stats.observe_draft(reach, kept)
            generated += len(emitted)
            done = reason is not None
            if done and ahead:  # the step run ahead was wasted: this generation pays for it
                ahead_replica.copied.synchronize()
            stats.observe_step(len(emitted), draft_ms, verify_ms, kept)
            # graph mode runs the next step while the consumer holds this one: the wall clock without
            # the consumer's time can be shorter than the step's own device time, which is the least
            # a step costs (a slow consumer, such as a page drawing each step, must not speed it up)
            wall = time.perf_counter() - clock
            stats.elapsed_s += max(wall, (draft_ms + verify_ms) / 1e3) if b.replicas else wall
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

    def _launch(self, b: StepBuffers, replica, params: SamplingParams, generator) -> None:
        """Queue one whole step on a replica (graph mode), without waiting: the step's draws, its graph
        (at T > 0 the step's, then its acceptance test's; eagerly at top-p < 1: CapturedSampling),
        and the copy of the packed result to the replica's pinned host buffer."""
        self._draw(b, params, generator)
        if params.greedy:
            replica.graphs["step"]()
        else:
            logits, features = replica.graphs["step_sampled"]()
            if params.top_p < 1.0:
                self.acceptance(b)(b, logits, features, params)
            else:
                replica.graphs["accept_sampled"]()
        replica.end.record()
        replica.host.copy_(b.result, non_blocking=True)
        replica.copied.record()

    def _prefill(self, b: StepBuffers, prompt_ids: list[int], params: SamplingParams, generator):
        """Fill the caches with the prompt; stage the first step. Returns (token, its probability, the
        target's TOP_SHOWN (token, p) there)."""
        dev = self.device
        P = len(prompt_ids)
        rows = self.prefill_bucket(P)
        b.prefill_ids[0, :P].copy_(torch.tensor(prompt_ids, dtype=torch.int64))
        b.prefill_ids[0, P:rows].zero_()
        b.prefill_last.fill_(P - 1)
        graph = b.graphs.get(f"prefill{rows}")
        logits = (graph() if graph is not None else self.prefill_forward(b, rows, self.attended(rows)))[0]  # [1, V]
        probs = target_probs(logits, params)
        if params.greedy:
            token = logits.argmax(-1)  # [1]
        else:
            token = verify_sampled(logits.new_zeros(0, dtype=torch.int64), probs, generator)[1]
        if b.tree is not None:
            b.tree.root_token.copy_(token.view(1))
            b.tree.root_slot.fill_(P)
        else:
            b.verify_tokens[:, :1].copy_(token.view(1, 1))
            b.verify_positions.copy_(torch.arange(P, P + b.shape.width, device=dev).view(1, -1))
        if b.history is not None:  # what a lookup copies from: the prompt, then the first token
            b.history[:P].copy_(b.prefill_ids[0, :P])
            b.history[P:P + 1].copy_(token.view(1))
        if b.k:
            self.proposer.first(b, token, P)
        top = probs[0].topk(TOP_SHOWN)
        packed = torch.cat((token.view(1).double(), probs[0].gather(0, token.view(1)).double(),
                            top.indices.double(), top.values.double())).tolist()  # the prefill's one host sync
        first = int(packed[0])
        ids, ps = packed[2:2 + TOP_SHOWN], packed[2 + TOP_SHOWN:]
        return first, packed[1], [(int(t), p) for t, p in zip(ids, ps)]
