"""The bench tests' prompts and tiny target (tests/bench/test_bench.py makes it), saved to a
temporary directory so that every bench CLI loads it as it loads a real one."""

from __future__ import annotations

import json

import pytest

from tests.bench.test_bench import QUESTIONS, _tiny_target_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = _tiny_target_dir(root / "target")
    prompts = root / "questions.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return {"root": root, "target": target, "prompts": prompts}
