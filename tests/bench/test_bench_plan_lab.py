"""The Benchmark tab's capture lab (demo/bench/plan.py with demo/bench/faults.py): a plan with faults
measures eager too and each fault at each drafting configuration, on an engine of its own; the rows hold
each captured run to eager's counts, and the CSV and the chart keep the runs apart. On tests/tiny_chat.py's
feature_session, whose drafter drafts from the target's features. No weights, no GPU."""

from __future__ import annotations

import csv
import io

import pytest

from demo.bench.plan import BenchPlan, default_tree_draft, run_plan, summary_rows
from demo.engine import Engine
from demo.service.records import bench_csv
from demo.service.request import RequestError
from demo.ui.bench_figures import bench_figure
from tests.tiny_chat import feature_session

QUESTIONS = [{"question_id": i, "category": c, "turns": ["Say a"]} for i, c in enumerate("xy", 1)]


@pytest.fixture(scope="module")
def session():
    return feature_session(max_new_tokens=16)


def test_a_plan_with_faults_measures_eager_too_then_each_fault_at_each_drafting_configuration():
    plan = BenchPlan.of(["eagle3", "none"], [], [3, 1], 2, 24, ["stale-features", "none"])
    assert plan.faults == ("none", "stale-features")
    assert [c.label for c in plan.configs()] == [
        "target only · eager", "EAGLE-3 k=1 · eager", "EAGLE-3 k=3 · eager",
        "EAGLE-3 k=1 · replayed · no fault", "EAGLE-3 k=3 · replayed · no fault",
        "EAGLE-3 k=1 · replayed · fault: stale features", "EAGLE-3 k=3 · replayed · fault: stale features"]
    graphs = BenchPlan(methods=("eagle3",), modes=("cudagraph",), ks=(2,), faults=("draft-shape",))
    assert [c.label for c in graphs.configs()] == [  # the parity check needs eager's counts
        "EAGLE-3 k=2 · eager", "EAGLE-3 k=2 · CUDA graph", "EAGLE-3 k=2 · CUDA graph · fault: draft shape"]
    assert BenchPlan().configs() == BenchPlan.of(("none", "eagle3"), ("eager",), (1, 2, 3), 8, 64).configs()


def test_the_capture_lab_replays_the_chains_of_a_plan_that_measures_the_tree_too():
    depth, tree = default_tree_draft("cpu")
    plan = BenchPlan(methods=("eagle3",), ks=(3,), shapes=("chain", "tree"), faults=("none",), device_type="cpu")
    assert [c.label for c in plan.configs()] == [
        "EAGLE-3 k=3 · eager", f"EAGLE-3 tree {depth} × {tree.topk}, {tree.size} · eager",
        "EAGLE-3 k=3 · replayed · no fault"]


@pytest.mark.parametrize("values, message", [
    (dict(faults=("hot-cache",)), "Unknown capture fault 'hot-cache': choose among no fault, catch-up features"),
    (dict(methods=("none",), faults=("none",)), "A capture fault acts on the drafter's step"),
    (dict(shapes=("tree",), faults=("none",)), "The capture lab replays chains: choose the chain shape too."),
])
def test_a_fault_the_plan_cannot_run_is_refused_in_a_sentence(session, values, message):
    plan = BenchPlan(**{**dict(methods=("none", "eagle"), ks=(3,), num_prompts=2, max_new_tokens=8), **values})
    with pytest.raises(RequestError, match="^" + message):
        plan.check(session)


def test_each_captured_run_is_held_to_eagers_counts_and_a_fault_is_named(session):
    plan = BenchPlan(methods=("none", "eagle"), ks=(3,), num_prompts=2, max_new_tokens=16,
                     faults=("none", "stale-features"))
    plan.check(session)
    reports = list(run_plan(session, plan, QUESTIONS, "tiny.jsonl"))[-1].reports
    assert all(type(e) is Engine for e in session.models._engines.values())  # the lab's engines are its own
    rows = summary_rows(reports)
    eager, clean, faulted = rows[1:]
    assert rows[0]["parity"] is None and eager["parity"] is None  # nothing captured there
    assert clean["parity"]["equal"] and clean["mean_acceptance_length"] == eager["mean_acceptance_length"]
    assert not faulted["parity"]["equal"] and faulted["parity"]["identical_text"] == 2
    assert faulted["mean_acceptance_length"] < eager["mean_acceptance_length"] - 1
    assert faulted["parity_sentence"].startswith("parity: differs from eager's on 2 of 2 prompts: accepted at draft 1 ")
    table = list(csv.DictReader(io.StringIO(bench_csv(rows, []))))
    assert [(r["mode"], r["fault"]) for r in table] == [("eager", ""), ("eager", ""), ("eager", "none"),
                                                        ("eager", "stale-features")]
    assert table[3]["parity"] == faulted["parity_sentence"] and table[1]["parity"] == ""
    names = {t.name for t in bench_figure(rows).data if t.name}
    assert {"EAGLE · eager", "EAGLE · replayed · no fault", "EAGLE · replayed · fault: stale features"} <= names
