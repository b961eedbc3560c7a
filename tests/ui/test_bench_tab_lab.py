"""The Benchmark tab's capture lab in a local app (tests/tiny_chat.py's feature_session, whose drafter
drafts from the target's features), driven as the page drives it (Gradio's queue,
tests/service/http_app.py): the fault switch adds the captured runs, the table's parity column passes the
unfaulted one and flags the faulted one, and the panel shows the same reply from each. No weights, no GPU."""

from __future__ import annotations

import httpx

from demo.bench.plan import BUNDLED_PROMPTS, pick_prompts
from demo.models.prompts import read_questions
from demo.service.hosting import Hosting
from demo.views import build_demo
from tests.html_text import shown
from tests.service.http_app import client, serve, ui_event
from tests.tiny_chat import feature_session


def test_a_local_benchmark_with_the_fault_switch_shows_the_parity_check_and_the_replies_side_by_side():
    first = pick_prompts(read_questions(BUNDLED_PROMPTS), 1)[0]["turns"][0]  # the tab's first prompt: the oracle's
    demo = build_demo(feature_session(prompt=first, max_new_tokens=12), Hosting(public=False))
    url = serve(demo, Hosting(public=False))
    try:
        values = {"sl-bench-methods": ["eagle"], "sl-bench-ks": [3], "sl-bench-num-prompts": 1,
                  "sl-bench-max-new": 12, "sl-bench-faults": ["stale-features", "none"]}
        with httpx.Client() as http:
            out = ui_event(http, url, demo, "run_benchmark", "lab-a", client(1), values)
    finally:
        demo.close()
    assert "error" not in out, out
    summary = {row[0]: row for row in out["sl-bench-summary"]["data"]}
    assert list(summary) == ["EAGLE k=3 · eager", "EAGLE k=3 · replayed · no fault",
                             "EAGLE k=3 · replayed · fault: stale features"]
    assert summary["EAGLE k=3 · eager"][-1] == "-"
    assert summary["EAGLE k=3 · replayed · no fault"][-1] == "✓ equal to eager"
    assert summary["EAGLE k=3 · replayed · fault: stale features"][-1].startswith("✗ draft 1 -")
    assert summary["EAGLE k=3 · replayed · fault: stale features"][3] < summary["EAGLE k=3 · eager"][3]
    panel = shown(out["sl-bench-lab"]).text
    assert "the parity check flags it (✗)" in panel and panel.count("✓ the same 12 tokens as eager's") == 2
