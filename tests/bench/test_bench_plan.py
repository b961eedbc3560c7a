"""The Benchmark tab's plan and run (demo/bench/plan.py), its chart (demo/ui/bench_figures.py) and its
public budget (demo/service/hosting.py), on the tiny predictable chat model of tests/tiny_chat.py: its target
always says "a" and EAGLE-1 always drafts "a", so every EAGLE draft is accepted. No weights, no GPU."""

from __future__ import annotations

import pytest

from demo.bench.config import BenchConfig
from demo.bench.plan import (
    BenchPlan,
    category_table,
    check_prompts,
    pick_prompts,
    report_text,
    run_plan,
    summary_rows,
)
from demo.metrics import AcceptanceStats
from demo.service.chat import StepPoint
from demo.service.hosting import BENCH_WORK_BUDGET, Hosting
from demo.service.request import RequestError
from demo.ui import figures
from demo.ui.bench_figures import bench_figure
from tests.tiny_chat import tiny_session

QUESTIONS = [{"question_id": i, "category": c, "turns": ["Say a"]} for i, c in enumerate("xxxyyz", 1)]


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


def test_work_counts_every_configurations_verified_tokens_warm_up_included():
    plan = BenchPlan(methods=("none", "eagle3"), ks=(1, 2), num_prompts=5, max_new_tokens=64)
    # widths 1 (target only) + 2 + 3 = 6 tokens per step; 5 prompts x 64 tokens + one 16-token warm-up
    assert plan.work() == 6 * (5 * 64 + 16)
    assert plan.work(num_prompts=2) == 6 * (2 * 64 + 16)
    assert BenchPlan(methods=("none",), num_prompts=2, max_new_tokens=8).work() == 1 * (2 * 8 + 8)  # warm-up <= max new


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
])
def test_a_plan_the_session_cannot_run_is_refused_in_a_sentence(session, values, message):
    plan = BenchPlan.of(**{**dict(methods=("none", "eagle"), modes=("eager",), ks=(1,), num_prompts=2,
                                  max_new_tokens=8), **values})
    with pytest.raises(RequestError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        plan.check(session)


def test_a_drafter_the_models_lack_is_refused_naming_what_is_loaded(session, monkeypatch):
    monkeypatch.setitem(session.models.drafters, "eagle3", None)
    with pytest.raises(RequestError, match="tiny has no EAGLE-3 drafter loaded; choose among: target only, EAGLE."):
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
    assert "3 prompts, max_new_tokens 9" in text and "acceptance at token 2: 1.00" in text


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


def test_every_chart_keeps_plotlys_download_as_png_button():
    points = [StepPoint(1, 3, 2, 3, 1.0, 2.0, 0.1, 30.0)]
    charts = [figures.acceptance_figure(AcceptanceStats(3)), figures.acceptance_length_figure(points),
              figures.latency_figure(points), figures.throughput_figure(points), figures.tree_figure(None, [], 0)]
    for fig in charts:  # gr.Plot sends no plotly config: the modebar is plotly's, less what the layout removes
        assert "toImage" not in fig.layout.modebar.remove
