"""The capture lab's engine: the product's ``Engine`` with its steps captured and replayed, with or
without one capture fault of demo/bench/faults.py, for a learner (the Benchmark tab, local mode only)
and the bench (``python -m demo.bench --fault NAME --check-parity``). The faults live here, never in
the engine's own loop.

A CUDA graph replays the kernels it recorded over the memory it saw at capture: the Python that
named the tensors does not run again. ``CaptureLab`` captures

- with ``mode="cudagraph"`` (a GPU): the engine's real graphs, captured from the lab's step functions
  (the faults are in what they record);
- otherwise, a CPU stand-in: every step runs as eager mode does, but over its buffers as a graph
  would replay them.

Either way every step (prefill, propose, verify, accept) runs over the shape's buffers as they were
bound when they were allocated (before any capture), in a copy of that binding of its own: a tensor
a step binds to a name, rather than writes into, is gone by the next step, as after a graph's
capture, and every graph of a shape is captured over the same binding. A tensor the fault binds is
allocated with the shape's buffers, never inside a capture: a graph's memory pool is shared by the
shape's graphs, and a tensor made during one capture and dropped by the next would be handed to
another graph's scratch while the first still writes it. Without a fault the lab is eager mode,
token for token and count for count.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from demo.bench.faults import CAPTURED_DEPTH, FAULTS, capture_label
from demo.config import DraftShape
from demo.engine import Engine, StepBuffers


class CaptureLab(Engine):
    """An Engine whose steps are captured and replayed (a GPU's CUDA graphs, a CPU's stand-in), with
    one capture fault of FAULTS. The engine it is made around (``around``) is left as it was."""

    def __init__(self, target, drafter=None, *, fault: str = "none", replay: bool = True, **engine_args):
        """replay=False (eager mode only): run the lab's step functions eagerly, the fault's code
        included: what an eager test of the faulty code would see."""
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {fault!r}")
        self._bound: dict[DraftShape, StepBuffers] = {}  # each shape's buffers as bound before any capture
        self._elsewhere: dict[DraftShape, torch.Tensor] = {}  # stale-features: where its catch-up lands
        super().__init__(target, drafter, **engine_args)
        self.fault = fault
        self.stand_in = replay and self.mode != "cudagraph"
        self.captures = self.stand_in or self.mode == "cudagraph"

    @classmethod
    def around(cls, engine: Engine, fault: str) -> "CaptureLab":
        """A lab engine on `engine`'s models and settings (its mode: a GPU's graphs or the stand-in)."""
        return cls(engine.target, engine.drafter, fault=fault, mode=engine.mode, compile=engine.compile,
                   max_context=engine.max_context, drafter_dtype=engine.drafter_dtype,
                   drafter_int8=engine.drafter_int8)

    def describe(self) -> dict:
        return {**super().describe(), "capture": capture_label(self.mode) if self.captures else "eager",
                "fault": self.fault}

    def set_drafter(self, drafter) -> None:
        super().set_drafter(drafter)
        self._bound = {s: b for s, b in self._bound.items() if s.depth == 0}

    # ------------------------------------------------------------------ steps over the captured binding
    def _allocate(self, shape: DraftShape) -> StepBuffers:
        b = super()._allocate(shape)
        self._bound[shape] = copy.copy(b)  # the binding every capture (graph or stand-in) sees
        if b.catch_features is not None:
            self._elsewhere[shape] = torch.zeros_like(b.catch_features)
        return b

    def _replayed(self, b: StepBuffers) -> StepBuffers:
        """The buffers a captured step runs over: those bound before capture, in a copy of its own."""
        return copy.copy(self._bound[b.shape]) if self.captures else b

    def _prefill_forward(self, b: StepBuffers, rows: int, attend: int | None = None) -> torch.Tensor:
        return super()._prefill_forward(self._replayed(b), rows, attend)

    def _propose(self, b: StepBuffers, attend: int | None = None):
        super()._propose(self._replayed(b), attend)

    def _verify_forward(self, b: StepBuffers, attend: int | None = None):
        return super()._verify_forward(self._replayed(b), attend)

    def _acceptance(self, b: StepBuffers):
        accept = super()._acceptance(b)
        if self.fault == "stale-features":
            accept = rebinding_features(accept, self._elsewhere)
        if not self.captures:
            return accept
        return lambda b, logits, features, params: accept(self._replayed(b), logits, features, params)

    # ------------------------------------------------------------------ draft-shape
    def _chain(self, b: StepBuffers, attend: int | None = None):
        if self.fault == "draft-shape" and self.captures and b.k > CAPTURED_DEPTH:
            b = replace(b, shape=DraftShape(CAPTURED_DEPTH, 1, CAPTURED_DEPTH))  # the same tensors, drafted 1 deep
        super()._chain(b, attend)


def rebinding_features(accept, elsewhere: dict):
    """The stale-features fault around an acceptance test: the step's catch-up features land in another
    tensor bound to the name (`elsewhere`, the shape's), not in the persistent buffer (what
    `b.catch_features = features` did). Eagerly the next step reads the name and finds them."""
    def faulted(b: StepBuffers, logits, features, params):
        if b.k:  # target-only steps have no features to keep
            b.catch_features = elsewhere[b.shape]  # the fault: rebound, where the engine copies
        accept(b, logits, features, params)
    return faulted
