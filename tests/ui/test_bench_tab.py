"""The Benchmark tab of a public app on the tiny predictable model (tests/tiny_chat.py), driven as the
page drives it (Gradio's queue, tests/service/http_app.py): a plan within the work budget is
measured and shown with its CSV, one past it is refused in a sentence, and so is a file that is not
MT-bench JSONL. No weights, no GPU, no browser."""

from __future__ import annotations

import csv
import io
import threading

import httpx

from demo.bench.plan import BenchPlan, default_tree_draft
from demo.engine import Engine
from demo.service.engine_thread import run_on_engine_thread
from demo.service.hosting import BENCH_WORK_BUDGET
from demo.ui.bench_tab import DEFAULT_PLAN
from tests.service.http_app import client, ui_event

SMALL = {"sl-bench-methods": ["none", "eagle"], "sl-bench-ks": [2], "sl-bench-num-prompts": 2, "sl-bench-max-new": 10}


def test_a_benchmark_within_the_budget_shows_its_tables_chart_report_and_csv(public_app):
    demo, url = public_app
    with httpx.Client() as http:
        out = ui_event(http, url, demo, "run_benchmark", "bench-a", client(1), SMALL)
        assert "error" not in out, out
        assert "done: 2 configuration(s) on 2 prompts of assets/prompts/categories.jsonl" in out["sl-bench-status"]
        summary = out["sl-bench-summary"]["data"]
        assert [row[0] for row in summary] == ["target only · eager", "EAGLE k=2 · eager"]
        assert summary[1][3] == 3.0 and summary[1][4] == "1.00 · 1.00"  # every draft accepted, 10 = 1 + 3 steps of k + 1
        categories = out["sl-bench-categories"]["data"]
        assert {(row[0], row[1]) for row in categories} == {(c, cat) for c in ("target only · eager", "EAGLE k=2 · eager")
                                                            for cat in ("writing", "roleplay")}  # one from each
        assert out["sl-bench-report"].count("mean acceptance length: ") == 2  # what python -m demo.bench prints
        rows = list(csv.DictReader(io.StringIO(http.get(out["sl-bench-csv"]["value"]["url"], timeout=30).text)))
        assert [(r["method"], r["k"], r["category"]) for r in rows][:2] == [("none", "0", "all"), ("eagle", "2", "all")]
        assert len(rows) == 2 + 4 and rows[1]["mean_acceptance_length"] == "3.0"


def test_a_tree_benchmark_shows_a_row_named_by_the_trees_shape_and_a_csv_that_can_rerun_it(public_app):
    demo, url = public_app
    depth, tree = default_tree_draft("cpu")  # the public tiny app runs on a CPU
    label = f"EAGLE tree {depth} × {tree.topk}, {tree.size} · eager"
    with httpx.Client() as http:
        out = ui_event(http, url, demo, "run_benchmark", "bench-tree", client(5), {**SMALL, "sl-bench-shapes": ["tree"]})
        assert "error" not in out, out
        assert [row[0] for row in out["sl-bench-summary"]["data"]] == ["target only · eager", label]
        assert {row[0] for row in out["sl-bench-categories"]["data"]} == {"target only · eager", label}
        rows = list(csv.DictReader(io.StringIO(http.get(out["sl-bench-csv"]["value"]["url"], timeout=30).text)))
    assert [(r["method"], r["k"], r["tree_topk"], r["num_draft_tokens"]) for r in rows][:2] == [
        ("none", "0", "", ""), ("eagle", str(depth), str(tree.topk), str(tree.size))]


def test_on_a_public_gpu_the_tabs_default_plan_with_the_default_tree_fits_the_budget():
    from dataclasses import replace

    plan = replace(DEFAULT_PLAN, device_type="cuda", shapes=("chain", "tree"))
    assert plan.work() <= BENCH_WORK_BUDGET["cuda"]


def test_a_tree_that_takes_a_plan_past_the_public_budget_is_refused_with_a_sentence(public_app):
    demo, url = public_app
    values = {**SMALL, "sl-bench-ks": [1, 2, 3], "sl-bench-num-prompts": 8, "sl-bench-max-new": 48}
    chains = BenchPlan(("none", "eagle"), ("eager",), (1, 2, 3), 8, 48)
    trees = BenchPlan(("none", "eagle"), ("eager",), (1, 2, 3), 8, 48, shapes=("chain", "tree"))
    assert chains.work() <= BENCH_WORK_BUDGET["cpu"] < trees.work()  # the tree's tokens verified tip it over
    with httpx.Client() as http:
        out = ui_event(http, url, demo, "run_benchmark", "bench-over", client(6),
                       {**values, "sl-bench-shapes": ["chain", "tree"]})
    assert out["error"] == (f"This benchmark would have the target verify up to {trees.work():,} tokens; this public "
                            f"app allows {BENCH_WORK_BUDGET['cpu']:,} per run. Choose fewer prompts, fewer max new "
                            "tokens, or fewer methods, modes, draft shapes or k values."), out


def test_a_benchmark_decodes_on_the_engine_thread_as_the_chat_does(public_app, monkeypatch):
    """Each decode on the thread that loaded the models (demo/service/engine_thread.py): a CPU's
    thread pools would otherwise compete and the table would time a slower engine than the chat's."""
    demo, url = public_app
    threads, real = [], Engine.generate

    def generate(self, *args, **kwargs):
        threads.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    with httpx.Client() as http:
        out = ui_event(http, url, demo, "run_benchmark", "bench-t", client(4), SMALL)
    assert "error" not in out, out
    assert threads and set(threads) == {run_on_engine_thread(threading.get_ident)}


def test_a_benchmark_past_the_public_budget_is_refused_with_a_sentence(public_app):
    demo, url = public_app
    big = {**SMALL, "sl-bench-num-prompts": 80, "sl-bench-max-new": 512}
    with httpx.Client() as http:
        out = ui_event(http, url, demo, "run_benchmark", "bench-b", client(2), big)
    assert f"this public app allows {BENCH_WORK_BUDGET['cpu']:,} per run" in out["error"]


def test_an_uploaded_file_that_is_not_mt_bench_jsonl_is_refused_in_one_line(public_app):
    demo, url = public_app
    with httpx.Client() as http:
        paths = http.post(url + "gradio_api/upload", files={"files": ("mine.jsonl", b'{"turns": ["ok"]}\nnot json\n')},
                          timeout=30).json()
        upload = {"path": paths[0], "orig_name": "mine.jsonl", "meta": {"_type": "gradio.FileData"}}
        out = ui_event(http, url, demo, "run_benchmark", "bench-c", client(3), {**SMALL, "sl-bench-file": upload})
        assert out["error"].startswith("mine.jsonl, line 2: not JSON") and "\n" not in out["error"]
        described = ui_event(http, url, demo, "describe_prompts", "bench-c", client(3), {"sl-bench-file": upload})
        assert "mine.jsonl, line 2: not JSON" in described["sl-bench-prompts"]


def test_a_new_run_clears_the_last_runs_results_as_it_starts(public_app):
    """A run's first update empties the tables, the chart and the report, so a Stop pressed before it
    ends never leaves another run's results on the page as if they were this one's (the status says
    why the page is empty)."""
    demo, _ = public_app
    fn = next(f for f in demo.fns.values() if f.name == "run_benchmark")
    data = [SMALL.get(block.elem_id, block.value) for block in fn.inputs]
    first = {block.elem_id: value for block, value in next(iter(fn.fn(*data))).items()}
    assert "warming up" in first["sl-bench-status"]
    assert first["sl-bench-summary"] is None and first["sl-bench-categories"] is None
    assert first["sl-bench-report"] == "" and not first["sl-bench-chart"].data  # an empty chart
    stopped = next(f for f in demo.fns.values() if f.name == "bench_stopped").fn()
    assert "a run shows its tables and chart when it ends" in stopped
