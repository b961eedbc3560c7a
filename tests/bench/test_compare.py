"""demo.bench.compare: token identity and acceptance change of bench runs against a reference."""

from __future__ import annotations

import json

import pytest

from demo.bench.compare import compare, main


def report(token_ids: list[list[int]], mal: float, mode: str = "eager", compile_: bool = False) -> dict:
    records = [{"question_id": i, "turn": 1, "prompt_tokens": 5, "token_ids": t} for i, t in enumerate(token_ids)]
    summary = {"mean_acceptance_length": mal, "tokens_per_s": 10.0, "mean_draft_ms": 1.0, "mean_verify_ms": 2.0}
    return {"records": records, "totals": {"summary": summary,
                                           "config": {"method": "eagle3", "mode": mode, "compile": compile_}}}


def test_compare_counts_identical_prompts_and_locates_the_first_difference():
    ref = report([[1, 2, 3], [4, 5], [6]], 2.0)
    got = report([[1, 2, 3], [4, 9], [6, 7]], 1.98, "cudagraph", True)
    c = compare(ref, got)
    assert c["identical"] == 1 and c["prompts"] == 3
    assert c["first_differences"] == [(1, 1), (2, 1)]  # a changed token, then a longer decode
    assert c["relative_change"] == pytest.approx(-0.01)
    assert compare(ref, ref)["identical"] == 3 and compare(ref, ref)["relative_change"] == 0


def test_compare_refuses_runs_of_different_prompts(tmp_path, capsys):
    a, b = report([[1], [2]], 2.0), report([[1]], 2.0)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "different prompts" in capsys.readouterr().err
    assert main([str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert "| 2/2 |" in capsys.readouterr().out
