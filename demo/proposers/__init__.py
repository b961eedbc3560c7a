"""Proposers: one per drafting method, each owning its proposal (vLLM's v1/spec_decode has one class
per family, ``EagleProposer``, ``NgramProposer``, ``MedusaProposer``, and the model runner only
calls ``propose()``). The engine (demo/engine.py) is the loop that calls them.

The contract, duck-typed. A proposer works over a draft shape's persistent buffers
(demo/step_buffers.py ``StepBuffers``), never with a host sync and with static shapes, so that the
same code runs eagerly, under CUDA-graph capture and compiled:

- ``method``: its name in the registry (demo/methods.py), and ``features``: which of the target's
  outputs it reads after each verification: None (none), ``()`` (the final normed hidden state) or
  aux layer ids (the residual streams entering them).
- ``bind(target, max_context)``: set up for a target (its own caches, a drafter's device and dtype).
- ``allocate(shape, target) -> state``: its own persistent tensors for a shape (None: none), kept on
  the buffers as ``StepBuffers.draft`` and restored with them before each capture.
- ``prefill(b, ids, positions, features, rows, attend)``: after the target's prefill over the
  prompt (padded to `rows`): what it keeps of the prompt (a drafter's cache); ``first(b, token,
  prompt_length)``: the prefill's token, staged for the first proposal.
- ``propose(b, attend)``: the step's draft, written into the buffers: a chain's k tokens into
  ``verify_tokens[:, 1:]``; a tree's tokens, parents, depths, log q (and q, where drafts are
  sampled) into ``verify_tokens`` and ``b.tree``.
- ``accepted(b, tokens, positions, n, features)``: what the verification emitted (`tokens` [R+1],
  at `positions` [1, R+1], `n` accepted, the target's `features` [1, R+1, F] there), staged for the
  next proposal. The token history (``StepBuffers.history``) is the engine's: every proposer may
  read it.
- ``chain_candidates(b) -> (q [k], ids [k, TOP_SHOWN], q [k, TOP_SHOWN])``: each chain draft's q and
  the proposer's other candidates at its position, for the step inspector (q < 0: none kept).
- ``phases(b, attend) -> {name: fn}``: the proposal as its phases, in order (demo.engine.PHASES'
  names), for the profiler; ``stack_weights()``: before the engine compiles or captures;
  ``drafting_vocab`` and ``to_target(ids)``: the ids a draft is drawn from, mapped to the target's;
  ``reads_history``: whether it reads the token history; ``trees``: whether it drafts trees as well as
  chains; ``samples_drafts``: whether its drafts may be draws from its q at T > 0 (False: point
  masses, for which the draft-sampling rules coincide); ``copies``: whether its drafts are copies of the
  text (the event's tree then marks every draft copied).

``proposer_for(method, drafter)`` makes the proposer of a method of the registry.
"""

from __future__ import annotations

from demo.proposers.eagle import EagleProposer
from demo.proposers.ngram import NgramProposer

__all__ = ["EagleProposer", "NgramProposer", "proposer_for"]


PROPOSERS = {"drafter": EagleProposer, "ngram": NgramProposer}  # demo.methods.Method.proposer -> its class


def proposer_for(method: str, drafter=None):
    """The proposer of `method` (demo.methods.REGISTRY): None for the target alone, its class made
    around `drafter` for a method that loads one, or on its own."""
    from demo.methods import REGISTRY

    spec = REGISTRY[method]
    if spec.proposer is None:
        return None
    if spec.needs_drafter:
        if drafter is None:
            raise ValueError(f"{spec.label} needs a drafter, and none is loaded")
        return PROPOSERS[spec.proposer](drafter)
    return PROPOSERS[spec.proposer]()
