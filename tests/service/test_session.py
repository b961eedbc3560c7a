"""The UI-agnostic service (demo/service/session.py) on a tiny random target: streaming, refusals, the
target-only comparison, chat turns, drafter swaps and the random-init fallback."""

import copy
import dataclasses
import types
from pathlib import Path

import pytest
import torch

from demo.config import TreeShape

from demo.methods import default_draft
from demo.engine import Engine
from demo.metrics import DEFINITIONS
from demo.service.chat import ChatState, Turn, first_difference
from demo.service.model_cache import RANDOM_INIT, ModelChoice
from demo.service.request import MAX_CHARS_PER_TOKEN, Request, RequestError
from demo.service.session import panel_stats
from demo.ui.html.render import render_chat, render_stats
from tests.tiny_chat import tiny_session


@pytest.fixture(scope="module")
def session():
    return tiny_session()


@pytest.fixture(scope="module")
def predictable():
    return tiny_session(predictable=True)


def test_request_streams_one_update_per_decoding_step(session):
    updates = list(session.generate(Request.of("hello", method="eagle3", num_spec_tokens=3, max_new_tokens=16)))
    trace = updates[-1].chat.trace
    assert updates[-1].done and not any(u.done for u in updates[:-1])
    assert len(updates) == trace.stats.num_steps + 1 + 1  # prefill, each step, then the final update
    lengths = [len(u.chat.turns[-1].pieces) for u in updates[:-1]]
    assert lengths == sorted(lengths) and lengths[-1] == 16  # the reply grows as events arrive
    assert [p.step for p in trace.points] == list(range(1, trace.stats.num_steps + 1))
    assert "sl-tok" in render_chat(updates[-1].chat)


def test_a_tree_request_keeps_one_tree_per_step_in_the_trace(session):
    request = Request.of("hello", method="eagle3", num_spec_tokens=3, tree=TreeShape(2, 6), max_new_tokens=16)
    final = list(session.generate(request))[-1]
    trace, pieces = final.chat.trace, final.chat.turns[-1].pieces
    assert len(trace.trees) == len(trace.roots) == trace.stats.num_steps == len(trace.points)
    for step, (tree, root) in enumerate(zip(trace.trees, trace.roots), 1):
        assert len(tree.tokens) == len(tree.parents) == len(tree.target_probs) == 5  # 6 verified, root included
        assert max(tree.depths) <= 3
        assert root == [p.token_id for p in pieces if p.step < step][-1]  # the last token before the step
        emitted = [p.token_id for p in pieces if p.step == step]
        assert [tree.tokens[n - 1] for n in tree.path] == emitted[:len(tree.path)]  # the accepted path was emitted
    assert all(p.reach == 3 for p in trace.points)  # a chart point's reach: the depth, not the 5 nodes
    assert copy.deepcopy(trace) == trace  # plain data, for gr.State


def test_the_trace_keeps_every_engine_step_with_its_emitted_tokens_and_candidates(session):
    final = list(session.generate(Request.of("hello", method="eagle3", num_spec_tokens=2, max_new_tokens=12)))[-1]
    trace, pieces = final.chat.trace, final.chat.turns[-1].pieces
    assert [s.step for s in trace.steps] == list(range(trace.stats.num_steps + 1))  # the prefill first
    assert [t for s in trace.steps for t in s.token_ids] == [p.token_id for p in pieces]
    for s in trace.steps:
        assert len(s.target_top) == len(s.token_ids)
        assert (s.draft_top is None) == (s.step == 0) and len(s.draft_ids) == (2 if s.step else 0)
    assert trace.steps[-1].elapsed_s == trace.stats.elapsed_s


def test_the_trace_keeps_the_requests_settings_so_the_inspector_knows_the_acceptance_rule(session):
    request = Request.of("hello", method="eagle3", num_spec_tokens=2, temperature=0.7, draft_sampling="q",
                         max_new_tokens=4)
    settings = list(session.generate(request))[-1].chat.trace.settings
    assert settings["temperature"] == 0.7 and settings["draft_sampling"] == "q" and settings["num_spec_tokens"] == 2
    assert settings["method"] == "eagle3" and settings["mode"] == "eager"


def test_token_texts_decode_each_token_alone_and_only_once():
    session = tiny_session()
    decode, calls = session.tokenizer.batch_decode, []
    session.models.tokenizer = types.SimpleNamespace(batch_decode=lambda seqs, **kw: calls.append(seqs) or
                                                     decode(seqs, **kw))
    assert session.token_texts([0, 1, 0]) == ["a", "b", "a"]  # id i is byte "a" + i
    assert session.token_texts([1, 2]) == ["b", "c"]
    assert calls == [[[0], [1]], [[2]]]  # the page redraws every rejected draft each step: known ids cost nothing


def test_a_draft_decodes_as_one_text_so_a_character_split_over_its_tokens_reads_whole():
    session = tiny_session()
    e_acute = [(b - ord("a")) % 256 for b in "é".encode()]  # two byte tokens (id i is byte "a" + i)
    assert session.token_texts(e_acute) == ["\ufffd", "\ufffd"]  # each alone is half a character
    assert session.draft_texts([[0, *e_acute], [1]]) == ["aé", "b"]


def test_draft_texts_are_decoded_once_and_the_oldest_dropped_past_the_limit(monkeypatch):
    session = tiny_session()
    monkeypatch.setattr("demo.service.session.DRAFT_TEXTS_KEPT", 2)
    decode, calls = session.tokenizer.batch_decode, []
    session.models.tokenizer = types.SimpleNamespace(batch_decode=lambda seqs, **kw: calls.append(seqs) or
                                                     decode(seqs, **kw))
    assert session.draft_texts([[0, 1], [2], [0, 1]]) == ["ab", "c", "ab"]
    assert session.draft_texts([[2], [3]]) == ["c", "d"]
    assert calls == [[[0, 1], [2]], [[3]]]  # a known draft costs nothing
    assert list(session.models.draft_text_cache) == [(2,), (3,)]


def test_accepted_drafts_are_marked_by_their_depth(predictable):
    # the predictable target always emits "a" and EAGLE (sharing its lm_head) always drafts it
    final = list(predictable.generate(Request.of("hi", method="eagle", num_spec_tokens=3, max_new_tokens=9)))[-1]
    pieces = final.chat.turns[-1].pieces
    assert [p.depth for p in pieces] == [0, 1, 2, 3, 0, 1, 2, 3, 0]  # prefill, then 3 drafts + own token
    assert [p.step for p in pieces] == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert final.chat.turns[-1].text == "a" * 9
    assert final.chat.trace.stats.summary()["mean_acceptance_length"] == 4.0
    assert "sl-d3" in render_chat(final.chat)


def test_resampled_tokens_are_marked_at_positive_temperature(predictable):
    # uniform target distribution: a random EAGLE-3 draft is almost always rejected, then resampled
    final = list(predictable.generate(Request.of("hi", method="eagle3", temperature=1.0, seed=3, max_new_tokens=8)))[-1]
    pieces = final.chat.turns[-1].pieces
    assert any(p.resampled and p.depth == 0 for p in pieces)
    assert not pieces[0].resampled  # the prefill token is sampled, not resampled


BAD = [
    (dict(prompt=""), "empty"),
    (dict(prompt="   \n"), "empty"),
    (dict(method="medusa"), "Unknown method"),
    (dict(mode="turbo"), "Unknown mode"),
    (dict(num_spec_tokens=0), "num_spec_tokens"),
    (dict(num_spec_tokens=11), "num_spec_tokens"),
    (dict(num_spec_tokens=2.5), "whole number"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(seed=-1), "seed"),
    (dict(seed="x"), "seed"),
    (dict(prompt="x" * 600), "context"),  # 600 byte tokens > 512-token context
    (dict(max_new_tokens=2000), "context"),
]


@pytest.mark.parametrize("fields, words", BAD, ids=[w + str(i) for i, (_, w) in enumerate(BAD)])
def test_bad_input_is_refused_with_a_message_and_no_engine_call(session, monkeypatch, fields, words):
    calls = []
    monkeypatch.setattr(Engine, "generate", lambda *a, **k: calls.append(a) or iter(()))
    request = Request.of(**{"prompt": "hi", **fields})
    chat = ChatState()
    with pytest.raises(RequestError, match=words):
        session.add_user_turn(chat, request)
    with pytest.raises(RequestError, match=words):
        next(session.generate(request))
    assert calls == [] and chat.turns == []


def test_max_new_tokens_past_the_context_is_refused_with_the_most_that_fit_after_the_prompt(session):
    with pytest.raises(RequestError, match=r"at most (\d+) new tokens fit after it") as refused:
        session.check(Request.of("hi", max_new_tokens=2000))
    most = int(refused.value.args[0].split("at most ")[1].split()[0])
    session.check(Request.of("hi", max_new_tokens=most))  # the most it names runs
    with pytest.raises(RequestError, match="context"):
        session.check(Request.of("hi", max_new_tokens=most + 1))


def test_a_prompt_longer_than_the_context_could_hold_is_refused_before_it_is_tokenized(session, monkeypatch):
    import demo.service.session

    monkeypatch.setattr(demo.service.session, "chat_ids", lambda *a: pytest.fail("the prompt was tokenized"))
    cap = session.max_context * MAX_CHARS_PER_TOKEN
    with pytest.raises(RequestError, match=rf"^The prompt is {cap + 1:,} characters.*\(at most {cap:,}\)"):
        session.check(Request.of("x" * (cap + 1)))
    chat = ChatState(turns=[Turn("user", "x" * cap), Turn("assistant", "y")])
    with pytest.raises(RequestError, match=r"^The conversation is .* characters.*clear the chat"):
        session.check(Request.of("z"), chat)


@pytest.mark.parametrize("prompt, words", [("hi \ud800", r"lone surrogate '\\ud800' at character 3"),
                                           (42, "must be text, not int"), (None, "must be text, not NoneType"),
                                           (["hi"], "must be text, not list")])
def test_a_prompt_that_is_not_utf8_text_is_refused_with_a_sentence(session, prompt, words):
    with pytest.raises(RequestError, match=words):
        session.check(Request.of(prompt))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cuda_graph_mode_is_refused_on_cpu_with_the_reason(session):
    assert "CUDA" in session.cudagraph_unavailable()
    with pytest.raises(RequestError, match="CUDA graphs need a CUDA GPU"):
        session.check(Request.of("hi", mode="cudagraph"))


def test_compare_with_target_only_at_t0_reports_token_identical(session):
    final = list(session.generate(Request.of("compare me", method="eagle3", max_new_tokens=24, compare=True)))[-1]
    c = final.chat.comparison
    assert c.greedy and c.identical is True and c.first_difference is None
    assert c.baseline_text == final.chat.turns[-1].text
    assert 1 <= len(c.speedups) <= 3 and c.speedup == sorted(c.speedups)[len(c.speedups) // 2]


@pytest.mark.parametrize("budget_s, rounds", [(1e9, 3), (0.0, 1)])
def test_a_comparison_that_fits_its_budget_is_timed_three_times_and_its_median_round_stands(session, monkeypatch,
                                                                                             budget_s, rounds):
    """Three rounds where they fit in COMPARE_BUDGET_S (every other one target-only first, so a drift in
    the machine's speed falls on both runs alike), else one, with what a round cost; the speeds shown
    and the race's lanes are the median round's."""
    import demo.service.session as service

    monkeypatch.setattr(service, "COMPARE_BUDGET_S", budget_s)
    engine = session.engine("eagle3", "eager")
    order, generate = [], engine.generate

    def logged(ids, gen):
        order.append("spec" if gen.num_spec_tokens else "base")
        return generate(ids, gen)

    monkeypatch.setattr(engine, "generate", logged)
    final = list(session.generate(Request.of("time me", method="eagle3", max_new_tokens=12, compare=True)))[-1]
    cmp = final.chat.comparison
    assert order[1:] == ["spec", "base", "base", "spec", "spec", "base"][:2 * rounds]  # after the streamed reply
    assert len(cmp.speedups) == rounds and cmp.round_s > 0
    assert cmp.speedup == sorted(cmp.speedups)[rounds // 2]
    assert cmp.speculative_tokens_per_s / cmp.baseline_tokens_per_s == pytest.approx(cmp.speedup)


def test_a_comparison_is_timed_once_where_three_rounds_would_not_fit_the_requests_time_limit(session, monkeypatch):
    import demo.service.session as service

    ticks = iter(range(0, 10_000, 10))  # the comparison's own clock: a round "takes" 10 s
    monkeypatch.setattr(service, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    monkeypatch.setattr(service, "COMPARE_BUDGET_S", 1e9)
    limited = Request.of("time me", method="eagle3", max_new_tokens=12, compare=True)
    limited.time_limit_s = 15.0  # two more 10 s rounds would not fit what is left of it
    assert len(list(session.generate(limited))[-1].chat.comparison.speedups) == 1
    unlimited = Request.of("time me", method="eagle3", max_new_tokens=12, compare=True)
    assert len(list(session.generate(unlimited))[-1].chat.comparison.speedups) == 3


def test_compare_does_not_run_for_target_only_and_the_status_says_why(session):
    final = list(session.generate(Request.of("hi", method="none", max_new_tokens=8, compare=True)))[-1]
    assert final.done and final.chat.comparison is None  # no 0.75x "lossless" of the target against itself
    assert "no comparison: target only is the target-only baseline itself" in final.status


def test_stats_panel_names_the_method_and_mode_in_words(session):
    final = list(session.generate(Request.of("hi", method="none", max_new_tokens=4)))[-1]
    text = render_stats(panel_stats(session, final.chat.trace), DEFINITIONS)
    assert "target only · eager" in text and "none ·" not in text


@pytest.mark.parametrize("rule", ["wor", "q", "pointmass"])
def test_a_chain_is_labelled_a_chain_whatever_machinery_its_rule_drafts_with(session, rule):
    # a chain whose drafts are drawn from q runs on the tree machinery (a tree of top-1); the reply's
    # label names what the visitor asked for
    final = list(session.generate(Request.of("hi", num_spec_tokens=3, temperature=1.0, draft_sampling=rule,
                                             max_new_tokens=4)))[-1]
    label = final.chat.turns[-1].label
    assert "(k = 3)" in label and "tree" not in label


def test_a_tree_is_labelled_with_its_depth_width_and_tokens_verified(session):
    final = list(session.generate(Request.of("hi", num_spec_tokens=3, tree=TreeShape(2, 6), max_new_tokens=4)))[-1]
    assert "(tree: depth 3, top-2, 6 tokens)" in final.chat.turns[-1].label


def test_compare_at_positive_temperature_makes_no_identity_claim(session):
    final = list(session.generate(Request.of("hi", temperature=0.7, max_new_tokens=8, compare=True)))[-1]
    assert final.chat.comparison.identical is None and not final.chat.comparison.greedy


def test_conversation_continues_with_the_chat_template(session):
    chat = session.add_user_turn(ChatState(), Request.of("first question"))
    chat = list(session.reply(chat, Request.of("first question", max_new_tokens=5)))[-1].chat
    first_reply = chat.turns[-1].text
    chat = session.add_user_turn(chat, Request.of("second question"))
    assert [t.role for t in chat.turns] == ["user", "assistant", "user"]
    ids = session.check(Request.of("third"), chat)
    prompt = session.tokenizer.decode(ids)
    assert "first question" in prompt and first_reply in prompt and "second question" not in prompt  # replaced
    chat = list(session.reply(chat, Request.of("second question", max_new_tokens=5)))[-1].chat
    assert [t.role for t in chat.turns] == ["user", "assistant", "user", "assistant"]


def test_a_reply_cut_short_by_stop_is_marked_stopped(session):
    chat = session.add_user_turn(ChatState(), Request.of("hi"))
    stream = session.reply(chat, Request.of("hi", max_new_tokens=50))
    next(stream), next(stream)
    stream.close()  # what Gradio does when Stop cancels the event
    assert chat.turns[-1].state == "streaming"
    chat.mark_stopped()
    assert "(stopped)" in render_chat(chat)
    chat = session.add_user_turn(chat, Request.of("again"))  # the conversation goes on
    assert chat.turns[-1].role == "user"


def test_a_step_that_was_in_flight_when_stop_came_is_not_added_to_the_reply(session):
    chat = session.add_user_turn(ChatState(), Request.of("hi"))
    stream = session.reply(chat, Request.of("hi", max_new_tokens=50))
    next(stream), next(stream)
    shown = (len(chat.turns[-1].pieces), len(chat.trace.steps))
    chat.mark_stopped()  # Stop, while the engine thread still computes the next step
    assert list(stream) == []
    assert (len(chat.turns[-1].pieces), len(chat.trace.steps)) == shown
    assert chat.turns[-1].state == "stopped"


def test_a_reply_cut_inside_a_multibyte_character_never_ends_in_part_of_one(predictable, monkeypatch):
    """The budget can stop a reply after the first byte of "é" (the byte tokenizer's ids for C3 A9):
    the reply ends before that character, never in a replacement character."""
    first_byte = predictable.tokenizer("é")["input_ids"][0]
    generate = Engine.generate

    def cut_inside_a_character(engine, ids, gen):
        events = list(generate(engine, ids, gen))
        last = events[-1]
        events[-1] = dataclasses.replace(last, token_ids=last.token_ids[:-1] + [first_byte])
        yield from events

    monkeypatch.setattr(Engine, "generate", cut_inside_a_character)
    turn = list(predictable.generate(Request.of("hi", method="eagle", max_new_tokens=6)))[-1].chat.turns[-1]
    assert turn.pieces[-1].token_id == first_byte and len(turn.pieces) == 6
    assert turn.text == "a" * 5 == "".join(p.text for p in turn.pieces)


def test_flush_holds_back_a_character_the_last_tokens_left_incomplete():
    from demo.service.chat import IncrementalDecoder
    from tests.tiny_chat import byte_tokenizer

    tok = byte_tokenizer()
    for text in ("hé", "a😀", "你好"):
        ids = tok(text)["input_ids"][:-1]  # the last character loses its last byte
        decoder = IncrementalDecoder(tok, window=2)
        pieces = [decoder.push(i) for i in ids] + [decoder.flush()]
        assert "".join(pieces) == text[:-1] and "\ufffd" not in "".join(pieces)


def test_chat_state_is_deep_copyable(session):
    final = list(session.generate(Request.of("hi", max_new_tokens=6, compare=True)))[-1]
    clone = copy.deepcopy(final.chat)
    assert render_chat(clone) == render_chat(final.chat) and clone is not final.chat


def test_changing_the_drafter_keeps_the_target():
    s = tiny_session()
    target, engine, eagle = s.target, s.engine("eagle3", "eager"), s.drafters["eagle"]
    before = list(s.generate(Request.of("hi", max_new_tokens=4)))[-1].chat.turns[-1].text
    warnings = s.switch(ModelChoice("tiny", "tiny", {"eagle3": "/nonexistent/drafter"}))
    assert s.target is target and s.engine("eagle3", "eager") is engine
    assert engine.drafter is s.drafters["eagle3"] and s.drafter_labels["eagle3"] == RANDOM_INIT
    assert s.drafters["eagle"] is eagle  # a drafter not named stays
    assert len(warnings) == 1 and "random-init" in warnings[0] and s.warnings == warnings
    after = list(s.generate(Request.of("hi", max_new_tokens=4)))[-1].chat.turns[-1].text
    assert after == before  # T = 0: the drafter changes speed, never the text


def test_a_named_drafter_that_cannot_load_is_an_error_when_asked_for_explicitly():
    s = tiny_session()
    drafters = dict(s.drafters)
    with pytest.raises(RequestError, match="EAGLE drafter"):
        s.switch(ModelChoice("tiny", "tiny", {"eagle3": None, "eagle": "/nonexistent/drafter"}, fallback=False))
    assert s.drafters == drafters  # nothing changed


def test_the_default_preset_falls_back_visibly_while_its_drafters_are_not_built(monkeypatch):
    import demo.models.presets as presets
    from demo.service.model_cache import preset_choice

    preset = presets.PRESETS[presets.DEFAULT_PRESET]
    unbuilt = dataclasses.replace(preset, eagle=Path("/nowhere/eagle"), eagle3=Path("/nowhere/eagle3"))
    monkeypatch.setitem(presets.PRESETS, presets.DEFAULT_PRESET, unbuilt)
    choice = preset_choice()
    assert choice.target == "default" and set(choice.missing) == {"eagle", "eagle3"}
    s = tiny_session()
    warnings = s.models.load_drafters(choice)
    assert all(s.drafter_labels[m] == RANDOM_INIT for m in ("eagle", "eagle3"))
    assert len(warnings) == 2 and all("not built yet" in w and "random-init" in w for w in warnings)


class Sized:
    """A stand-in for Models in the cache: a name and a size (the cache reads nothing else)."""

    def __init__(self, name: str, nbytes: int):
        self.name, self.nbytes = name, nbytes


def test_model_cache_evicts_the_least_recently_used_past_its_budget_never_the_default():
    from demo.service.model_cache import ModelCache

    loads = []

    def load(name, progress=None):
        loads.append(name)
        return Sized(name, 100)

    cache = ModelCache(Sized("default", 100), load, budget_bytes=300, expected_bytes=lambda n: 150 if n == "big" else 0)
    assert cache.get("a") is cache.get("a") and loads == ["a"]  # loaded once, then shared
    cache.get("b")
    cache.get("a")  # a is now more recent than b
    cache.get("c")  # 400 bytes: b, the least recently used, goes
    assert cache.names() == ["default", "a", "c"] and cache.nbytes == 300
    cache.get("big")  # room for its expected 150 bytes first: a, then c go; the default stays
    assert cache.names() == ["default", "big"] and loads == ["a", "b", "c", "big"]
    tight = ModelCache(Sized("default", 500), load, budget_bytes=50)
    tight.get("a")
    assert tight.names() == ["default", "a"]  # never the default, nor the models just asked for
    assert tight.peek("z") is None and "z" not in loads  # peek never loads


def test_models_count_their_weights_and_kv_cache_once():
    s = tiny_session()
    weights = sum(p.numel() * p.element_size() for p in s.target.hf.parameters())  # tied: listed once
    before = s.models.nbytes
    assert before >= weights
    list(s.generate(Request.of("hi", max_new_tokens=2)))  # the engine allocates the KV cache
    assert s.models.nbytes > before


def test_the_speedup_is_timed_on_runs_with_nothing_drawn_between_their_steps(session):
    """The streamed reply is slowed by whatever draws it (here a consumer that sleeps at every step);
    the comparison times the speculative run and target-only again, with no update between their
    steps, and its speedup is those runs' ratio, whatever the drawing cost."""
    import time

    updates_while_timing = []
    for update in session.generate(Request.of("compare me", method="eagle3", max_new_tokens=24, compare=True)):
        if update.status.startswith("generating"):
            time.sleep(0.02)  # drawing the page
        elif update.status.startswith("comparing"):
            updates_while_timing.append(update)
    chat, cmp = update.chat, update.chat.comparison
    # a status line as the timing starts and one as each further round does: nothing between steps
    assert len(updates_while_timing) == len(cmp.speedups)
    spec, base = cmp.speculative_trace.stats, cmp.baseline_trace.stats
    assert cmp.speculative_trace is not chat.trace  # a run of its own, not the streamed one
    assert cmp.speculative_tokens_per_s == spec.num_generated / spec.elapsed_s
    assert cmp.baseline_tokens_per_s == base.num_generated / base.elapsed_s
    assert cmp.speedup == pytest.approx(cmp.speculative_tokens_per_s / cmp.baseline_tokens_per_s)  # the median round
    reply = [p.token_id for p in chat.turns[-1].pieces]
    assert [p.token_id for p in cmp.speculative.pieces] == reply == [p.token_id for p in cmp.baseline.pieces]


def test_stop_during_the_comparison_ends_it_at_the_next_step_and_measures_nothing(session):
    steps = []
    updates = session.generate(Request.of("compare me", method="eagle3", max_new_tokens=24, compare=True))
    for update in updates:
        if update.status.startswith("comparing"):
            break
    chat = update.chat
    assert chat.comparing
    engine = session.engine("eagle3", "eager")
    generate = engine.generate

    def counted(*args):
        for event in generate(*args):
            steps.append(event.step)
            chat.mark_stopped()  # Stop pressed while the timed run is at its first step
            yield event
    engine.generate = counted
    try:
        rest = list(updates)
    finally:
        del engine.generate
    assert [u.done for u in rest] == [True]  # the reply ends at once, its comparison not measured
    assert chat.comparison is None and not chat.comparing and steps == [0]


def test_in_bf16_compare_checks_the_reply_against_target_only_run_at_the_verifications_width(monkeypatch):
    import demo.service.session as service

    monkeypatch.setattr(service, "COMPARE_BUDGET_S", 0.0)  # one timing a comparison: the check is the point here
    # a 1-row target-only step and a 4-row verification round differently in bf16 (near-ties flip);
    # target-only run 4 rows wide computes every token as the verification does: the exact reference
    # (which prompts flip a near-tie depends on the CPU's kernels: some of these six do on each machine seen)
    session = tiny_session(dtype=torch.bfloat16)
    flips = []
    for text in ("hello there", "the sea", "zz", "0123", "yes", "compare me"):
        request = Request.of(text, method="eagle3", num_spec_tokens=3, max_new_tokens=96, compare=True)
        final = list(session.generate(request))[-1]
        c = final.chat.comparison
        spec = [p.token_id for p in final.chat.turns[-1].pieces]
        one_row = [p.token_id for p in c.baseline.pieces]
        assert c.reference_width == 4 and c.identical is True and c.first_difference is None, text
        assert c.one_row_difference == first_difference(one_row, spec), text
        flips.append(c.one_row_difference)
    assert any(f is not None for f in flips)  # a 1-row run flipped a near-tie, and the reply still held
    fp32 = list(tiny_session().generate(request))[-1].chat.comparison
    assert fp32.reference_width == 1 and fp32.one_row_difference is None and fp32.identical is True


def test_the_warm_up_runs_the_default_draft_shape_of_each_side_of_zero(monkeypatch):
    from tests.defaults import set_eagle_defaults

    session = tiny_session()
    asked = []
    real = Engine.generate

    def generate(self, prompt_ids, gen):
        asked.append((gen.temperature, gen.num_spec_tokens, gen.tree))
        return real(self, prompt_ids, gen)

    monkeypatch.setattr(Engine, "generate", generate)
    greedy = default_draft("cpu", 0.0)
    set_eagle_defaults(monkeypatch, "cpu", sampled="greedy")
    session.warmup(("eager",))
    assert asked == [(0.0, *greedy)]  # one default at every temperature: one warm-up
    asked.clear()
    set_eagle_defaults(monkeypatch, "cpu", sampled=(2, TreeShape(2, 4)))
    session.warmup(("eager",))
    assert asked == [(0.0, *greedy), (1.0, 2, TreeShape(2, 4))]
