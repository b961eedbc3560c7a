"""The sweep (demo.bench.tools.sweep): one engine measures several rows over several prompt sets, each
row's figures equal to the bench's own run of that row, and rows that need another engine are
refused before anything loads."""

from __future__ import annotations

import json

import pytest

from demo.bench.tools import cli as bench
from demo.bench.tools import sweep
from tests.bench.test_bench import FAST, QUESTIONS, _drafter


def _common(models):
    return ["--target", str(models["target"]), "--method", "eagle3", "--drafter", _drafter(models, "eagle3"), *FAST,
            "--temperature", "1", "--seed", "3"]


def test_each_row_counts_what_the_bench_counts_for_it_alone(models, tmp_path, capsys):
    other = tmp_path / "two.jsonl"
    other.write_text(json.dumps(QUESTIONS[1]) + "\n")
    rows = ["-k 3 --draft-sampling pointmass", "-k 2 --tree-topk 2 --num-draft-tokens 5 --draft-sampling wor"]
    argv = _common(models) + ["--prompts", str(models["prompts"]), "--prompts", str(other),
                              "--json-dir", str(tmp_path / "out")]
    for row in rows:
        argv += ["--row", row]
    assert sweep.main(argv) == 0
    printed = capsys.readouterr().out
    for i, row in enumerate(rows):
        for j, prompts in enumerate((models["prompts"], other)):
            got = json.loads((tmp_path / "out" / f"row{i}-set{j}.json").read_text())["totals"]["counts"]
            alone = tmp_path / f"alone{i}{j}.json"
            assert bench.main(_common(models) + row.split() + ["--prompts", str(prompts), "--json", str(alone)]) == 0
            want = json.loads(alone.read_text())["totals"]["counts"]
            assert {k: got[k] for k in ("num_drafts", "num_accepted_tokens", "num_generated")} == \
                   {k: want[k] for k in ("num_drafts", "num_accepted_tokens", "num_generated")}
    table = printed[printed.index("| prompts |"):].splitlines()
    assert len(table) == 2 + len(rows) * 2
    assert table[2].split("|")[6].strip() == "1.00"  # the first row is its own reference
    assert "without replacement" in table[4]


@pytest.mark.parametrize("row, field", [("--mode cudagraph", "mode"), ("--kernels torch --ceiling", "ceiling")])
def test_a_row_that_needs_another_engine_is_refused_naming_what_differs(models, row, field, capsys):
    argv = ["--method", "eagle3", "--prompts", str(models["prompts"]), "--row", "-k 2", "--row", "-k 3", "--row", row]
    with pytest.raises(SystemExit) as e:
        sweep.plan(argv)
    err = capsys.readouterr().err.splitlines()[-1]
    assert e.value.code == 2 and "needs another engine than the first row" in err and field in err.split("(another ")[1]
