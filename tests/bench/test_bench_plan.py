"""The Benchmark tab's plan and run (demo/bench/plan.py), its chart (demo/ui/bench_figures.py) and its
public budget (demo/service/hosting.py), on the tiny predictable chat model of tests/tiny_chat.py: its target
always says "a" and EAGLE-1 always drafts "a", so every EAGLE draft is accepted. No weights, no GPU."""

from __future__ import annotations

import re

import pytest

from demo.bench.config import BenchConfig
from demo.bench.plan import (
    BenchPlan,
    category_table,
    check_prompts,
    default_tree_draft,
    eager_report,
    pick_prompts,
    report_text,
    run_plan,
    summary_rows,
)
from demo.methods import default_draft, default_tree
from demo.metrics import AcceptanceStats
from demo.service.chat import StepPoint
from demo.service.hosting import BENCH_WORK_BUDGET, Hosting
from demo.service.request import RequestError
from demo.ui import figures
from demo.ui.bench_figures import bench_figure
from tests.defaults import set_eagle_defaults
from tests.tiny_chat import tiny_session

QUESTIONS = [{"question_id": i, "category": c, "turns": ["Say a"]} for i, c in enumerate("xxxyyz", 1)]
DEVICE_IDS = ["a-cpus-tree", "a-gpus-tree"]  # plain data of each device; an id "cuda" would mark a test for a GPU


@pytest.fixture(scope="module")
def session():
    return tiny_session(predictable=True)


def test_configs_measure_target_only_once_per_mode_and_each_method_at_every_k():
    plan = BenchPlan(methods=("none", "eagle", "eagle3"), modes=("eager", "cudagraph"), ks=(1, 3))
    assert [(c.method, c.mode, c.k) for c in plan.configs()] == [
        ("none", "eager", 0), ("eagle", "eager", 1), ("eagle", "eager", 3), ("eagle3", "eager", 1),
        ("eagle3", "eager", 3),
        ("none", "cudagraph", 0), ("eagle", "cudagraph", 1), ("eagle", "cudagraph", 3), ("eagle3", "cudagraph", 1),
        ("eagle3", "cudagraph", 3)]
    assert BenchConfig(method="eagle3", mode="eager", num_spec_tokens=2).label == "EAGLE-3 k=2 · eager"
    assert BenchConfig(method="none", mode="cudagraph", num_spec_tokens=0).label == "target only · CUDA graph"


def test_a_rows_label_names_a_tree_by_depth_top_k_and_tokens_verified_and_a_tree_of_top_1_a_chain():
    assert BenchConfig(method="eagle3", num_spec_tokens=7, tree_topk=8, num_draft_tokens=64).label == \
        "EAGLE-3 tree 7 × 8, 64 · eager"
    # num_draft_tokens 0 verifies every candidate: 2 + 2 x 2 x 2 nodes and the root
    assert BenchConfig(method="eagle", num_spec_tokens=3, tree_topk=2).label == "EAGLE tree 3 × 2, 11 · eager"
    assert BenchConfig(method="eagle3", num_spec_tokens=3, tree_topk=1).label == "EAGLE-3 k=3 · eager"


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=DEVICE_IDS)
def test_the_tree_shape_measures_the_chat_tabs_default_tree_of_the_device_after_the_chains(device):
    k, tree = default_draft(device, 0.0)  # the Chat tab's first draft here: a tree at T = 0 on both devices
    assert tree is not None and default_tree_draft(device) == (k, tree)
    plan = BenchPlan.of(["eagle3", "none"], ["eager"], [3, 1], 8, 48, shapes=["tree", "chain"], device_type=device)
    assert plan.shapes == ("chain", "tree")
    assert [(c.method, c.k, c.tree) for c in plan.configs()] == [
        ("none", 0, None), ("eagle3", 1, None), ("eagle3", 3, None), ("eagle3", k, tree)]  # target only: no shape
    branch = f" + lookup {tree.lookup}" if tree.lookup else ""
    assert plan.configs()[-1].label == f"EAGLE-3 tree {k} × {tree.topk}, {tree.size}{branch} · eager"
    alone = BenchPlan(methods=("none", "eagle"), ks=(), shapes=("tree",), device_type=device)
    assert [(c.method, c.k, c.tree) for c in alone.configs()] == [("none", 0, None), ("eagle", k, tree)]
    assert BenchPlan().shapes == ("chain",)  # the default plan measures chains (its comment says why)


def test_where_a_devices_first_draft_is_a_chain_its_tree_is_the_default_tree_that_deep(monkeypatch):
    set_eagle_defaults(monkeypatch, "cpu", greedy=(3, None))
    assert default_tree_draft("cpu") == (3, default_tree("cpu"))  # as the settings panel starts a visitor's tree


def test_work_counts_every_configurations_verified_tokens_warm_up_included():
    plan = BenchPlan(methods=("none", "eagle3"), ks=(1, 2), num_prompts=5, max_new_tokens=64)
    # widths 1 (target only) + 2 + 3 = 6 tokens per step; 5 prompts x 64 tokens + one 16-token warm-up
    assert plan.work() == 6 * (5 * 64 + 16)
    assert plan.work(num_prompts=2) == 6 * (2 * 64 + 16)
    assert BenchPlan(methods=("none",), num_prompts=2, max_new_tokens=8).work() == 1 * (2 * 8 + 8)  # warm-up <= max new


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=DEVICE_IDS)
def test_work_counts_a_trees_tokens_verified_per_step(device):
    _, tree = default_tree_draft(device)  # its width: num_draft_tokens rows a step, the root included, and its branch's
    assert tree.size > 0
    width = tree.size + tree.lookup
    plan = BenchPlan(methods=("none", "eagle3"), ks=(1, 2), shapes=("chain", "tree"), num_prompts=5,
                     max_new_tokens=64, device_type=device)
    assert plan.work() == (1 + 2 + 3 + width) * (5 * 64 + 16)
    tree_only = BenchPlan(methods=("eagle", "eagle3"), ks=(1, 2), shapes=("tree",), num_prompts=5, max_new_tokens=64,
                          device_type=device)
    assert tree_only.work() == 2 * width * (5 * 64 + 16)  # the unused ks count nothing


@pytest.mark.parametrize("device, methods", [("cpu", ("none", "eagle3")), ("cuda", ("none", "eagle", "eagle3"))],
                         ids=DEVICE_IDS)
def test_a_public_benchmark_whose_chains_fit_the_budget_is_refused_once_it_adds_the_tree(device, methods):
    import torch

    hosting, on = Hosting(public=True), torch.device(device)
    chains = BenchPlan(methods=methods, ks=(1, 2, 3), num_prompts=8, max_new_tokens=48, device_type=device)
    hosting.check_bench_work(chains.work(), on)  # within the budget
    trees = BenchPlan(**{**chains.__dict__, "shapes": ("chain", "tree")})
    assert trees.work() > hosting.bench_budget(on)
    with pytest.raises(RequestError, match=f"^This benchmark would have the target verify up to {trees.work():,} "
                                           f"tokens; this public app allows {hosting.bench_budget(on):,} per run"):
        hosting.check_bench_work(trees.work(), on)


def test_a_plan_from_the_tabs_values_is_ordered_and_whole():
    plan = BenchPlan.of(["eagle3", "none"], ["eager"], [3, 1.0, 3], 4.0, 32.0)  # sliders send floats
    assert plan == BenchPlan(("none", "eagle3"), ("eager",), (1, 3), 4, 32)


@pytest.mark.parametrize("values, message", [
    (dict(methods=()), "Choose at least one method."),
    (dict(modes=()), "Choose at least one mode."),
    (dict(ks=()), "Choose at least one k"),
    (dict(ks=(0,)), "k = 0 is not allowed: a whole number from 1 to 10."),
    (dict(ks=(11,)), "k = 11 is not allowed"),
    (dict(max_new_tokens=0), "max new tokens = 0 is not allowed"),
    (dict(num_prompts=2.5), "number of prompts = 2.5 is not allowed"),
    (dict(modes=("eager", "cudagraph")), "CUDA graph mode is unavailable: CUDA graphs need a CUDA GPU"),
    (dict(methods=("medusa",)), "tiny has no 'medusa' drafter loaded"),
    (dict(shapes=()), "Choose at least one draft shape (chain or tree) for the drafting methods."),
    (dict(shapes=("chain", "star")), "Unknown draft shape 'star': choose among chain, tree."),
    (dict(ks=(), shapes=("chain", "tree")), "Choose at least one k for the drafting methods' chains."),
    (dict(shapes=("tree",), device_type="cuda"), "This plan drafts the default tree of a cuda device, but tiny runs "
                                                 "on cpu."),
])
def test_a_plan_the_session_cannot_run_is_refused_in_a_sentence(session, values, message):
    plan = BenchPlan.of(**{**dict(methods=("none", "eagle"), modes=("eager",), ks=(1,), num_prompts=2,
                                  max_new_tokens=8), **values})
    with pytest.raises(RequestError, match="^" + re.escape(message)):
        plan.check(session)


def test_a_plan_of_trees_needs_no_k_and_target_only_needs_no_shape(session):
    BenchPlan(methods=("none", "eagle"), ks=(), shapes=("tree",), num_prompts=2, max_new_tokens=8).check(session)
    BenchPlan(methods=("none",), ks=(), shapes=(), num_prompts=2, max_new_tokens=8).check(session)


def test_a_drafter_the_models_lack_is_refused_naming_what_is_loaded(session, monkeypatch):
    monkeypatch.setitem(session.models.drafters, "eagle3", None)
    with pytest.raises(RequestError, match="tiny has no EAGLE-3 drafter loaded; choose among: target only, n-gram lookup, EAGLE."):
        BenchPlan(methods=("eagle3",)).check(session)


def test_prompts_are_taken_in_turn_from_each_category():
    assert [q["question_id"] for q in pick_prompts(QUESTIONS, 4)] == [1, 4, 6, 2]  # x, y, z, then x again
    assert [q["question_id"] for q in pick_prompts(QUESTIONS, 10)] == [1, 4, 6, 2, 5, 3]  # all, when asked for more


def test_a_prompt_that_cannot_fit_the_context_is_refused_naming_it(session):
    plan = BenchPlan(methods=("none",), max_new_tokens=8)
    check_prompts(session, QUESTIONS, plan)
    long = {"question_id": 42, "category": "x", "turns": ["a" * 600]}  # a token per byte: 600 > the 512 context
    with pytest.raises(RequestError, match="^question 42 needs 6.. tokens of the 512-token context"):
        check_prompts(session, [QUESTIONS[0], long], plan)


def test_public_benchmarks_past_the_work_budget_are_refused_with_a_sentence(session):
    cpu = session.device
    Hosting(public=True).check_bench_work(BENCH_WORK_BUDGET["cpu"], cpu)  # the budget itself
    with pytest.raises(RequestError, match=f"verify up to 4,097 tokens; this public app allows {4096:,} per run"):
        Hosting(public=True).check_bench_work(BENCH_WORK_BUDGET["cpu"] + 1, cpu)
    Hosting(public=False).check_bench_work(10**9, cpu)  # local: no budget
    assert Hosting(public=False).bench_budget(cpu) is None


def test_a_run_measures_every_configuration_and_reports_as_the_cli(session):
    plan = BenchPlan(methods=("none", "eagle"), ks=(1, 3), num_prompts=3, max_new_tokens=9)
    chosen = pick_prompts(QUESTIONS, plan.num_prompts)
    steps = list(run_plan(session, plan, chosen, "tiny.jsonl"))
    assert [s.done for s in steps] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]  # after each prompt of 3 configurations
    assert steps[-1].finished and not any(s.finished for s in steps[:-1]) and steps[-1].fraction == 1.0
    reports = steps[-1].reports
    rows = summary_rows(reports)
    assert [(r["method"], r["k"], r["prompts"], r["generated_tokens"]) for r in rows] == [
        ("none", 0, 3, 27), ("eagle", 1, 3, 27), ("eagle", 3, 3, 27)]
    # every EAGLE draft is accepted: k + 1 tokens per target forward, acceptance 1 at every draft
    assert [r["mean_acceptance_length"] for r in rows] == [1.0, 2.0, 4.0]
    assert [r["acceptance_per_position"] for r in rows] == [[], [1.0], [1.0, 1.0, 1.0]]
    assert rows[0]["speedup"] is None and all(r["speedup"] > 0 for r in rows[1:])  # over target only, same mode
    assert {(r["k"], r["category"], r["prompts"]) for r in category_table(reports)} == {
        (k, c, 1) for k in (0, 1, 3) for c in "xyz"}
    text = report_text(reports)  # what python -m demo.bench prints, per configuration
    assert text.count("mean acceptance length: ") == 3 and "mean acceptance length: 4.00" in text
    assert "3 prompts, max_new_tokens 9" in text and "acceptance at draft 3: 1.00" in text


def test_a_tree_run_is_a_row_of_its_own_named_by_its_shape_beside_the_chain_as_deep(session):
    depth, tree = default_tree_draft("cpu")
    plan = BenchPlan(methods=("eagle",), ks=(depth,), shapes=("chain", "tree"), num_prompts=2,
                     max_new_tokens=1 + 2 * (depth + 1))  # the prefill's token, then two whole steps
    plan.check(session)
    reports = list(run_plan(session, plan, pick_prompts(QUESTIONS, 2), "tiny.jsonl"))[-1].reports
    rows = summary_rows(reports)
    assert [(r["k"], r["tree_topk"], r["num_draft_tokens"]) for r in rows] == [
        (depth, None, None), (depth, tree.topk, tree.size)]
    # EAGLE drafts "a" first and the target says "a": the chain accepts all its drafts; the tree verifies
    # its best-scored nodes, which with the drafter's logits all 0 (every candidate as likely) are the
    # shallowest, so it accepts fewer a step, but some
    chain, tree_row = rows
    assert chain["mean_acceptance_length"] == depth + 1 and chain["acceptance_per_position"] == [1.0] * depth
    assert 1 < tree_row["mean_acceptance_length"] <= depth + 1 and len(tree_row["acceptance_per_position"]) == depth
    assert {(c["k"], c["tree_topk"], c["category"]) for c in category_table(reports)} == {
        (depth, t, cat) for t in (None, tree.topk) for cat in "xy"}
    assert f"tree depth {depth} x top-{tree.topk}, {tree.size} tokens verified per step" in \
        report_text(reports)  # the CLI's words for the tree


def test_a_captured_tree_is_held_to_the_eager_tree_not_to_the_chain_as_deep():
    def report(mode, shape):
        return {"totals": {"config": {"method": "eagle3", "mode": mode, "k": 4, "fault": None, "shape": shape}}}

    chain = dict(depth=4, topk=1, nodes=4, tree=False)
    tree = dict(depth=4, topk=2, nodes=5, tree=True)
    reports = [report("eager", chain), report("eager", tree), report("cudagraph", chain), report("cudagraph", tree)]
    assert eager_report(reports, reports[3]["totals"]["config"]) is reports[1]
    assert eager_report(reports, reports[2]["totals"]["config"]) is reports[0]


def test_stopping_a_run_stops_it_between_two_prompts(session, monkeypatch):
    from demo.bench import measure

    decodes = []
    decode = measure.decode
    monkeypatch.setattr(measure, "decode", lambda *args: decodes.append(1) or decode(*args))
    run = run_plan(session, BenchPlan(methods=("eagle",), ks=(1,), num_prompts=3, max_new_tokens=9),
                   QUESTIONS[:3], "tiny.jsonl")
    assert next(run).done == 1
    run.close()  # what Gradio does when the visitor presses Stop
    assert len(decodes) == 2  # the warm-up and the first prompt: nothing after the stop


def test_the_chart_draws_each_method_and_mode_against_k_and_keeps_the_png_button():
    rows = [dict(method="none", mode="eager", k=0, mean_acceptance_length=1.0, tokens_per_s=20.0),
            dict(method="eagle3", mode="eager", k=1, mean_acceptance_length=1.7, tokens_per_s=24.0),
            dict(method="eagle3", mode="eager", k=3, mean_acceptance_length=2.5, tokens_per_s=29.0)]
    fig = bench_figure(rows)
    lines = {(t.name, t.xaxis): (list(t.x), list(t.y)) for t in fig.data if t.name}
    assert lines[("EAGLE-3 · eager", "x")] == ([1, 3], [1.7, 2.5])  # mean acceptance length against k
    assert lines[("EAGLE-3 · eager", "x2")] == ([1, 3], [24.0, 29.0])  # tokens/s against k
    assert lines[("target only · eager", "x")] == ([0], [1.0])
    baseline = [t for t in fig.data if not t.name]  # target only's tokens/s, dashed across the panel
    assert len(baseline) == 1 and list(baseline[0].y) == [20.0, 20.0] and baseline[0].line.dash == "dash"
    assert "toImage" not in fig.layout.modebar.remove
    assert bench_figure([]).layout.annotations[-1].text == "no benchmark yet"


def test_the_chart_draws_a_tree_as_a_point_at_its_depth_named_by_its_shape_beside_the_chains_line():
    rows = [dict(method="none", mode="eager", k=0, mean_acceptance_length=1.0, tokens_per_s=20.0),
            dict(method="eagle3", mode="eager", k=1, mean_acceptance_length=1.7, tokens_per_s=24.0),
            dict(method="eagle3", mode="eager", k=3, mean_acceptance_length=2.5, tokens_per_s=29.0),
            dict(method="eagle3", mode="eager", k=4, tree_topk=2, num_draft_tokens=6, mean_acceptance_length=3.1,
                 tokens_per_s=31.0)]
    traces = {(t.name, t.xaxis): t for t in bench_figure(rows).data if t.name}
    assert list(traces[("EAGLE-3 · eager", "x")].x) == [1, 3]  # the chain's line, without the tree
    point = traces[("EAGLE-3 tree 4 × 2, 6 · eager", "x")]
    assert (list(point.x), list(point.y), point.mode) == ([4], [3.1], "markers")
    assert list(traces[("EAGLE-3 tree 4 × 2, 6 · eager", "x2")].y) == [31.0]


def test_every_chart_keeps_plotlys_download_as_png_button():
    points = [StepPoint(1, 3, 2, 3, 1.0, 2.0, 0.1, 30.0)]
    charts = [figures.acceptance_figure(AcceptanceStats(3)), figures.acceptance_length_figure(points),
              figures.latency_figure(points), figures.throughput_figure(points), figures.tree_figure(None, [], 0)]
    for fig in charts:  # gr.Plot sends no plotly config: the modebar is plotly's, less what the layout removes
        assert "toImage" not in fig.layout.modebar.remove
