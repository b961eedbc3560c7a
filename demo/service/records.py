"""Keeping what was measured: a generation's trace as JSON and a benchmark's rows as CSV, as pure
functions of plain data (demo/service/chat.py's RunTrace and Turn, demo/bench/plan.py's rows), plus
``environment()``, the versions and commit that produced them.

A trace has one entry per decoding step, in the words of demo/metrics.py: step 0 is the prefill
(the target's first token); every later step lists its drafts (a chain is a tree whose nodes each
hang from the one before: ``parents``), with q (the drafter's probability of each draft) and p (the
target's), the accepted path, the tokens it emitted (accepted drafts by depth, then the target's own
token, depth 0) with their probability under the target, and its draft and verify time.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import subprocess
from dataclasses import asdict
from functools import cache
from pathlib import Path

from demo.service.chat import RunTrace, Turn

TRACE_FORMAT = "speclens-trace/1"
REPO_ROOT = Path(__file__).resolve().parents[2]


def trace_record(trace: RunTrace, reply: Turn, *, messages: list[dict], token_text: dict[int, str],
                 environment: dict) -> dict:
    """The trace of the run that wrote `reply`, as JSON-ready data. messages: the conversation the
    reply answers ([{"role", "content"}]); token_text: the text of each draft token id, decoded alone;
    environment: ``environment()`` and the device. An emitted token's text is what it added to the
    reply, so the emitted texts in order are the reply."""
    text = lambda i: token_text.get(i, "")  # noqa: E731
    pieces: dict[int, list[dict]] = {}
    for piece in reply.pieces:
        pieces.setdefault(piece.step, []).append({"id": piece.token_id, "text": piece.text,
                                                  "p": piece.prob, "depth": piece.depth,
                                                  "resampled": piece.resampled})
    steps = [{"step": 0, "what": "prefill: the target's first token", "emitted": pieces.get(0, []),
              "verify_ms": trace.stats.prefill_ms}]
    trees = iter(trace.trees)
    for point in trace.points:
        tree = next(trees) if point.reach else None  # trees[i] is the i-th step that drafted
        step = {"step": point.step, "drafts": None, "accepted": point.num_accepted,
                "emitted": pieces.get(point.step, []), "draft_ms": point.draft_ms, "verify_ms": point.verify_ms,
                "elapsed_s": point.elapsed_s, "tokens_per_s": point.tokens_per_s}
        if tree is not None:
            step["drafts"] = {"ids": tree.tokens, "texts": [text(i) for i in tree.tokens], "parents": tree.parents,
                              "depths": tree.depths, "q": tree.draft_probs, "p": tree.target_probs,
                              "accepted_path": tree.path, "copied": tree.copied}  # the last `copied`: the prompt lookup's
        steps.append(step)
    return {"format": TRACE_FORMAT, "settings": trace.settings or {"method": trace.method, "mode": trace.mode,
                                                                  "num_spec_tokens": trace.num_spec_tokens},
            "environment": environment, "messages": messages, "reply": reply.text, "reply_state": reply.state,
            "finish_reason": trace.finish_reason, "totals": trace.stats.summary(), "counts": asdict(trace.stats),
            "steps": steps}


def trace_json(trace: RunTrace, reply: Turn, **context) -> str:
    """``trace_record`` as JSON text (keyword arguments as trace_record's)."""
    return json.dumps(trace_record(trace, reply, **context), indent=1, ensure_ascii=False) + "\n"


@cache
def speclens_commit() -> str | None:
    """The git commit this code was checked out at, or None (no git, or not a checkout: a Space's copy)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip() if done.returncode == 0 else ""
    return commit or None


def environment(**extra) -> dict:
    """Versions of what measured (torch, transformers, gradio, python), the speclens commit, and `extra`
    (the device, dtype and models the caller knows)."""
    import gradio
    import torch
    import transformers

    return {"speclens_commit": speclens_commit(), "torch": torch.__version__, "transformers": transformers.__version__,
            "gradio": gradio.__version__, "python": platform.python_version(), **extra}


# ---------------------------------------------------------------------- benchmark CSV
CSV_COLUMNS = ["method", "mode", "k", "tree_topk", "num_draft_tokens", "lookup", "fault", "category", "prompts",
               "generated_tokens",
               "mean_acceptance_length", "tokens_per_s", "speedup", "mean_draft_ms", "mean_verify_ms", "parity"]


def bench_csv(summary: list[dict], categories: list[dict]) -> str:
    """A benchmark as CSV: per configuration its totals (category "all", with acceptance at draft
    1..k as acceptance_at_draft_i) and, for a captured run, the parity check in a sentence, then its
    rows per prompt category; a tree's tree_topk, num_draft_tokens and lookup (the bench's flags; k its depth)
    are empty for a chain; `fault` names a capture-lab run's fault. Empty cells: not measured or not
    one (a category has no speedup or step times of its own)."""
    depth = max((len(r["acceptance_per_position"]) for r in summary), default=0)
    columns = CSV_COLUMNS + [f"acceptance_at_draft_{i}" for i in range(1, depth + 1)]
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, restval="", extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in summary:
        writer.writerow({**row, "category": "all", "speedup": "" if row["speedup"] is None else row["speedup"],
                         "fault": row.get("fault") or "", "parity": row.get("parity_sentence") or "",
                         **{f"acceptance_at_draft_{i}": a for i, a in enumerate(row["acceptance_per_position"], 1)}})
    for row in categories:
        writer.writerow({**row, "fault": row.get("fault") or ""})
    return out.getvalue()
