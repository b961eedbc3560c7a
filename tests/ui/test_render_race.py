"""The race panel's HTML (demo/ui/html/race.py) from hand-made runs: each lane shows what its run had
emitted by then, and the finish says the speedup in engine time, tokens per target call and the
T = 0 identity."""

from __future__ import annotations

from demo.service.chat import Comparison, TokenPiece, Turn
from demo.ui.html.race import render_race, render_race_hint
from demo.ui.html.render import render_comparison
from tests.ui.test_replay import hand_trace


def reply(steps: list[int], text: str = "ab") -> Turn:
    """A reply whose i-th token came from steps[i] (depth 1 for a draft-looking token on odd places)."""
    pieces = [TokenPiece(i, text, step, i % 2, 0.9) for i, step in enumerate(steps)]
    return Turn("assistant", text * len(steps), pieces, label="tiny · EAGLE-3 (k = 3) · eager")


SPEC = hand_trace([0.2, 0.3], [4, 4], [3, 3])  # 9 tokens: prefill 1, then 4 and 4
BASE = hand_trace([0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5], [1] * 8, [0] * 8, k=0)  # 9 tokens, 1 per step
SPEC_REPLY = reply([0] + [1] * 4 + [2] * 4)
BASE_REPLY = reply(list(range(9)))


def comparison(identical=True, first=None) -> Comparison:
    return Comparison.of(SPEC, BASE, identical is not None, identical, first, BASE_REPLY)


def test_each_lane_shows_the_tokens_its_run_had_emitted_after_that_step():
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.2, (1, 2), None)
    spec_lane, base_lane = html.split('class="sl-lane ')[1:]
    assert spec_lane.count("sl-tok") == 5 and "5 tokens · 1 target calls (+ the prefill)" in spec_lane
    assert base_lane.count("sl-tok") == 3 and "3 tokens · 2 target calls (+ the prefill)" in base_lane
    assert "finished" not in html and "sl-race-summary" not in html
    assert "engine time 0.20 s" in html and "slower" not in html


def test_a_slowed_race_says_so_on_its_clock():
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.2, (1, 2), None, slowdown=11.6)
    assert "engine time 0.20 s · shown 12× slower than it ran" in html
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.2, (1, 2), None, slowdown=1.25)
    assert "shown 1.2× slower than it ran" in html


def test_before_a_prefill_ends_its_lane_is_empty():
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.0, (-1, -1), comparison())
    assert "sl-tok" not in html and html.count("0 tokens · 0 target calls") == 2


def test_a_finished_lane_says_when_and_the_finish_sums_up_the_race():
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.3, (2, 4), comparison())
    assert "finished at 0.30 s" in html and "sl-race-summary" not in html  # target only still running
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.5, (2, 8), comparison())
    assert "1.67×" in html and "tokens/s of engine time" in html  # (9 / 0.3) / (9 / 0.5)
    assert "4.00 vs 1.00 tokens per target call" in html  # the prefill aside, as the headline counts
    assert "6 accepted drafts + 2 target tokens + 1 from the prefill = 9 tokens in 2 target calls" in html
    assert "✓ T = 0: the same 9 tokens" in html


def test_the_finish_reports_a_difference_and_makes_no_claim_when_sampling():
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.5, (2, 8), comparison(False, 4))
    assert "✗ T = 0: differs from target-only decoding at token 4" in html
    html = render_race("EAGLE-3", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.5, (2, 8), comparison(None))
    assert "T &gt; 0" in html and "✓" not in html


def test_lane_labels_are_escaped():
    html = render_race("<b>x</b>", SPEC_REPLY, SPEC, BASE_REPLY, BASE, 0.5, (2, 8), None)
    assert "<b>x</b>" not in html and "&lt;b&gt;" in html


def test_without_a_comparison_the_panel_says_how_to_get_one():
    assert "Compare with target-only" in render_race_hint()


def test_the_comparison_panel_says_it_compares_engine_time():
    html = render_comparison(2.0, 20.0, 10.0, True, None)
    assert "tokens/s of engine time" in html and "nothing drawn" in html
