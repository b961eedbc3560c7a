"""The capture lab's panel (demo/ui/html/lab.py), a pure function of hand-made reports: the fault's fall
in one sentence with the text still eager's, what the fault did and why the text holds, and the first
prompt's replies side by side with their numbers and checks; nothing for a run without the lab; and
the Benchmark tab of a public app offers no fault switch."""

from __future__ import annotations

from demo.bench.faults import FAULT_STORIES, LOSSLESS
from demo.bench.plan import summary_rows
from demo.service.hosting import Hosting
from demo.ui.html.lab import render_lab
from demo.views import build_demo
from tests.html_text import shown as parsed
from tests.tiny_chat import tiny_session

TEXT = "The waves of the sea, a silent beauty"


def report(fault, steps: int, per_position: list[int], tokens: list[int], tokens_per_s: float) -> dict:
    stats = {"num_drafts": steps, "num_accepted_tokens": sum(per_position),
             "acceptance_per_position": [a / steps for a in per_position],
             "mean_acceptance_length": 1 + sum(per_position) / steps, "tokens_per_s": tokens_per_s,
             "num_generated": len(tokens), "mean_draft_ms": 1.0, "mean_verify_ms": 2.0}
    record = {"question_id": 7, "category": "writing", "turn": 1, "prompt_tokens": 30, "text": TEXT,
              "token_ids": tokens, "stats": stats}
    counts = {"num_drafts": steps, "num_accepted_tokens": sum(per_position), "accepted_per_position": per_position}
    return {"records": [record], "totals": {"config": {"method": "eagle3", "mode": "eager", "k": 3, "fault": fault},
                                            "num_prompts": 1, "summary": stats, "counts": counts}}


def test_a_fault_shows_its_fall_the_same_text_and_why():
    reports = [report(None, 10, [8, 5, 2], [1, 2, 3], 27.0), report("none", 10, [8, 5, 2], [1, 2, 3], 26.5),
               report("stale-features", 20, [3, 1, 0], [1, 2, 3], 18.0)]
    html = render_lab(reports, summary_rows(reports))
    shown = parsed(html).text
    assert ("EAGLE-3 k=3 · replayed · fault: stale features: mean acceptance length 2.50 → 1.20, acceptance at "
            "draft 1..3 0.80 · 0.50 · 0.20 → 0.15 · 0.05 · 0.00, 27.0 → 18.0 tokens/s; text identical to eager's "
            "on 1 of 1 prompts: the parity check flags it (✗).") in shown
    assert "the parity check passes (✓)" in shown  # replayed without a fault
    assert FAULT_STORIES["stale-features"] in shown and LOSSLESS in shown
    assert shown.count(TEXT) == 3  # the eager reply beside each captured run's
    assert "parity: ✗ draft 1 -5, draft 2 -4, draft 3 -2; text identical 1/1" in shown
    assert shown.count("✓ the same 3 tokens as eager's") == 2 and "eager: the reference" in shown
    assert html.count("sl-lab-bad") == 1 and html.count("sl-lab-ok") == 1


def test_a_run_without_the_lab_shows_no_panel():
    assert render_lab([report(None, 10, [8, 5, 2], [1, 2, 3], 27.0)], summary_rows([report(None, 10, [8, 5, 2],
                                                                                           [1, 2, 3], 27.0)])) == ""


def test_a_public_app_offers_no_fault_switch_and_a_local_one_does():
    ids = {Hosting(public=True): set(), Hosting(public=False): set()}
    for hosting in ids:
        demo = build_demo(tiny_session(), hosting)
        ids[hosting] = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
        demo.close()
    assert "sl-bench-faults" not in ids[Hosting(public=True)] and "sl-bench-lab" not in ids[Hosting(public=True)]
    assert {"sl-bench-faults", "sl-bench-lab"} <= ids[Hosting(public=False)]
