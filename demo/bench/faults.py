"""The capture lab's vocabulary, plain names only (no torch: the bench's config, the report and the UI
read them): the capture faults a learner can switch on, their labels, and what each did.

SpecLens comes from vLLM's change that put the EAGLE-3 drafter under torch.compile and CUDA graphs;
its reviewers found the drafter left out of capture, and acceptance fell from 3.52 to 2.79 tokens
per step on MT-bench while the output stayed correct. This project met the same kind of bug: the
catch-up features were rebound instead of copied, so a captured step drafted from stale features.
Verification keeps every such fault out of the text; only acceptance (and so speed) shows it, which
is why demo/bench/parity.py holds a captured run's acceptance counts to eager's.

- ``none``: the steps captured and replayed, no fault (its counts are eager's).
- ``stale-features``: the acceptance test binds each step's catch-up features to the name
  (``b.catch_features = new``) instead of copying them into the persistent buffer
  (``b.catch_features.copy_(...)``), as the engine once did. Eager mode reads the name again each
  step and never notices; a captured step keeps reading the buffer it captured, which nothing
  writes any more, so the drafter drafts from stale features.
- ``draft-shape``: the drafter's part of a chain step captured at k = CAPTURED_DEPTH and replayed
  in a step of k: it writes one draft, the verification reads k, and drafts 2..k are whatever the
  draft buffer held. Only a captured step can be of another shape: eager builds each step at its k.

The engine that runs them is demo/bench/capture_lab.py's ``lab_engine``.
"""

from __future__ import annotations

FAULTS = ("none", "stale-features", "draft-shape")
FAULT_LABELS = {"none": "no fault", "stale-features": "catch-up features rebound, not copied",
                "draft-shape": "drafter captured at k = 1"}
FAULT_SHORT = {"none": "no fault", "stale-features": "fault: stale features", "draft-shape": "fault: draft shape"}
CAPTURED_DEPTH = 1  # draft-shape: the chain depth the drafter's step was captured at

# what a learner reads beside a faulted run: what went wrong, and why the text is still the target's
FAULT_STORIES = {
    "none": "Replayed without a fault: every step reads and writes the buffers it was captured with, so "
            "its acceptance counts are eager's, draft for draft.",
    "stale-features": "Each step the drafter starts from the target's features of the tokens the last "
                      "verification emitted, kept in one persistent buffer that the step copies them into. "
                      "With this fault the step binds a new tensor to the name instead of copying. Eager mode "
                      "looks the name up again every step and never notices; a captured step (a CUDA graph, or "
                      "this CPU stand-in) reads the buffer it saw at capture, which nothing writes any more: the "
                      "drafter drafts from stale features, and fewer drafts pass.",
    "draft-shape": "The drafter's part of the step was captured for a chain of 1 and replayed in a step of k: "
                   "it writes one draft, the verification reads k, and drafts 2..k are whatever the draft "
                   "buffer held. Draft 1 passes as often as before; the others almost never.",
}
LOSSLESS = ("Why the reply is unchanged: the target verifies every draft and keeps only those equal to its own "
            "choice (at T = 0, its argmax), then adds a token of its own. A bad draft costs time, never a token, "
            "so the text is target-only's either way; only the acceptance counts, and the speed, show the fault. "
            "That is why the parity check holds a captured run's counts to eager's: vLLM's EAGLE-3 drafter, left "
            "out of graph capture, fell from 3.52 to 2.79 tokens per step on MT-bench with correct output.")


def capture_label(mode: str) -> str:
    """How the lab captures in `mode`: the engine's CUDA graphs, or the CPU stand-in."""
    return "CUDA graph" if mode == "cudagraph" else "replayed"


def check_fault(fault: str, k: int, tree: bool) -> None:
    """Refuse a fault that cannot act on this run (ValueError, one sentence)."""
    if fault not in FAULTS:
        raise ValueError(f"the capture fault must be one of {', '.join(FAULTS)}, not {fault!r}")
    if k == 0:
        raise ValueError("a capture fault acts on the drafter's step: target-only has none")
    if fault == "draft-shape" and tree:
        raise ValueError("the draft-shape fault replays a chain's drafting: draft a chain (no tree)")
