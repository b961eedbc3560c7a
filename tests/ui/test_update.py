"""What the page shows of a finished reply (demo/ui/update.py): every line that counts the reply's
tokens says so where the last of them is a stop token the reply does not show."""

import dataclasses
import types

import pytest

from demo.engine import Engine
from demo.service.request import Request
from demo.ui.update import streamed
from tests.html_text import shown
from tests.tiny_chat import SPECIALS, tiny_session

# the outputs a finished reply draws, named as the page's components are
PAGE = types.SimpleNamespace(**{name: name for name in ("status", "chat", "conversation", "headline", "guide",
                                                        "stats", "comparison", "race", "tree", "tree_step")},
                             plots=["acceptance", "acceptance_length", "latency", "throughput"])


@pytest.fixture(scope="module")
def predictable():
    return tiny_session(predictable=True)


def finished(session, monkeypatch, ending: str | None, compare: bool = False) -> dict:
    """A reply of 6 tokens ("a" each) whose last is replaced by `ending`'s token and ended by it as a stop
    token (None: the budget ends it), drawn as the page draws a finished reply: {output: its text}."""
    generate = Engine.generate

    def ended(engine, ids, gen):
        events = list(generate(engine, ids, gen))
        if ending is not None:
            last = events[-1]
            (stop,) = session.tokenizer.convert_tokens_to_ids([ending])
            events[-1] = dataclasses.replace(last, token_ids=last.token_ids[:-1] + [stop], finish_reason="stop")
        yield from events

    monkeypatch.setattr(Engine, "generate", ended)
    update = list(session.generate(Request.of("hi", method="eagle", max_new_tokens=6, compare=compare)))[-1]
    assert update.done and update.chat.trace.stats.num_generated == 6
    out, _ = streamed(PAGE, session, update, None, text=True)
    return {name: shown(out[name]).text for name in ("status", "headline", "stats", "conversation", "race")}


def test_a_count_that_includes_a_hidden_end_of_turn_token_says_so_where_it_is_stated(predictable, monkeypatch):
    end = SPECIALS[1]  # <|im_end|>: the chat template's end of turn, a special token the text leaves out
    page = finished(predictable, monkeypatch, end)
    assert page["conversation"].endswith("eager" + "a" * 5)  # 5 of the 6 tokens are shown
    said = f"the last token, {end}, ends the turn and is not shown"
    for name in ("status", "headline"):
        assert f"= 6 tokens in " in page[name] and said in page[name], (name, page[name])
    assert f"tokens6 ({said})" in page["stats"], page["stats"]  # the tokens row: its count, then the clause


def test_the_race_s_lanes_and_finish_say_where_a_hidden_end_of_turn_token_is_counted(predictable, monkeypatch):
    end = SPECIALS[1]
    race = finished(predictable, monkeypatch, end, compare=True)["race"]
    said = f"the last token, {end}, ends the turn and is not shown"
    assert race.count(f"6 tokens ({said})") == 2, race  # each lane's count
    assert f"= 6 tokens in 2 target calls (+ the prefill); {said}" in race, race  # the finish's accounting


@pytest.mark.parametrize("ending", [None, "a"])
def test_a_reply_whose_every_token_is_shown_has_its_count_stated_plainly(predictable, monkeypatch, ending):
    page = finished(predictable, monkeypatch, ending)  # the budget ends it, or a stop token the text shows
    assert page["conversation"].endswith("eager" + "a" * 6)
    assert all("not shown" not in text for text in page.values()), page


def test_after_a_comparison_the_stream_s_speed_and_step_times_are_named_beside_the_timed_run_s(predictable):
    """The speedup is the timed run's (nothing drawn between its steps); the status, the stats panel
    and the two time charts, which show the stream slowed by drawing the page, say which is which."""
    update = list(predictable.generate(Request.of("hi", method="eagle", max_new_tokens=8, compare=True)))[-1]
    timed = update.chat.comparison.speculative_trace.stats
    out, _ = streamed(PAGE, predictable, update, None, text=True, figures=True)
    status, stats = shown(out["status"]).text, shown(out["stats"]).text
    assert f"as streamed, {timed.tokens_per_s:.1f} timed with nothing drawn" in status, status
    for value in (timed.tokens_per_s, timed.mean_draft_ms, timed.mean_verify_ms):
        assert f"streamed · {value:.1f} timed" in stats, stats
    latency, throughput = out["latency"], out["throughput"]
    assert "as streamed" in latency.layout.title.text and "as streamed" in throughput.layout.title.text
    (line,) = [t for t in latency.data if t.name == "timed run's mean"]
    assert line.y[0] == pytest.approx(timed.mean_draft_ms + timed.mean_verify_ms)
    (line,) = [t for t in throughput.data if t.name == "timed run"]
    assert line.y[0] == pytest.approx(timed.tokens_per_s)


def test_without_a_comparison_nothing_is_labelled_streamed(predictable):
    update = list(predictable.generate(Request.of("hi", method="eagle", max_new_tokens=8)))[-1]
    out, _ = streamed(PAGE, predictable, update, None, text=True, figures=True)
    assert "streamed" not in shown(out["stats"]).text and "timed" not in shown(out["status"]).text
    assert len(out["latency"].data) == 2 and "as streamed" not in out["latency"].layout.title.text
