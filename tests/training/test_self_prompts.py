"""Prompts the target writes itself (training/self_prompts.py): the pre-query prefix is the chat
template up to the user's text, only whole, distinct turns that are no validation prompt are kept,
and the CLI writes prompts that `training.data regen` answers as it answers exported ones."""

from __future__ import annotations

import json

import pytest

from tests.training.helpers import IM_END, byte_tokenizer, tiny_run_inputs
from training.data import ShardWriter, load_shards, prompt_ids, write_meta
from training.self_prompts import PromptFilter, around_user_text, excluded_texts, pre_query_ids, user_text


def test_pre_query_ids_are_a_single_user_prompt_up_to_its_text():
    tok = byte_tokenizer()
    pre = pre_query_ids(tok)
    full = prompt_ids(tok, "What is a tree?")
    assert full[: len(pre)] == pre
    assert tok.decode(full[len(pre):]).startswith("What is a tree?<|im_end|>")
    assert user_text(around_user_text(tok), tok.decode(full)) == "What is a tree?"


def test_the_filter_keeps_only_whole_distinct_turns_that_are_no_validation_prompt():
    tok = byte_tokenizer()

    def turn(text, stop=True):
        return list(text.encode()) + ([IM_END] if stop else [])

    keep = PromptFilter((IM_END,), min_chars=6, excluded={"Held   out question"})
    got = [keep.take(tok, t) for t in (
        turn("  Explain recursion.  "),
        turn("explain   RECURSION."),           # the same question, case and spaces folded
        turn("A turn cut at the limit", stop=False),
        turn("Hi"),                            # too short
        turn("held out question"),             # a validation prompt
        turn("Write a haiku about rain."),
        [])]
    assert got == ["Explain recursion.", None, None, None, None, "Write a haiku about rain.", None]
    t = keep.tally
    assert (t.sampled, t.kept, t.repeated, t.unfinished, t.short, t.excluded) == (7, 2, 1, 2, 1, 1)
    assert t.sampled == t.kept + t.repeated + t.unfinished + t.short + t.excluded


def test_excluded_texts_hold_the_holdout_prompts_and_every_question_turn(tmp_path):
    tok = byte_tokenizer()
    writer = ShardWriter(tmp_path / "holdout")
    for text in ("held one", "held\ntwo "):
        ids = prompt_ids(tok, text)
        writer.add(ids, [0] * len(ids), 5)
    writer.flush()
    write_meta(tmp_path / "holdout", {"recipe": "prompts-holdout", "holdout_fingerprint": "abc123"})
    (tmp_path / "q.jsonl").write_text(json.dumps({"category": "x", "turns": ["first turn", "second turn"]}) + "\n")
    texts, fingerprint = excluded_texts(tok, tmp_path / "holdout", [str(tmp_path / "q.jsonl")])
    assert texts == {"held one", "held\ntwo ", "first turn", "second turn"} and fingerprint == "abc123"


def test_self_prompts_cli_writes_prompts_that_regen_answers_and_never_an_excluded_one(tmp_path):
    from training.data import main as data_main
    from training.self_prompts import main

    target_dir, _ = tiny_run_inputs(tmp_path)
    tok = byte_tokenizer()

    def run(out, *extra):
        assert main(["--target", str(target_dir), "--device", "cpu", "--out", str(out), "--num", "300",
                     "--batch-size", "64", "--max-new-tokens", "40", "--min-chars", "1", "--seed", "3", *extra]) == 0
        data = load_shards(out)
        texts = [user_text(around_user_text(tok), tok.decode(data.get(i)[0].tolist())) for i in range(len(data))]
        return data, texts, json.loads((out / "meta.json").read_text())

    data, texts, meta = run(tmp_path / "a")
    run_a = meta["runs"][0]
    assert meta["recipe"] == "prompts-train-self" and meta["sequences"] == len(data) == run_a["kept"] > 2
    assert run_a["sampled"] == 300 == sum(run_a[k] for k in ("kept", "unfinished", "short", "repeated", "excluded"))
    assert set(data.source.tolist()) == {-1}  # from no ShareGPT record
    for i, text in enumerate(texts):
        assert data.get(i)[0].tolist() == prompt_ids(tok, text) and not data.get(i)[1].any()

    (tmp_path / "q.jsonl").write_text(json.dumps({"turns": [texts[0]]}) + "\n")
    _, again, meta_b = run(tmp_path / "b", "--exclude-questions", str(tmp_path / "q.jsonl"))
    assert texts[0] not in again and meta_b["runs"][0]["excluded"] >= 1
    assert set(again) == set(texts) - {texts[0]}  # the same seed samples the same turns

    assert data_main(["regen", "--prompts", str(tmp_path / "a"), "--target", str(target_dir), "--out",
                      str(tmp_path / "answers"), "--device", "cpu", "--batch-size", "8", "--max-new-tokens", "4"]) == 0
    answers = load_shards(tmp_path / "answers")
    assert len(answers) == len(data) and all(answers.get(i)[1].any() for i in range(len(answers)))
    with pytest.raises(FileExistsError):
        run(tmp_path / "a")
