"""Turning conversations into prompt token ids with the target's chat template, and reading prompt
files in the MT-bench / Spec-Bench question format: local files (``read_questions``) and, defensively,
a visitor's upload (``questions_from_upload``). Bundled in assets/prompts/: quick.jsonl, questions.jsonl and
categories.jsonl (10 questions in each of 8 categories), the last two validation sets that training never reads."""

from __future__ import annotations

import json
from pathlib import Path


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` ([{"role", "content"}, ...]) ending with the assistant's turn opener.
    Falls back to the raw text of the last user message when the tokenizer has no chat template."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return tokenizer(messages[-1]["content"])["input_ids"]


def read_questions(path: str | Path) -> list[dict]:
    """JSONL rows {"question_id", "category", "turns": [...]} (MT-bench / Spec-Bench format)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            if not isinstance(row.get("turns"), list) or not row["turns"]:
                raise ValueError(f"{path}:{n}: each row needs a non-empty 'turns' list")
            rows.append(row)
    return rows


class PromptFileError(ValueError):
    """An uploaded prompt file that cannot be read; the message is one line, naming the line at fault."""


def questions_from_upload(data: bytes, name: str) -> list[dict]:
    """Questions of an uploaded MT-bench / Spec-Bench JSONL file, read defensively (the file is a
    visitor's): UTF-8 text, one JSON object per line with a non-empty "turns" list of strings. Rows
    come back as {"question_id", "category", "turns"} (a missing id is the line number, a missing
    category "-"). Raises PromptFileError with one line saying what is wrong and where."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{name}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}).") from None
    rows = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than Python's stack
            raise PromptFileError(f"{name}, line {n}: not JSON ({getattr(e, 'msg', e)}); expected one question "
                                  'object per line, e.g. {"category": "math", "turns": ["..."]}.') from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns) and turns[0].strip()):
            raise PromptFileError(f'{name}, line {n}: a question needs "turns", a list of prompt strings whose first '
                                  "is not empty (MT-bench / Spec-Bench format).")
        category, question_id = row.get("category"), row.get("question_id", n)
        if category is not None and not isinstance(category, str):
            raise PromptFileError(f'{name}, line {n}: "category" must be a string, not {type(category).__name__}.')
        if isinstance(question_id, bool) or not isinstance(question_id, (int, str)):
            raise PromptFileError(f'{name}, line {n}: "question_id" must be a number or a string, '
                                  f"not {type(question_id).__name__}.")
        rows.append({"question_id": question_id, "category": category or "-", "turns": turns})
    if not rows:
        raise PromptFileError(f'{name}: no questions; expected one JSON object per line with "turns".')
    return rows
