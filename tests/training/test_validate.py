"""Validation (training/validate.py): hold-out prompts from an exported directory, the table, and
split runs (by drafter, k, T or prompt shard) that merge into the whole run's report count for count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from demo.drafter_common import DrafterConfig
from demo.drafter_eagle3 import Eagle3Drafter
from demo.engine import Engine
from demo.target import Target
from tests import tiny
from tests.training.helpers import tiny_hf, tiny_run_inputs
from training.data import ShardWriter


def test_validation_prompts_from_an_exported_directory(tmp_path):
    from training.validate import holdout_prompt_ids

    writer = ShardWriter(tmp_path)
    rows = [[256, i, i + 1] for i in range(8)] + [[256] + [1] * 50]
    for i, ids in enumerate(rows):
        writer.add(ids, [0] * len(ids), 100 + i)
    writer.flush()
    (tmp_path / "meta.json").write_text(json.dumps({"holdout_fingerprint": "abc"}))
    ids, fingerprint = holdout_prompt_ids(None, 3, 10, 0, str(tmp_path))
    again, _ = holdout_prompt_ids(None, 3, 10, 0, str(tmp_path))
    assert fingerprint == "abc" and ids == again and len(ids) == 3 and all(p in rows[:8] for p in ids)
    assert ids == [p for p in rows if p in ids]  # file order kept


def test_validation_runs_and_tabulates():
    from training.validate import markdown_table, run

    target = Target(tiny_hf(seed=6))
    aux = target.config.default_aux_layers()
    drafter = Eagle3Drafter(DrafterConfig.for_target("eagle3", target.config, aux_layer_ids=aux))
    engine = Engine(target, drafter, max_context=64)
    stats = run(engine, [[256, 1, 2], [256, 3]], k=2, temperature=1.0, max_new_tokens=5, seed=0)
    assert stats.num_drafts > 0 and len(stats.acceptance_per_position) == 2
    row = {"drafter": "eagle3 (x)", "temperature": 1.0, "k": 2, **stats.summary()}
    table = markdown_table([row], max_k=3)
    assert table.splitlines()[0].count("acc. token") == 3 and "| eagle3 (x) | 1 | 2 |" in table


def test_prompt_shards_of_a_validation_add_up_to_the_whole_run_count_for_count(tmp_path):
    from demo.models.checkpoints import save_drafter
    from training.validate import main as validate

    target_dir, _ = tiny_run_inputs(tmp_path)
    target = Target(LlamaForCausalLM.from_pretrained(target_dir).eval())
    save_drafter(tiny.tiny_drafter("eagle3", target, own_lm_head=False), tmp_path / "drafter")
    writer = ShardWriter(tmp_path / "prompts")
    g = torch.Generator().manual_seed(4)
    for i in range(7):
        ids = [256] + torch.randint(0, 256, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        writer.add(ids, [0] * len(ids), 100 + i)
    writer.flush()
    (tmp_path / "prompts" / "meta.json").write_text(json.dumps({"holdout_fingerprint": "abc"}))

    def report(name, *extra):
        validate(["--drafter", str(tmp_path / "drafter"), "--target", str(target_dir), "--prompts",
                  str(tmp_path / "prompts"), "--num-prompts", "6", "--max-new-tokens", "12", "--ks", "2,3",
                  "--temperatures", "0,1", "--device", "cpu", "--no-progress", "--json", str(tmp_path / name), *extra])
        return str(tmp_path / name)

    whole = json.loads(Path(report("whole.json")).read_text())
    parts = [report(f"part{i}.json", "--shard", f"{i}/3") for i in range(3)]
    merged = validate(["--merge", *parts])
    assert merged["prompts"] == whole["prompts"] == 6
    for row, want in zip(merged["runs"], whole["runs"], strict=True):
        assert row["shards"] == 3 and (row["temperature"], row["k"]) == (want["temperature"], want["k"])
        for key in ("num_drafts", "num_accepted_tokens", "num_generated", "accepted_per_position",
                    "acceptance_per_position", "mean_acceptance_length", "steps_after_full", "steps_after_rejection",
                    "first_accepted_after_full", "first_accepted_after_rejection"):
            assert row[key] == want[key], key  # T = 1 too: each prompt samples with its own seed
    assert merged["table"].splitlines()[2:] == whole["table"].splitlines()[2:]
    assert "| after a full chain | steps | after a rejection | steps |" in whole["table"]
    with pytest.raises(SystemExit, match=r"shards \[0, 2\] of 3"):
        validate(["--merge", parts[0], parts[2]])


def test_split_validation_runs_merge_into_the_single_runs_table():
    from training.validate import merge_reports

    def report(rows, mode="eager", **kw):
        base = {"prompts": 2, "holdout_fingerprint": "f", "max_new_tokens": 8, "max_prompt_tokens": 64, "seed": 0,
                "mode": mode, "dtype": "float32"}
        return {**base, **kw, "runs": [{"drafter": p, "path": p, "temperature": t, "k": k, "num_drafts": 4,
                                         "num_accepted_tokens": a, "num_generated": 8, "mean_acceptance_length": 1 + a / 4,
                                         "acceptance_per_position": [a / 4] + [0.0] * (k - 1)} for p, t, k, a in rows]}

    whole = report([("e3", 0.0, 1, 2), ("e3", 0.0, 2, 3), ("e3", 1.0, 1, 1), ("e1", 0.0, 1, 1)])
    parts = [report([("e3", 1.0, 1, 1), ("e1", 0.0, 1, 1)]), report([("e3", 0.0, 2, 3), ("e3", 0.0, 1, 2)], "cudagraph"),
             report([("e3", 0.0, 2, 3)])]  # the same run in eager and graph mode: kept once
    merged = merge_reports(parts)
    key = lambda r: (r["path"], r["temperature"], r["k"], r["num_accepted_tokens"])  # noqa: E731
    assert sorted(map(key, merged["runs"])) == sorted(map(key, whole["runs"]))
    assert [r["path"] for r in merged["runs"]] == ["e3", "e3", "e3", "e1"]  # drafters in first-seen order, then T, k
    assert next(r for r in merged["runs"] if r["k"] == 2)["also_in_modes"] == ["eager"]
    with pytest.raises(SystemExit, match="twice with different results"):
        merge_reports([report([("e3", 0.0, 1, 2)]), report([("e3", 0.0, 1, 3)], "cudagraph")])
    compiled = report([("e3", 0.0, 1, 1)], "cudagraph")
    compiled["runs"][0]["compile"] = True  # compilation may change the numerics: a row of its own
    both = merge_reports([report([("e3", 0.0, 1, 2)]), compiled])
    assert [(r["num_accepted_tokens"], r.get("compile", False)) for r in both["runs"]] == [(2, False), (1, True)]
    assert "| e3, all compiled | 0 | 1 |" in both["table"]
    with pytest.raises(SystemExit, match="max_new_tokens"):
        merge_reports([report([("e3", 0.0, 1, 2)]), report([("e3", 0.0, 2, 2)], max_new_tokens=9)])
    with pytest.raises(SystemExit, match="dtype"):
        merge_reports([report([("e3", 0.0, 1, 2)]), report([("e3", 0.0, 2, 2)], dtype="bfloat16")])
