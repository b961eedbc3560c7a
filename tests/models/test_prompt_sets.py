"""The bundled prompt files (assets/prompts/*.jsonl) are well-formed MT-bench questions, the category
set covers eight categories evenly with a follow-up turn each, and the training pipeline never reads the
validation sets (CPU, no model weights)."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from demo.models.prompts import read_questions

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "assets" / "prompts"
CATEGORIES = PROMPTS / "categories.jsonl"
EIGHT = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
BUNDLED = sorted(PROMPTS.glob("*.jsonl"))


def test_category_set_has_ten_questions_in_each_of_eight_categories():
    rows = read_questions(CATEGORIES)
    counts = Counter(r["category"] for r in rows)
    assert set(EIGHT) <= set(counts)
    assert all(n == 10 for n in counts.values()), counts
    assert sorted(r["question_id"] for r in rows) == list(range(1001, 1001 + len(rows)))
    assert len(rows) == 10 * len(counts) >= 80


def test_every_category_question_has_a_short_first_turn_and_one_follow_up():
    for r in read_questions(CATEGORIES):
        first, follow_up = r["turns"]  # exactly two turns, as MT-bench has
        assert len(first.split()) <= 130, r["question_id"]
        assert follow_up.strip() and follow_up != first, r["question_id"]


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_every_bundled_prompt_file_reads_as_mt_bench_questions(path):
    assert {"quick.jsonl", "questions.jsonl", "categories.jsonl"} <= {p.name for p in BUNDLED}
    text = path.read_text(encoding="utf-8")  # plain UTF-8, one JSON object per line
    assert all(isinstance(json.loads(line), dict) for line in text.splitlines() if line.strip())
    rows = read_questions(path)
    assert rows
    ids = [r["question_id"] for r in rows]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids)
    for r in rows:
        assert isinstance(r["category"], str) and r["category"]
        assert all(isinstance(t, str) and t.strip() for t in r["turns"]), r["question_id"]


def test_category_set_shares_no_turn_with_the_other_bundled_sets():
    def turns(path):
        return {" ".join(t.lower().split()) for r in read_questions(path) for t in r["turns"]}

    mine = turns(CATEGORIES)
    assert len(mine) == 2 * len(read_questions(CATEGORIES))  # no turn repeated within the set either
    for path in BUNDLED:
        if path != CATEGORIES:
            assert not mine & turns(path), path.name


def test_training_never_reads_the_validation_sets():
    # the Python that builds training data and trains; recipe.sh may bench on them, which is validation
    sources = sorted((ROOT / "training").rglob("*.py"))
    assert any(p.name == "train.py" for p in sources)
    pattern = re.compile(r"categories\.jsonl|questions\.jsonl|assets[/\\\"', ]+prompts")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sources
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not offenders, f"the training pipeline references the validation prompt sets: {offenders}"
