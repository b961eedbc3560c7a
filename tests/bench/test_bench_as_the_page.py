"""The bench measures and words what the page shows: without shape flags it drafts the shape the Chat
tab offers first for the method on the device at the temperature (demo/methods.py), explicit flags
keep their meaning, the report names the shape it ran and says when it was the device's default, and
the acceptance table numbers drafts 1..k as the page does. No weights, no GPU."""

from __future__ import annotations

import json

import pytest
import torch

from demo.bench.report import format_report
from demo.bench.tools import cli as bench
from demo.config import TreeShape
from demo.methods import default_draft
from demo.metrics import AcceptanceStats
from tests.bench.test_bench import _argv


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("method", ["eagle3", "eagle", "ngram"])
@pytest.mark.parametrize("temperature", ["0", "1"])
def test_the_bench_without_shape_flags_runs_the_methods_default_on_the_device(device, method, temperature):
    # --device cuda is only parsed here: the shape is chosen before anything touches the device
    config = bench.parse_args(["--method", method, "--device", device, "--temperature", temperature])
    assert (config.k, config.tree) == default_draft(device, float(temperature), method)
    assert config.shape_default_on == device


@pytest.mark.parametrize("cuda", [False, True])
def test_device_auto_takes_the_default_of_the_device_the_bench_would_run_on(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    device = "cuda" if cuda else "cpu"
    config = bench.parse_args([])  # --method eagle3 --device auto
    assert (config.k, config.tree, config.shape_default_on) == (*default_draft(device, 0.0, "eagle3"), device)


@pytest.mark.parametrize("flags, k, tree", [
    (["-k", "3"], 3, None),  # any one shape flag: the others keep the defaults they always had
    (["--num-spec-tokens", "5"], 5, None),
    (["--tree-depth", "4", "--tree-topk", "2"], 4, TreeShape(2, 0, 0)),
    (["--tree-topk", "2"], 3, TreeShape(2, 0, 0)),
    (["--tree-topk", "2", "--num-draft-tokens", "6", "--lookup", "4"], 3, TreeShape(2, 6, 4)),
])
def test_any_shape_flag_keeps_every_other_shape_flag_at_its_fixed_default(flags, k, tree):
    config = bench.parse_args(["--device", "cpu", *flags])
    assert (config.k, config.tree) == (k, tree)


def test_target_only_stays_target_only_without_shape_flags():
    config = bench.parse_args(["--method", "none", "--device", "cpu"])
    assert (config.k, config.tree, config.width) == (0, None, 1)


def test_an_explicit_shape_flag_that_cannot_run_is_still_refused(capsys):
    # --lookup alone, as before: a branch hangs on a tree, and no default tree is slipped in
    assert bench.main(["--device", "cpu", "--lookup", "4"]) == 2
    assert "--lookup hangs a branch on a tree: give --tree-topk too" in capsys.readouterr().err


def test_the_report_names_the_shape_it_ran_and_that_it_was_the_devices_default(models, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    k, tree = default_draft("cpu", 0.0, "eagle3")  # a tree 4 x 2, 6: what the page offers first on a CPU
    assert bench.main(_argv(models, "eagle3", "--device", "cpu", "--num-prompts", "1", "--json", str(out_json))) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f"tree depth {k} x top-{tree.topk}, {tree.size} tokens verified per step (the default on cpu)" in first
    config = json.loads(out_json.read_text())["totals"]["config"]
    assert (config["k"], config["shape"]["topk"], config["shape"]["nodes"] + 1) == (k, tree.topk, tree.size)
    assert config["shape_default_on"] == "cpu"
    assert bench.main(_argv(models, "eagle3", "--device", "cpu", "--num-prompts", "1", "-k", "3")) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert ", k=3, " in first and "the default" not in first  # a shape given is not called the default


def test_the_reports_acceptance_is_numbered_by_draft_as_the_page_numbers_it():
    # 100 steps of k=3: 74 accepted draft 1, 54 drafts 1 and 2, 41 all three (the page's "draft 1 .. k")
    stats = AcceptanceStats(reach=3, num_drafts=100, num_draft_tokens=300, num_accepted_tokens=169,
                            accepted_per_position=[74, 54, 41], num_steps=100, num_generated=270,
                            elapsed_s=1.35, steps_after_full=40, first_accepted_after_full=36,
                            steps_after_rejection=58, first_accepted_after_rejection=37)
    config = dict(target="default", target_name="SmolLM2-135M-Instruct", drafter="d", method="eagle3", k=3,
                  mode="eager", compile=False, device="cpu", dtype="float32", gpu=None, max_new_tokens=256,
                  temperature=0.0, warmup=1)
    report = {"records": [], "totals": {"config": config, "num_prompts": 2, "counts": stats.__dict__,
                                        "warmup_s": 0.5, "capture_s": 0.0}}
    lines = format_report(report).splitlines()
    assert [line for line in lines if line.startswith("acceptance at")] == [
        "acceptance at draft 1: 0.74",
        "acceptance at draft 2: 0.54",
        "acceptance at draft 3: 0.41",
        "acceptance at draft 1 after a full step: 0.90 (40 steps), after a rejected step: 0.64 (58 steps)",
    ]
    assert not any("token 0" in line or "at token" in line for line in lines)
