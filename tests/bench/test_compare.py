"""demo.bench.tools.compare: token identity and acceptance change of bench runs against a reference."""

from __future__ import annotations

import json

import pytest

from demo.bench.tools.compare import compare, main


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


def test_against_a_ceiling_run_each_run_is_given_as_its_share_of_the_ceiling(tmp_path, capsys):
    ceiling = report([[1], [2]], 4.0)
    ceiling["totals"]["config"]["ceiling"] = True
    (tmp_path / "ceiling.json").write_text(json.dumps(ceiling))
    (tmp_path / "drafter.json").write_text(json.dumps(report([[1], [3]], 1.98)))
    assert main([str(tmp_path / "ceiling.json"), str(tmp_path / "drafter.json")]) == 0
    assert "50 % of the ceiling (1.98 of 4.00 tokens a step)" in capsys.readouterr().out
    assert main([str(tmp_path / "drafter.json"), str(tmp_path / "ceiling.json")]) == 0  # not against a drafter run
    assert "of the ceiling" not in capsys.readouterr().out
