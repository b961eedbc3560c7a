"""Keeping what was measured (demo/service/records.py): a generation's trace as JSON holds every step as it
happened and reads back unchanged; a benchmark's CSV holds every row. Generations run on the tiny
predictable chat model (tests/tiny_chat.py: the target says "a", EAGLE-1 drafts "a")."""

from __future__ import annotations

import csv
import io
import json

import pytest

from demo.service.records import bench_csv, environment, trace_json, trace_record
from demo.service.request import Request
from demo.ui.trace_download import trace_file
from tests.tiny_chat import tiny_session

ENV = {"torch": "x", "device": "cpu"}


@pytest.fixture(scope="module")
def session():
    return tiny_session(predictable=True)


def reply_of(session, **settings):
    *_, update = session.generate(Request.of("Say a", **settings))
    return update.chat


def context(session, chat) -> dict:
    ids = sorted({i for t in chat.trace.trees for i in t.tokens})
    return dict(messages=chat.messages()[:-1], token_text=dict(zip(ids, session.token_texts(ids))), environment=ENV)


def test_trace_json_roundtrips_and_holds_every_step_with_its_drafts_and_tokens(session):
    chat = reply_of(session, method="eagle", num_spec_tokens=3, max_new_tokens=9, seed=7)
    reply = chat.turns[-1]
    text = trace_json(chat.trace, reply, **context(session, chat))
    record = json.loads(text)
    assert record == trace_record(chat.trace, reply, **context(session, chat))  # JSON in, the same data out
    steps = record["steps"]
    assert [s["step"] for s in steps] == list(range(chat.trace.stats.num_steps + 1))  # the prefill, then each step
    # the tokens emitted, step by step, are the reply
    assert [t["id"] for s in steps for t in s["emitted"]] == [p.token_id for p in reply.pieces]
    assert "".join(t["text"] for s in steps for t in s["emitted"]) == reply.text == "a" * 9
    for s in steps[1:]:  # each drafting step: k drafts (a chain), all accepted, then the target's own token
        drafts = s["drafts"]
        assert len(drafts["ids"]) == 3 and drafts["parents"] == [0, 1, 2] and drafts["texts"] == ["a"] * 3
        assert s["accepted"] == len(drafts["accepted_path"]) and len(drafts["p"]) == 3
        depths = [t["depth"] for t in s["emitted"]]  # accepted drafts by depth, then the target's own (0)
        assert depths[: s["accepted"]] == list(range(1, s["accepted"] + 1)) and set(depths[s["accepted"]:]) <= {0}
        assert s["draft_ms"] >= 0 and s["verify_ms"] > 0 and all(0 <= t["p"] <= 1 for t in s["emitted"])
    assert record["settings"] == {"method": "eagle", "mode": "eager", "compare": False, "max_new_tokens": 9,
                                  "num_spec_tokens": 3, "tree": None, "draft_sampling": "wor",
                                  "temperature": 0.0, "top_p": 1.0, "seed": 7, "stop_token_ids": None,
                                  "target_only_width": 1, "max_time_s": None}
    assert record["environment"] == ENV and record["messages"] == [{"role": "user", "content": "Say a"}]
    assert record["totals"]["mean_acceptance_length"] == 4.0 and record["finish_reason"] == "length"


def test_a_target_only_trace_has_steps_without_drafts(session):
    chat = reply_of(session, method="none", max_new_tokens=5)
    steps = json.loads(trace_json(chat.trace, chat.turns[-1], **context(session, chat)))["steps"]
    assert len(steps) == 5 and all(s["drafts"] is None and s["accepted"] == 0 for s in steps[1:])


def test_a_draft_tree_is_kept_with_its_parents_and_accepted_path(session):
    from demo.config import TreeShape

    chat = reply_of(session, method="eagle", num_spec_tokens=3, max_new_tokens=9, tree=TreeShape(2, 6))
    steps = json.loads(trace_json(chat.trace, chat.turns[-1], **context(session, chat)))["steps"]
    for s, tree in zip(steps[1:], chat.trace.trees):
        assert s["drafts"]["parents"] == tree.parents and s["drafts"]["accepted_path"] == tree.path
        assert s["drafts"]["depths"] == tree.depths and len(s["drafts"]["ids"]) == 5  # 6 verified, root included


def test_the_chat_pages_trace_file_names_the_versions_and_device_and_needs_a_reply(session, tmp_path):
    from demo.service.chat import ChatState

    assert trace_file(session, ChatState()) is None
    chat = reply_of(session, method="eagle", max_new_tokens=4)
    with open(trace_file(session, chat), encoding="utf-8") as f:
        env = json.load(f)["environment"]
    assert {"speclens_commit", "torch", "transformers", "gradio", "python"} <= set(env)
    assert env["device"] == "cpu" and env["model"] == "tiny" and env["drafter"] == "custom"
    assert environment()["torch"] == __import__("torch").__version__


def test_bench_csv_holds_a_totals_row_per_configuration_then_its_categories():
    summary = [dict(method="none", mode="eager", k=0, prompts=2, generated_tokens=16, mean_acceptance_length=1.0,
                    acceptance_per_position=[], tokens_per_s=20.0, speedup=None, mean_draft_ms=0.0,
                    mean_verify_ms=50.0),
               dict(method="eagle3", mode="eager", k=2, prompts=2, generated_tokens=16, mean_acceptance_length=1.9,
                    acceptance_per_position=[0.6, 0.3], tokens_per_s=25.0, speedup=1.25, mean_draft_ms=9.0,
                    mean_verify_ms=60.0)]
    categories = [dict(method="eagle3", mode="eager", k=2, category="math", prompts=1, mean_acceptance_length=2.2,
                       tokens_per_s=27.0)]
    rows = list(csv.DictReader(io.StringIO(bench_csv(summary, categories))))
    assert [(r["method"], r["k"], r["category"]) for r in rows] == [("none", "0", "all"), ("eagle3", "2", "all"),
                                                                     ("eagle3", "2", "math")]
    assert rows[0]["speedup"] == "" and rows[1]["speedup"] == "1.25"
    assert (rows[1]["acceptance_at_draft_1"], rows[1]["acceptance_at_draft_2"]) == ("0.6", "0.3")
    assert rows[2]["mean_acceptance_length"] == "2.2" and rows[2]["generated_tokens"] == ""  # not measured per category
