"""Uploaded prompt files (the Benchmark tab's) are read defensively: MT-bench / Spec-Bench JSONL in,
questions out, anything else refused in one line that says what and where (no model, no file system)."""

import json

import pytest

from demo.models.prompts import PromptFileError, questions_from_upload


def jsonl(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_mt_bench_and_spec_bench_rows_are_read_with_defaults_for_missing_fields():
    data = jsonl({"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
                 {"question_id": "sb-1", "category": "translation", "turns": ["Translate: hallo"],
                  "reference": ["hello"]},
                 {"turns": ["No id, no category"]})
    assert questions_from_upload(b"\xef\xbb\xbf" + data + b"\n\n", "q.jsonl") == [  # a BOM and blank lines are fine
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        {"question_id": "sb-1", "category": "translation", "turns": ["Translate: hallo"]},
        {"question_id": 3, "category": "-", "turns": ["No id, no category"]},  # its line number, no category
    ]


def test_a_line_separator_inside_a_json_string_does_not_split_the_row():
    data = json.dumps({"turns": ["one\u2028two"]}, ensure_ascii=False).encode() + b"\n"
    assert questions_from_upload(data, "q.jsonl")[0]["turns"] == ["one\u2028two"]


@pytest.mark.parametrize("data, message", [
    (b"\xff\xfe{}", "q.jsonl: not UTF-8 text (byte 0xff at offset 0)."),
    (jsonl({"turns": ["ok"]}) + b"{not json\n", "q.jsonl, line 2: not JSON"),
    (b'[{"turns": ["a"]}]\n', "q.jsonl, line 1: a question needs \"turns\""),  # a JSON array is not JSON lines
    (jsonl({"turns": []}), "q.jsonl, line 1: a question needs \"turns\""),
    (jsonl({"turns": [" "]}), "q.jsonl, line 1: a question needs \"turns\""),
    (jsonl({"turns": [1, 2]}), "q.jsonl, line 1: a question needs \"turns\""),
    (jsonl({"prompt": "hi"}), "q.jsonl, line 1: a question needs \"turns\""),
    (jsonl({"turns": ["a"], "category": ["x"]}), "q.jsonl, line 1: \"category\" must be a string, not list."),
    (jsonl({"turns": ["a"], "question_id": {"a": 1}}), "q.jsonl, line 1: \"question_id\" must be a number or a string"),
    (b"\n \n", "q.jsonl: no questions"),
])
def test_an_unreadable_file_is_refused_in_one_line_naming_where(data, message):
    with pytest.raises(PromptFileError) as refused:
        questions_from_upload(data, "q.jsonl")
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)
