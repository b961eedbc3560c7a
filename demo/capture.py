"""CUDA-graph capture and compilation, outside the model and the engine's loop: a shape's steps
captured over its persistent buffers (demo/step_buffers.py) and replayed.

In graph mode a whole decoding step (propose, verify and, at T = 0, the acceptance test) is one graph
per attend bucket, captured twice (two ``Replica``s, so step s + 1 is launched before the host reads step
s), and the prefill one graph per prompt bucket. ``torch.compile`` (``compile_step``) compiles the
phases the engine's compile scope names before capture. Every capture starts from the state the
buffers were allocated in, and the engine supplies the step's phases through its public phase API
(``Engine.propose``, ``verify``, ``acceptance``, ``sampled_acceptance``, ``prefill_forward``).
"""

from __future__ import annotations

import gc
import types
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from demo.config import SamplingParams
from demo.step_buffers import StepBuffers, state_tensors


@dataclass
class CaptureState:
    """What a shape's first capture sets up and its later ones (more attend buckets) reuse."""

    pool: object  # the shape's CUDA graph memory pool
    accept: Callable  # the (compiled) greedy acceptance test
    accept_sampled: Callable  # the acceptance test at T > 0, top-p 1 (CapturedSampling), on b.draws
    initial: list  # the state allocation made (state_tensors), which every capture starts from
    sampled: bool = False  # a generation at T > 0 asked for accept_sampled: every replica has it
    sampled_uncompiled: bool = False  # accept_sampled failed to compile and runs as eager runs it


@dataclass
class Replica:
    """One of a shape's two captured copies of the step (graph mode). Steps alternate between them so
    that step s + 1 is launched before the host reads step s: the host's work between two steps
    (reading the result, accounting, the consumer of the event) overlaps the device's next step
    instead of leaving the device idle. Each copy records its own timing events, so reading step s's
    times is not disturbed by step s + 1 recording its own."""

    graphs: dict  # "step" (greedy, acceptance included) and/or "step_sampled" and "accept_sampled" -> CapturedStep
    marks: tuple  # (start, after propose): recorded inside this replica's graphs
    end: "torch.cuda.Event"  # after the step (and, at T > 0, its acceptance test)
    copied: "torch.cuda.Event"  # after the packed result reached `host`
    host: torch.Tensor  # pinned host copy of StepBuffers.result


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


def capture_steps(engine, b: StepBuffers, buckets: list[int]) -> None:
    """Capture one graph per decoding step and attend bucket (propose, verify and, at T = 0, the
    acceptance test; at T > 0 "step_sampled", and once a sampled generation asked for it
    "accept_sampled" over its output, on the draws made before the step) and, the first time,
    one prefill graph per prompt bucket. Two timing events recorded inside the step graph split
    its time into propose and verify."""
    first = b.capture is None
    if first:
        # one memory pool per shape, alive exactly as long as its graphs: capturing into a pool
        # whose graphs were all released (a proposer swap drops them) trips the CUDA caching
        # allocator's assert
        engine.target.stack_weights()  # compiled code reads the stacks made before it (demo.layers.stacked)
        if engine.proposer is not None:
            engine.proposer.stack_weights()
        accept_fn = engine.acceptance(b)
        # a capture runs its step three times, and each run moves the positions on: every capture
        # starts from the state allocation made, or a small bucket's warm-ups would write past its slots
        b.capture = CaptureState(
            torch.cuda.graph_pool_handle(),
            engine.maybe_compile(lambda logits, features: accept_fn(b, logits, features, SamplingParams()), "accept"),
            engine.maybe_compile(engine.sampled_acceptance(b), "accept"),
            [t.clone() for t in state_tensors(b)])
    accept = b.capture.accept
    captured = lambda fn: _captured(b, fn)  # noqa: E731
    for attend in buckets:  # the step over each bucket of attended slots
        propose = engine.maybe_compile(lambda a=attend: engine.propose(b, a), "propose") if b.k else None
        verify = engine.maybe_compile(lambda a=attend: engine.verify(b, a), "verify")

        def step(greedy: bool, marks: tuple, propose=propose, verify=verify):
            marks[0].record()
            if propose is not None:
                propose()
            marks[1].record()
            logits, features = verify()
            if greedy:
                accept(logits, features)
            return logits, features

        replicas = []  # the bucket's entry appears once both replicas are captured, never half made
        for i in range(2):  # two replicas (Replica): the same compiled functions, captured twice
            marks = tuple(torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
            graphs = {}
            if not b.shape.sampled:  # drafts sampled from q exist only at T > 0
                graphs["step"] = captured(lambda marks=marks, step=step: step(True, marks))
            graphs["step_sampled"] = captured(lambda marks=marks, step=step: step(False, marks))
            b.graphs.update({graph_name(name, attend, i, engine.max_context): g for name, g in graphs.items()})
            if b.capture.sampled:
                capture_accept_sampled(engine, b, graphs, attend, i)
            replicas.append(Replica(graphs, marks, torch.cuda.Event(enable_timing=True), torch.cuda.Event(),
                              torch.empty(b.result.shape, dtype=b.result.dtype, pin_memory=b.result.is_cuda)))
        b.replicas[attend] = replicas
    if first:
        for size in engine.prefill_buckets():
            b.graphs[f"prefill{size}"] = captured(lambda size=size: engine.prefill_forward(b, size, engine.attended(size)))
    restore(b)


def capture_accept_sampled(engine, b: StepBuffers, graphs: dict, attend: int, replica: int) -> None:
    """A replica's "accept_sampled": the T > 0 acceptance test over the replica's verification, which
    its step graph leaves in its outputs. Compiled with the proposer's steps, and captured
    uncompiled (with a warning) should inductor fail on the rules' unrolled loops."""
    accept = lambda stepped=graphs["step_sampled"]: b.capture.accept_sampled(*stepped.output)  # noqa: E731
    try:
        graphs["accept_sampled"] = _captured(b, accept)
    except Exception as e:  # noqa: BLE001  (torch.compile's failures have no common type)
        if not engine.compiles("accept") or b.capture.sampled_uncompiled:
            raise
        warnings.warn(f"the T > 0 acceptance test did not compile; captured uncompiled: {e}")
        b.capture.accept_sampled, b.capture.sampled_uncompiled = engine.sampled_acceptance(b), True
        graphs["accept_sampled"] = _captured(b, accept)
    b.graphs[graph_name("accept_sampled", attend, replica, engine.max_context)] = graphs["accept_sampled"]


def graph_name(name: str, attend: int, replica: int, max_context: int) -> str:
    """A step graph's name in StepBuffers.graphs: "step", "step@512", "step_sampled@1024.1", ..."""
    return name + ("" if attend == max_context else f"@{attend}") + ("" if replica == 0 else f".{replica}")


def restore(b: StepBuffers) -> None:
    """b's state as allocation made it, which every capture starts from (a capture runs its step
    three times, each moving the positions on)."""
    for t, f in zip(state_tensors(b), b.capture.initial):
        t.copy_(f)


def _captured(b: StepBuffers, fn) -> CapturedStep:
    restore(b)
    return CapturedStep(fn, b.capture.pool)
