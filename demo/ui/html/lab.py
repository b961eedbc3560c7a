"""The capture lab's panel of the Benchmark tab -> escaped HTML, a pure function of a run's reports and
summary rows (demo/bench/plan.py): what each capture fault did to acceptance and speed while the text
stayed the same, why, and the first prompt's replies side by side, eager beside each captured run,
each with its numbers and its parity check (demo/bench/parity.py).
"""

from __future__ import annotations

from demo.bench.config import BenchConfig
from demo.bench.faults import FAULT_LABELS, FAULT_STORIES, LOSSLESS
from demo.bench.parity import parity_cell
from demo.bench.plan import eager_report
from demo.service.chat import first_difference
from demo.ui.html.render import escape


def _label(config: dict) -> str:
    return BenchConfig(method=config["method"], mode=config["mode"], num_spec_tokens=config["k"],
                       fault=config.get("fault")).label


def _shares(values: list[float]) -> str:
    return " · ".join(f"{a:.2f}" for a in values) or "-"


def fault_summary(row: dict, eager: dict) -> str:
    """One captured row against its eager row, in a sentence: acceptance, speed, text, the check."""
    p = row["parity"]
    verdict = "the parity check passes (✓)" if p["equal"] else "the parity check flags it (✗)"
    return (f"<b>{escape(_label(row))}</b>: mean acceptance length {eager['mean_acceptance_length']:.2f} → "
            f"{row['mean_acceptance_length']:.2f}, acceptance at draft 1..{row['k']} "
            f"{_shares(eager['acceptance_per_position'])} → {_shares(row['acceptance_per_position'])}, "
            f"{eager['tokens_per_s']:.1f} → {row['tokens_per_s']:.1f} tokens/s; text identical to eager's on "
            f"{p['identical_text']} of {p['prompts']} prompts: {verdict}.")


def render_lane(report: dict, row: dict, eager: dict | None) -> str:
    """One run's reply to the first prompt, with that reply's numbers, the run's parity check, and
    whether the reply is eager's token for token (`eager`: the eager report; None: this is it)."""
    record = report["records"][0]
    s = record["stats"]
    numbers = (f"mean acceptance length {s['mean_acceptance_length']:.2f} · acceptance at draft 1..{row['k']}: "
               f"{_shares(s['acceptance_per_position'])} · {s['tokens_per_s']:.1f} tokens/s")
    if eager is None:
        check, same, kind = "eager: the reference", "", "sl-lab-ref"
    else:
        diff = first_difference(eager["records"][0]["token_ids"], record["token_ids"])
        same = (f"✓ the same {len(record['token_ids'])} tokens as eager's" if diff is None
                else f"✗ differs from eager's at token {diff}")
        check = "parity: " + parity_cell(row["parity"])
        kind = "sl-lab-ok" if row["parity"] and row["parity"]["equal"] else "sl-lab-bad"
    return (f'<div class="sl-lab-lane {kind}"><div class="sl-lab-head"><b>{escape(_label(row))}</b></div>'
            f'<div class="sl-lab-numbers">{escape(numbers)}</div><div class="sl-lab-check">{escape(check)}</div>'
            + (f'<div class="sl-lab-same">{escape(same)}</div>' if same else "")
            + f'<div class="sl-lab-text">{escape(record["text"])}</div></div>')


def render_lab(reports: list[dict], rows: list[dict]) -> str:
    """The panel after a run with capture-lab rows ('' without any): per faulted row a sentence, what
    each fault did and why the text holds, then per drafting configuration the first prompt's replies."""
    by_config = list(zip(reports, rows))
    lab = [(r, row) for r, row in by_config if row["fault"] is not None and row["parity"] is not None]
    if not lab:
        return ""
    row_of = {id(r): row for r, row in by_config}
    parts = ['<div class="sl-lab"><h4>Capture lab: the same prompts with the fault off and on</h4><ul>']
    for r, row in lab:
        parts.append(f"<li>{fault_summary(row, row_of[id(eager_report(reports, r['totals']['config']))])}</li>")
    parts.append("</ul>")
    for fault in dict.fromkeys(row["fault"] for _, row in lab):
        parts.append(f'<p class="sl-lab-story"><b>{escape(FAULT_LABELS[fault])}</b>: {escape(FAULT_STORIES[fault])}</p>')
    parts.append(f'<p class="sl-lab-story">{escape(LOSSLESS)}</p>')
    groups: dict[tuple, list] = {}
    for r, row in lab:
        groups.setdefault((row["method"], row["k"]), []).append((r, row))
    for runs in groups.values():
        eager = eager_report(reports, runs[0][0]["totals"]["config"])
        question = eager["records"][0]
        parts.append(f'<div class="sl-lab-prompt">Question {escape(str(question["question_id"]))} '
                     f"({escape(str(question['category']))}), its reply from each run:</div>"
                     '<div class="sl-lab-lanes">' + render_lane(eager, row_of[id(eager)], None)
                     + "".join(render_lane(r, row, eager) for r, row in runs) + "</div>")
    return "".join(parts) + "</div>"
