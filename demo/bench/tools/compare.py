"""Compare bench runs of the same prompts against a reference run: are the tokens identical, where
do they first differ, and how far apart are the acceptance and the speed?

    python -m demo.compare runs/eagle3-eager.json runs/eagle3-graph.json runs/eagle3-compile.json
    python -m demo.compare runs/ceiling.json runs/eagle3.json     # a run of --ceiling first: the shares

The first file is the reference (eager, normally). This is how the project shows that graph mode
changes nothing but time, and how close a compiled graph's acceptance stays to eager's (the
regression vLLM's change caught). Against a ``--ceiling`` run (the target drafting for itself, q = p)
each run's acceptance is also given as a share of that ceiling: drafter quality told apart from the
rule's (at T > 0 the tokens differ, so "identical" counts nothing there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from demo.service.chat import first_difference


def compare(reference: dict, other: dict) -> dict:
    """Token identity per prompt and the totals of `other` against `reference` (bench reports)."""
    ref, got = reference["records"], other["records"]
    key = lambda r: (r.get("question_id"), r.get("turn"), r.get("prompt_tokens"))  # noqa: E731
    if [key(r) for r in ref] != [key(r) for r in got]:
        raise ValueError("the two runs decoded different prompts")
    diffs = [first_difference(a["token_ids"], b["token_ids"]) for a, b in zip(ref, got)]
    r_sum, o_sum = reference["totals"]["summary"], other["totals"]["summary"]
    mal_ref, mal = r_sum["mean_acceptance_length"], o_sum["mean_acceptance_length"]
    return {"identical": sum(d is None for d in diffs), "prompts": len(diffs),
            "first_differences": [(i, d) for i, d in enumerate(diffs) if d is not None],
            "mean_acceptance_length": mal, "reference_mean_acceptance_length": mal_ref,
            "relative_change": (mal - mal_ref) / mal_ref if mal_ref else 0.0,
            "tokens_per_s": o_sum["tokens_per_s"], "mean_draft_ms": o_sum["mean_draft_ms"],
            "mean_verify_ms": o_sum["mean_verify_ms"]}


def label(report: dict, path: str) -> str:
    c = report["totals"]["config"]
    compiled = c.get("compile")
    mode = c.get("mode", "?") + (("+compile(drafter)" if compiled == "drafter" else "+compile(all)") if compiled else "")
    return f"{c.get('method', '?')} {mode} ({Path(path).name})"


def markdown(rows: list[tuple[str, dict]]) -> str:
    head = "| run | identical to the reference | mean acceptance length | change | tokens/s | propose ms | verify ms |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for name, c in rows:
        lines.append(f"| {name} | {c['identical']}/{c['prompts']} | {c['mean_acceptance_length']:.3f} | "
                     f"{100 * c['relative_change']:+.2f}% | {c['tokens_per_s']:.1f} | {c['mean_draft_ms']:.2f} | "
                     f"{c['mean_verify_ms']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("reference", help="bench --json report to compare against (eager)")
    p.add_argument("others", nargs="+", help="bench --json reports of the same prompts")
    args = p.parse_args(argv)
    try:
        reports = [(f, json.loads(Path(f).read_text())) for f in [args.reference, *args.others]]
        ref = reports[0][1]
        rows = [(label(r, f), compare(ref, r)) for f, r in reports]
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(rows))
    if ref["totals"]["config"].get("ceiling"):
        for name, c in rows[1:]:
            share = c["mean_acceptance_length"] / c["reference_mean_acceptance_length"]
            print(f"{name}: {100 * share:.0f} % of the ceiling ({c['mean_acceptance_length']:.2f} of "
                  f"{c['reference_mean_acceptance_length']:.2f} tokens a step)")
    for name, c in rows:
        if c["first_differences"]:
            where = ", ".join(f"prompt {i} at token {d}" for i, d in c["first_differences"][:8])
            print(f"{name}: diverged on {where}")
    return 0
