"""The parity check: a captured run's acceptance counts against eager's on the same prompts, pure
functions of two bench reports (demo/bench/measure.py).

Graph mode must change nothing but time: at T = 0 a captured step drafts what the eager step drafts,
so the two runs take the same steps and accept the same drafts, count for count. The text cannot
tell a capture fault apart (verification keeps every bad draft out of it); these counts can. Where
they differ the check names the draft positions and by how many (demo/bench/faults.py's faults).
"""

from __future__ import annotations


def _key(record: dict) -> tuple:
    return record.get("question_id"), record.get("turn"), record.get("prompt_tokens")


def _per_position(stats: dict) -> list[int]:
    """A record's steps with at least i+1 drafts accepted (its summary keeps the shares)."""
    return [round(a * stats["num_drafts"]) for a in stats["acceptance_per_position"]]


def _prompt_counts(record: dict) -> tuple:
    s = record["stats"]
    return s["num_drafts"], s["num_accepted_tokens"], _per_position(s)


def parity(eager: dict, captured: dict) -> dict:
    """`captured`'s counts against `eager`'s (bench reports of the same prompts, JSON-ready): equal or
    not, the draft positions whose accepted counts differ, the drafting steps and accepted drafts of
    each, how many prompts' counts differ, and on how many the text is the same. Raises ValueError
    when the reports decoded different prompts."""
    if [_key(r) for r in eager["records"]] != [_key(r) for r in captured["records"]]:
        raise ValueError("the parity check compares runs of the same prompts; these decoded different ones")
    a, b = eager["totals"]["counts"], captured["totals"]["counts"]
    positions = [{"draft": i, "eager": x, "captured": y}
                 for i, (x, y) in enumerate(zip(a["accepted_per_position"], b["accepted_per_position"]), 1) if x != y]
    pairs = list(zip(eager["records"], captured["records"]))
    differing = sum(_prompt_counts(x) != _prompt_counts(y) for x, y in pairs)
    steps, accepted = [a["num_drafts"], b["num_drafts"]], [a["num_accepted_tokens"], b["num_accepted_tokens"]]
    return {"equal": not positions and steps[0] == steps[1] and accepted[0] == accepted[1] and not differing,
            "positions": positions, "drafting_steps": steps, "accepted": accepted,
            "mean_acceptance_length": [1 + n / s if s else 1.0 for n, s in zip(accepted, steps)],
            "prompts": len(pairs), "prompts_differing": differing,
            "identical_text": sum(x["token_ids"] == y["token_ids"] for x, y in pairs)}


def parity_sentence(p: dict) -> str:
    """The check in one line, as the bench prints it and the Benchmark tab shows it."""
    n = p["prompts"]
    if p["equal"]:
        return (f"parity: acceptance counts equal to eager's on {n} prompt{'s' if n != 1 else ''} "
                f"({p['drafting_steps'][0]} drafting steps, {p['accepted'][0]} accepted drafts)")
    where = ", ".join(f"draft {d['draft']} {d['eager']} vs {d['captured']} ({d['captured'] - d['eager']:+d})"
                      for d in p["positions"]) or "the same totals"
    (s0, s1), (m0, m1) = p["drafting_steps"], p["mean_acceptance_length"]
    return (f"parity: differs from eager's on {p['prompts_differing']} of {n} prompts: accepted at {where}; "
            f"{s0} vs {s1} drafting steps, mean acceptance length {m0:.2f} vs {m1:.2f}; "
            f"text identical on {p['identical_text']} of {n}")


def parity_cell(p: dict | None) -> str:
    """A table cell: "-" for a run that captures nothing, else ✓ or ✗ with the positions that differ."""
    if p is None:
        return "-"
    if p["equal"]:
        return "✓ equal to eager"
    where = ", ".join(f"draft {d['draft']} {d['captured'] - d['eager']:+d}" for d in p["positions"]) or "per prompt"
    return f"✗ {where}; text identical {p['identical_text']}/{p['prompts']}"
