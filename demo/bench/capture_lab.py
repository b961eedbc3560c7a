"""The capture lab's engine: the product's ``Engine`` with its steps captured and replayed, with or
without one capture fault of demo/bench/faults.py, for a learner (the Benchmark tab, local mode only)
and the bench (``python -m demo.bench --fault NAME --check-parity``). The faults live here, never in
the engine: the lab makes an ordinary Engine with two public hooks swapped in, a buffer binding
(``Engine.binding``) and a proposer (``Engine.proposer``).

A CUDA graph replays the kernels it recorded over the memory it saw at capture: the Python that
named the tensors does not run again. The lab captures

- with ``mode="cudagraph"`` (a GPU): the engine's real graphs, captured from the lab's step functions
  (the faults are in what they record);
- otherwise, a CPU stand-in: every step runs as eager mode does, but over its buffers as a graph
  would replay them.

Either way every step (prefill, propose, verify, accept) runs over the shape's buffers as they were
bound when they were allocated (before any capture), in a copy of that binding of its own
(``ReplayedBinding``): a tensor a step binds to a name, rather than writes into, is gone by the next
step, as after a graph's capture, and every graph of a shape is captured over the same binding. A
tensor the fault binds is allocated with the shape's buffers, never inside a capture: a graph's memory
pool is shared by the shape's graphs, and a tensor made during one capture and dropped by the next
would be handed to another graph's scratch while the first still writes it. Without a fault the lab
is eager mode, token for token and count for count.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from demo.bench.faults import CAPTURED_DEPTH, FAULTS
from demo.config import DraftShape
from demo.engine import Binding, Engine
from demo.proposers import EagleProposer
from demo.step_buffers import StepBuffers


class ReplayedBinding(Binding):
    """Each step runs over its shape's buffers as bound at allocation, in a copy of its own (the
    proposer's state too)."""

    def __init__(self):
        self.bound: dict[DraftShape, StepBuffers] = {}

    def allocated(self, b: StepBuffers) -> None:
        self.bound[b.shape] = replace(copy.copy(b), draft=copy.copy(b.draft))

    def __call__(self, b: StepBuffers) -> StepBuffers:
        bound = self.bound[b.shape]
        return replace(copy.copy(bound), draft=copy.copy(bound.draft))


class FaultyProposer(EagleProposer):
    """An EAGLE proposer with one capture fault of FAULTS: "stale-features" stages the verification's
    features by binding a tensor to the name instead of copying into the persistent buffer;
    "draft-shape" drafts a captured chain step CAPTURED_DEPTH deep whatever its k."""

    def __init__(self, drafter, fault: str, captures: bool):
        super().__init__(drafter)
        self.fault, self.captures = fault, captures
        self.elsewhere: dict[DraftShape, torch.Tensor] = {}  # stale-features: where its catch-up lands

    def allocate(self, shape: DraftShape, target, dtype: torch.dtype):
        state = super().allocate(shape, target, dtype)
        self.elsewhere[shape] = torch.zeros_like(state.catch_features)
        return state

    def accepted(self, b, tokens, positions, n, features) -> None:
        if self.fault == "stale-features":  # the fault: rebound, where the proposer copies
            b.draft.catch_features = self.elsewhere[b.shape]
        super().accepted(b, tokens, positions, n, features)

    def chain(self, b, attend=None) -> None:
        if self.fault == "draft-shape" and self.captures and b.k > CAPTURED_DEPTH:
            b = replace(b, shape=DraftShape(CAPTURED_DEPTH, 1, CAPTURED_DEPTH))  # the same tensors, drafted 1 deep
        super().chain(b, attend)


def lab_engine(target, drafter, *, fault: str = "none", replay: bool = True, **engine_args) -> Engine:
    """An Engine whose steps are captured and replayed (a GPU's CUDA graphs, a CPU's stand-in), with
    one capture fault of FAULTS. replay=False (eager mode only): run the lab's step functions eagerly,
    the fault's code included: what an eager test of the faulty code would see."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, not {fault!r}")
    captures = engine_args.get("mode") == "cudagraph" or replay
    proposer = None if drafter is None else FaultyProposer(drafter, fault, captures)
    return Engine(target, proposer, binding=ReplayedBinding() if captures else None, **engine_args)


def lab_around(engine: Engine, fault: str) -> Engine:
    """A lab engine on `engine`'s models and settings (its mode: a GPU's graphs or the stand-in); the
    engine it is made around is left as it was."""
    return lab_engine(engine.target, engine.drafter, fault=fault, mode=engine.mode, compile=engine.compile,
                      max_context=engine.max_context, drafter_dtype=engine.drafter_dtype,
                      drafter_int8=engine.drafter_int8)
