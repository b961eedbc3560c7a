"""Turning conversations into prompt token ids with the target's chat template, and reading prompt
files in the MT-bench / Spec-Bench question format. Bundled in assets/prompts/: quick.jsonl, questions.jsonl and
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
