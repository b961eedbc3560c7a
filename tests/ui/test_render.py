"""Token provenance -> escaped HTML (demo/ui/html/render.py): escaping, structure, provenance marks, and
per-token text from incremental decoding."""


import re
from pathlib import Path

import pytest

from demo.metrics import DEFINITIONS, AcceptanceStats
from demo.service.chat import ChatState, IncrementalDecoder, RunTrace, TokenPiece, Turn, provenance
from demo.ui.figures import CHART_DEFINITIONS, acceptance_figure
from demo.ui.html.render import (
    DEPTH_COLORS,
    depth_color,
    render_chat,
    render_comparison,
    render_legend,
    render_reply,
    render_stats,
    render_user,
)
from tests.html_text import shown
from tests.tiny_chat import byte_tokenizer


def pieces_of(texts, depths=None) -> list[TokenPiece]:
    depths = depths or [0] * len(texts)
    return [TokenPiece(i, t, step=1 + i // 4, depth=d, prob=0.5) for i, (t, d) in enumerate(zip(texts, depths))]


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", '<img src=x onerror="alert(1)">',
                                  "</div><b>bold</b>", "a & b < c > d \"q\" 'q'"])
def test_markup_in_model_output_shows_as_text(text):
    html = render_reply(pieces_of([text[:5], text[5:]], [1, 0]))
    page = shown(html)
    assert page.text == text
    assert [t for t, _ in page.tags] == ["div", "span", "span"]  # no tag from the text itself
    assert "<script" not in html and "<img" not in html


def test_markup_in_user_text_shows_as_text():
    text = "<script>alert('x')</script>\n<b>hi</b>"
    page = shown(render_user(text))
    assert page.text == text and [t for t, _ in page.tags] == ["div"]


def test_template_syntax_of_gradio_html_is_escaped():
    # gr.HTML treats its value as a JS template string and a Handlebars template (and @children)
    text = "{{value}} ${alert(1)} `x` @children"
    html = render_reply(pieces_of([text]))
    assert shown(html).text == text
    for raw in ("{{", "${", "`", "@children"):
        assert raw not in html


def test_code_blocks_lists_and_newlines_keep_their_shape():
    text = "Here:\n```python\ndef f(x):\n    return x * 2\n```\n- one\n- two\n\n1. first"
    tokens = ["Here", ":\n", "```", "python", "\n", "def", " f", "(x):\n", "    return", " x", " *", " 2",
              "\n```\n", "- one", "\n- two", "\n\n", "1.", " first"]
    assert "".join(tokens) == text
    html = render_reply(pieces_of(tokens, [i % 3 for i in range(len(tokens))]))
    assert shown(html).text == text  # every newline and indent survives as text
    assert "white-space:pre-wrap" in html  # and the block shows it (no Markdown, no <br> juggling)


def test_accepted_drafts_are_coloured_by_depth_and_own_tokens_are_plain():
    pieces = [TokenPiece(1, "a", 3, 1, 0.9), TokenPiece(2, "b", 3, 2, 0.8), TokenPiece(3, "c", 3, 0, 0.5),
              TokenPiece(4, "d", 4, 0, 0.25, resampled=True)]
    tags = [attrs for tag, attrs in shown(render_reply(pieces)).tags if tag == "span"]
    assert tags[0]["class"] == "sl-tok sl-draft sl-d1" and depth_color(1) in tags[0]["style"]
    assert tags[1]["class"] == "sl-tok sl-draft sl-d2" and depth_color(2) in tags[1]["style"]
    assert tags[2]["class"] == "sl-tok sl-own" and "style" not in tags[2]
    assert tags[3]["class"] == "sl-tok sl-resampled" and "underline" in tags[3]["style"]
    assert len(set(DEPTH_COLORS)) == len(DEPTH_COLORS) == 10


def test_a_resampled_token_is_marked_by_a_thin_underline_only():
    # at T = 0.8 most steps end with a resampled token: the mark must not paint the text
    style = [a for t, a in shown(render_reply([TokenPiece(4, "d", 4, 0, 0.25, resampled=True)])).tags
             if t == "span"][0]["style"]
    assert "text-decoration-thickness:1px" in style
    assert "background" not in style and "wavy" not in style and not re.search(r"(^|;)color:", style)


def test_a_rejected_draft_shows_struck_between_the_accepted_drafts_and_the_targets_token():
    # step 3 accepted "a" and "b", rejected the draft " x\ny", then the target emitted "c"
    pieces = [TokenPiece(1, "a", 3, 1, 0.9), TokenPiece(2, "b", 3, 2, 0.8), TokenPiece(3, "c", 3, 0, 0.5),
              TokenPiece(4, "d", 4, 1, 0.5), TokenPiece(5, "e", 4, 0, 0.5)]
    html = render_reply(pieces, {3: " x\ny"})
    page = shown(html)
    assert page.text == "ab x↵ycde"  # newlines of a rejected draft do not break the reply's lines
    spans = [a for t, a in page.tags if t == "span"]
    assert [a["class"] for a in spans][:4] == ["sl-tok sl-draft sl-d1", "sl-tok sl-draft sl-d2", "sl-rejected",
                                               "sl-tok sl-own"]
    assert spans[2]["data-step"] == "3" and "line-through" in spans[2]["style"]
    assert "user-select:none" in spans[2]["style"]  # copying the reply leaves the rejected draft out
    assert shown(render_reply(pieces)).text == "abcde"  # without rejected drafts, the reply's text alone


def test_only_the_latest_reply_carries_its_steps_and_rejected_drafts():
    old = Turn("assistant", "ab", [TokenPiece(1, "a", 0, 0, 0.5), TokenPiece(2, "b", 1, 0, 0.5)])
    new = Turn("assistant", "cd", [TokenPiece(3, "c", 0, 0, 0.5), TokenPiece(4, "d", 1, 0, 0.5)])
    chat = ChatState([Turn("user", "hi"), old, Turn("user", "more"), new], trace=RunTrace("eagle3", "eager", 3,
                                                                                          AcceptanceStats(3)))
    tags = [a for t, a in shown(render_chat(chat, {1: "z"})).tags if t == "span"]
    assert [a.get("data-step") for a in tags] == [None, None, "0", "1", "1"]  # old turn: none; latest: each token
    assert shown(render_chat(chat, {1: "z"})).text.count("z") == 1
    no_trace = [a for t, a in shown(render_chat(ChatState(chat.turns))).tags if t == "span"]
    assert all("data-step" not in a for a in no_trace)  # no run to inspect


def test_hover_shows_step_depth_and_probability():
    tags = [a for t, a in shown(render_reply([TokenPiece(7, "x", 4, 2, 0.8125),
                                               TokenPiece(8, "y", 0, 0, 0.5)])).tags if t == "span"]
    assert tags[0]["title"] == "step 4 · accepted draft token 2 · p = 0.812"
    assert tags[1]["title"] == "step 0 · target's own token (prefill) · p = 0.500"


def test_provenance_of_a_step():
    # 3 drafts accepted, then the target's own token
    assert provenance([5, 6, 7, 8], 3, False) == [(1, False), (2, False), (3, False), (0, False)]
    # a stop token cut the step after 2 accepted drafts: no own token in it
    assert provenance([5, 6], 3, False) == [(1, False), (2, False)]
    # T > 0: 1 accepted, then a token resampled after the rejection
    assert provenance([5, 9], 1, True) == [(1, False), (0, True)]


@pytest.mark.parametrize("text", ["你好，世界！这是中文。", "emoji 😀👍🏽 and e\u0301 and Ελληνικά", "mixed: a你b😀c\nd"])
def test_non_latin_text_decodes_per_token_without_broken_characters(text):
    tok = byte_tokenizer()  # one token per byte: every non-ASCII character spans several tokens
    ids = tok(text)["input_ids"]
    dec = IncrementalDecoder(tok, window=4)  # a small window also exercises the window sliding
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces.count("") >= len(ids) - len(text)  # tokens inside a character carry no text
    html = render_reply(pieces_of(pieces[:-1], [1] * len(ids)))
    assert shown(html).text == text


class _SentencePieceLike:
    """Decodes like SentencePiece: '▁' is a space, and the first token's leading space is dropped."""

    vocab = ["▁Hello", "▁world", "!", "▁how", "▁are", "▁you", "?", "\n", "▁I", "'m", "▁fine"]

    def decode(self, ids, **kwargs):
        return "".join(self.vocab[i] for i in ids).replace("▁", " ").removeprefix(" ")


def test_sentencepiece_spaces_come_out_right_across_the_window():
    tok = _SentencePieceLike()
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3
    dec = IncrementalDecoder(tok, window=3)
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids)
    assert pieces[:4] == ["Hello", " world", "!", " how"]
    assert pieces[11:13] == [" Hello", " world"]  # after a window slide, leading spaces are kept


def test_legend_shows_one_swatch_per_depth():
    legend = render_legend(5)
    for d in range(1, 6):
        assert depth_color(d) in legend
    assert depth_color(6) not in legend
    assert "target's own token" in shown(legend).text and "resampled" in legend
    text = shown(legend).text
    assert "rejected draft" in text and "first choice below the last accepted token" in legend  # on hover
    assert "resampled (T > 0)" in text and "click or tap a token" in text


def test_stats_panel_shows_numbers_with_their_definitions():
    stats = {"mean_acceptance_length": 2.5, "acceptance_per_position": [0.9, 0.5, 0.1], "tokens_per_s": 12.3,
             "mean_draft_ms": 1.5, "mean_verify_ms": 4.25, "num_steps": 10, "prefill_ms": 20.0, "num_generated": 26,
             "method": "eagle3", "mode": "eager", "device": "cpu", "dtype": "float32", "draft_vocab": 16384,
             "vocab_size": 49152}
    text = shown(render_stats(stats, DEFINITIONS)).text
    for value in ("2.50", "1: 90%", "2: 50%", "3: 10%", "12.3", "1.5", "4.2", "10", "eagle3 · eager", "cpu · float32",
                  "16,384 of 49,152 tokens"):
        assert value in text
    assert DEFINITIONS["mean_acceptance_length"] in text and DEFINITIONS["acceptance_per_position"] in text
    assert DEFINITIONS["draft_vocab"] in text
    assert "draft 1 after" not in text  # no step has followed another yet
    split = {**stats, "steps_after_full": 3, "acceptance_at_0_after_full": 1.0, "steps_after_rejection": 0,
             "acceptance_at_0_after_rejection": None}
    text = shown(render_stats(split, DEFINITIONS)).text
    assert "draft 1 after a full · a rejected step" in text and "100% · -" in text
    assert DEFINITIONS["acceptance_at_0_after"] in text
    target_only = shown(render_stats({**stats, "method": "none", "draft_vocab": None}, DEFINITIONS)).text
    assert "drafts over" not in target_only


def test_draft_positions_are_numbered_1_to_k_in_the_stats_charts_and_explainer():
    stats = {"mean_acceptance_length": 2.4, "acceptance_per_position": [0.9, 0.5], "tokens_per_s": 1.0,
             "mean_draft_ms": 1.0, "mean_verify_ms": 1.0, "num_steps": 4, "prefill_ms": 1.0, "num_generated": 9,
             "method": "eagle3", "mode": "eager", "device": "cpu", "dtype": "float32", "steps_after_full": 2,
             "acceptance_at_0_after_full": 1.0, "steps_after_rejection": 1, "acceptance_at_0_after_rejection": 0.0}
    panel = shown(render_stats(stats, DEFINITIONS)).text
    fig = acceptance_figure(AcceptanceStats(2))
    explainer = (Path(__file__).parents[2] / "assets" / "explainer.md").read_text()
    shown_words = [panel, *CHART_DEFINITIONS.values(), explainer, fig.layout.title.text,
                   fig.layout.xaxis.title.text]
    assert "draft 1: 90% · draft 2: 50%" in panel and "draft 1 after a full · a rejected step" in panel
    for words in shown_words:  # one convention: "draft 1 .. draft k", never vLLM's 0-based "token i"
        assert not re.search(r"token 0|token i\b|i\s*\+\s*1|each draft position", words), words


def test_the_explainer_names_the_stats_panels_terms_and_keeps_tokens_per_call_apart_from_acceptance_length():
    """A learner meets "draft 1 after a full · a rejected step" and "drafts over N of M tokens" in the
    stats panel: the explainer says what they are. Tokens per target call is not the mean acceptance
    length (2.48 against 2.50 on one page), and the latter bounds the speedup only if verification
    were as cheap as decoding one token too, not merely drafting free."""
    explainer = (Path(__file__).parents[2] / "assets" / "explainer.md").read_text().lower()
    for term in ("tokens per target call", "mean acceptance length", "draft 1 after a full · a rejected step",
                 "drafts over n of m tokens"):
        assert term in explainer, term
    assert "tokens per target call (the mean acceptance length)" not in explainer
    assert "if drafting were free" not in explainer and "cost what decoding 1 does" in explainer


def test_comparison_reports_speedup_and_identity():
    assert "✓" in render_comparison(2.0, 20.0, 10.0, True, None) and "2.00×" in render_comparison(2.0, 20, 10, True, None)
    assert "token 7" in render_comparison(1.1, 11, 10, False, 7)
    assert "differ by design" in render_comparison(1.5, 15, 10, None, None)


def test_in_bf16_the_comparison_names_the_exact_reference_and_where_the_1_row_run_differs():
    exact = render_comparison(2.0, 20, 10, True, None, "bfloat16", reference_width=8, one_row_difference=12)
    assert "✓" in exact and "run 8 rows wide" in exact and "exact reference" in exact
    assert "1-row target-only run timed above differs from token 12" in exact
    same = render_comparison(2.0, 20, 10, True, None, "bfloat16", reference_width=8)
    assert "✓" in same and "differs" not in same
    wrong = render_comparison(2.0, 20, 10, False, 5, "bfloat16", reference_width=8)
    assert "✗" in wrong and "run 8 rows wide at token 5" in wrong
    assert "rows wide" not in render_comparison(2.0, 20, 10, True, None)  # fp32: the 1-row run is the reference
