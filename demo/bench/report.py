"""What a measurement prints: the bench's report (vLLM's acceptance table, then tokens/s and
propose/verify time per step), per category rows, and shape labels; pure functions of a report.
"""

from __future__ import annotations

from demo.bench.faults import FAULT_SHORT, capture_label
from demo.bench.parity import parity_sentence
from demo.kernels.runtime import DEFAULT_KERNELS
from demo.methods import mode_label


def shape_label(config: dict, short: bool = False) -> str:
    """"k=7", or "tree depth 6 x top-8, 64 tokens verified per step" (with "drafts sampled from q", and
    "without replacement"; "(the default on cpu)" where the bench chose the device's default draft,
    config["shape_default_on"]). A tree of top-1 is a chain (sampled chains run on the tree machinery).
    short: the shape alone as a table row names it, "k=7" or "tree 6 × 8, 64" (depth × top-k, tokens
    verified per step, the root included)."""
    shape = config.get("shape") or {}
    if not shape.get("tree") or shape.get("topk") == 1:
        label = f"k={config['k']}"
    elif short:
        label = f"tree {shape['depth']} × {shape['topk']}, {shape['nodes'] + 1}"
    else:
        label = f"tree depth {shape['depth']} x top-{shape['topk']}, {shape['nodes'] + 1} tokens verified per step"
    if shape.get("lookup"):
        label += f" + lookup {shape['lookup']}" if short else f", and a lookup branch of {shape['lookup']}"
    rule = shape.get("rule", "pointmass")  # reports written before the Rule type: two booleans
    if (rule != "pointmass" or shape.get("sampled")) and not short:
        label += ", drafts sampled from q" + (" without replacement" if rule == "wor" or shape.get("without_replacement")
                                             else "")
    if config.get("shape_default_on") and not short:
        label += f" (the default on {config['shape_default_on']})"
    return label


def category_rows(records: list[dict]) -> list[dict]:
    """Per prompt category: prompts, generated tokens, mean acceptance length (1 + accepted / drafts)
    and tokens/s."""
    rows = {}
    for r in records:
        s, row = r["stats"], rows.setdefault(r.get("category") or "-", dict(prompts=0, drafts=0, accepted=0,
                                                                           tokens=0, seconds=0.0))
        row["prompts"] += 1
        row["drafts"] += s["num_drafts"]
        row["accepted"] += s["num_accepted_tokens"]
        row["tokens"] += s["num_generated"]
        row["seconds"] += s["elapsed_s"]
    return [{"category": name, "prompts": row["prompts"], "generated_tokens": row["tokens"],
             "mean_acceptance_length": 1 + row["accepted"] / row["drafts"] if row["drafts"] else 1.0,
             "tokens_per_s": row["tokens"] / row["seconds"] if row["seconds"] else 0.0}
            for name, row in sorted(rows.items())]


def format_report(report: dict) -> str:
    """The text main prints; ends with the acceptance table, then tokens/s and ms per step."""
    from demo.metrics import AcceptanceStats

    t, c = report["totals"], report["totals"]["config"]
    stats = AcceptanceStats.from_counts(t["counts"])
    drafter = f", drafter {c['drafter']}" if c["drafter"] else ""
    if c.get("draft_vocab"):
        drafter += f" (drafting over {c['draft_vocab']:,} tokens)"
    if c.get("drafter_dtype") and c["drafter_dtype"] != c["dtype"]:
        drafter += f" in {c['drafter_dtype']}"
    mode = mode_label(c["mode"], c["compile"])
    if c.get("fault") is not None:  # the capture lab's engine
        mode = f"capture lab: {mode.replace(c['mode'], capture_label(c['mode']), 1)}, {FAULT_SHORT[c['fault']]}"
    lines = [f"target {c['target_name']}{drafter}, method {c['method']}, {shape_label(c)}, {mode}, "
             f"{c['device']} {c['dtype']}" + (f" ({c['gpu']}, kernels {c.get('kernels', DEFAULT_KERNELS)})"
                                               if c["gpu"] else ""),
             f"{t['num_prompts']} prompts, max_new_tokens {c['max_new_tokens']}, temperature {c['temperature']}"
             + (f", draft sampling {c['draft_sampling']}" if c["temperature"] > 0 else ""),
             f"warm-up: {c['warmup']} generation(s) in {t['warmup_s']:.2f} s "
             f"(graph capture/compile {t['capture_s']:.2f} s), not counted"]
    if c.get("ceiling"):
        lines.append("ceiling: the target drafts for itself (q = p), so this is what the rule accepts with a perfect "
                     "drafter; a drafter's mean acceptance length over this one is its share of the ceiling")
    if "lossless" in t:
        ll = t["lossless"]
        if ll["first_divergence"] is None:
            lines.append(f"lossless: identical ({ll['identical']}/{ll['total']} prompts)")
        else:
            d = ll["first_divergence"]
            lines.append(f"lossless: diverged ({ll['total'] - ll['identical']}/{ll['total']} prompts differ; first: "
                         f"question {d['question_id']} turn {d['turn']} at generated token {d['position']})")
        if c["k"]:
            base, width = t["target_only"]["tokens_per_s"], ll.get("target_only_width", 1)
            if width > 1:  # the exact reference is slower than target-only at its best: no speedup from it
                lines.append(f"target-only, run {width} rows wide as the exact reference in {c['dtype']}: "
                             f"{base:.1f} tokens/s (its speed is not target-only's best; run --method none)")
            else:
                speedup = f", speedup {stats.tokens_per_s / base:.2f}x" if base > 0 else ""
                lines.append(f"target-only: {base:.1f} tokens/s{speedup}")
    if "parity" in t:
        lines.append(parity_sentence(t["parity"]))
    categories = t.get("categories") or []
    if len(categories) > 1:
        lines.append("by category: " + ", ".join(f"{r['category']} {r['mean_acceptance_length']:.2f} "
                                                 f"({r['prompts']})" for r in categories))
    lines.append(stats.format_table())
    if stats.steps_after_full or stats.steps_after_rejection:
        split = ["-" if r is None else f"{r:.2f}" for r in (stats.acceptance_at_0_after_full,
                                                              stats.acceptance_at_0_after_rejection)]
        lines.append(f"acceptance at draft 1 after a full step: {split[0]} ({stats.steps_after_full} steps), "
                     f"after a rejected step: {split[1]} ({stats.steps_after_rejection} steps)")
    lines.append(f"tokens/s: {stats.tokens_per_s:.1f} ({stats.num_generated} tokens in {stats.elapsed_s:.2f} s "
                 "of engine time)")
    lines.append(f"propose: {stats.mean_draft_ms:.2f} ms/step, verify: {stats.mean_verify_ms:.2f} ms/step "
                 f"({stats.num_steps} steps; prefill {stats.prefill_ms / max(t['num_prompts'], 1):.2f} ms/prompt)")
    return "\n".join(lines)
