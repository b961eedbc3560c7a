"""The Benchmark tab: measure methods x modes x draft shapes (a chain at each chosen k, the device's
default tree) over a prompt set with the visitor's models, and show what ``python -m demo.bench``
prints, a table per configuration and per prompt category, a chart against k (a tree: its depth), and
a CSV download.

A layout builder that returns the components (``build_bench_tab``), then one function that
registers the tab's listeners (``register``).
The plan, its checks and its run are demo/bench/plan.py's; the chart demo/ui/bench_figures.py's; the
CSV demo/service/records.py's; the public work budget demo/service/hosting.py's. In local mode the
capture lab's fault switch (demo/bench/faults.py) adds captured runs of the chains, each held to eager's
counts by the parity check, and their panel (demo/ui/html/lab.py); a public app builds neither. A run
holds the engine like a chat reply (the same concurrency group) and stops between two prompts when the
visitor presses Stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from demo.bench.config import BenchConfig
from demo.bench.faults import FAULT_LABELS, FAULTS
from demo.bench.parity import parity_cell
from demo.bench.plan import (
    BUNDLED_PROMPTS,
    BenchPlan,
    category_table,
    check_prompts,
    default_tree_draft,
    pick_prompts,
    report_text,
    row_config,
    run_plan,
    summary_rows,
)
from demo.methods import APP_MAX_SPEC_TOKENS, DEFAULT_METHOD, METHOD_LABELS, MODE_LABELS
from demo.models.prompts import PromptFileError, questions_from_upload, read_questions
from demo.service import zerogpu
from demo.service.downloads import write_download
from demo.service.engine_thread import on_engine_thread
from demo.service.records import bench_csv
from demo.service.hosting import Hosting
from demo.service.model_cache import ModelCache
from demo.service.request import RequestError
from demo.service.session import Session, shown_session, visitor_session
from demo.ui.bench_figures import bench_figure
from demo.ui.events import ENGINE, PRIVATE
from demo.ui.html.lab import render_lab
from demo.ui.html.render import escape, status_html

MAX_PROMPT_FILE_BYTES = 2**20  # hosting.MAX_FILE_SIZE bounds uploads already; a file read here is never larger
DEFAULT_PLAN = BenchPlan(methods=("none", DEFAULT_METHOD), modes=("eager",), ks=(1, 2, 3), num_prompts=8,
                         max_new_tokens=48)
SUMMARY_HEADERS = ["configuration", "prompts", "tokens", "mean acceptance length", "acceptance at draft 1..k",
                   "tokens/s", "speedup vs target only", "propose ms/step", "verify ms/step",
                   "parity (captured = eager)"]
# In pixels, each as wide as its longest word or number: shares of a narrow column cut "prompts" to "pro"
# and split "33.7" over two lines; a table wider than its column scrolls sideways instead.
SUMMARY_WIDTHS = ["160px", "76px", "64px", "96px", "120px", "76px", "80px", "76px", "72px", "128px"]
CATEGORY_HEADERS = ["configuration", "category", "prompts", "mean acceptance length", "tokens/s"]
ABOUT = ("Measures each configuration over the same prompts with the engine the chat uses, as `python -m demo.bench` "
         "does: greedy (T = 0), one uncounted warm-up generation per configuration, the first turn of each question. "
         "Each drafting method drafts, per step, a **chain** of k drafts at each chosen k and/or the **tree** the Chat "
         "tab drafts by default on this device (*tree d × K, N*: d deep, the top K children of each expanded node, N "
         "tokens verified per step, the root included). **Mean acceptance length** = tokens per target forward, 1 + "
         "accepted / drafts (it includes the target's own token); **acceptance at draft i** = share of steps whose "
         "first i drafts were all accepted (a tree's: along its accepted path, i deep); **tokens/s** = generated "
         "tokens per second of engine time. Prompts are taken in turn from each category. Other trees: the CLI's "
         "`--tree-topk` and `--num-draft-tokens`.")


@dataclass
class BenchControls:
    """The components the tab's listeners read and write."""

    model_note: gr.Markdown
    prompt_file: gr.File
    prompt_note: gr.Markdown
    methods: gr.CheckboxGroup
    modes: gr.CheckboxGroup
    shapes: gr.CheckboxGroup
    ks: gr.CheckboxGroup
    num_prompts: gr.Slider
    max_new_tokens: gr.Slider
    work: gr.Markdown
    run: gr.Button
    stop: gr.Button
    status: gr.HTML
    summary: gr.Dataframe
    categories: gr.Dataframe
    chart: gr.Plot
    report: gr.Code
    csv: gr.DownloadButton
    faults: gr.CheckboxGroup | None = None  # the capture lab (local mode only)
    lab: gr.HTML | None = None

    @property
    def plan_inputs(self) -> list:
        """The plan's components, in tab_plan's order."""
        return [self.methods, self.modes, self.shapes, self.ks, self.num_prompts, self.max_new_tokens] + \
            ([self.faults] if self.faults is not None else [])

    @property
    def results(self) -> list:
        return [self.status, self.summary, self.categories, self.chart, self.report, self.csv] + \
            ([self.lab] if self.lab is not None else [])


# ---------------------------------------------------------------------- pure pieces the listeners show
def model_note(session: Session) -> str:
    info = session.describe()
    return (f"Measures **{escape(session.name)}** on {info['device']} ({info['dtype']}), the models chosen in the "
            "Chat tab.")


def method_options(session: Session) -> dict:
    return dict(choices=[(METHOD_LABELS[m], m) for m in session.methods()],
                value=[m for m in DEFAULT_PLAN.methods if m in session.methods()] or session.methods()[-1:])


def mode_options(session: Session) -> dict:
    unavailable = session.cudagraph_unavailable()
    modes = ["eager"] if unavailable else ["eager", "cudagraph"]
    return dict(choices=[(MODE_LABELS[m], m) for m in modes], value=["eager"],
                info=f"CUDA graph unavailable: {unavailable}." if unavailable else "CUDA graph: steps replayed from "
                "graphs captured in the warm-up")


def shape_options(session: Session) -> dict:
    """Chain and this device's default tree, named by its shape (BenchConfig.drafts_label)."""
    depth, tree = default_tree_draft(session.device.type)
    name = BenchConfig(num_spec_tokens=depth, tree_topk=tree.topk, num_draft_tokens=tree.size,
                       lookup=tree.lookup).drafts_label
    return dict(choices=[("chain, at each k", "chain"), (f"{name} (the Chat tab's default here)", "tree")],
                value=list(DEFAULT_PLAN.shapes))


def tab_plan(device_type: str, methods, modes, shapes, ks, num_prompts, max_new_tokens, faults=()) -> BenchPlan:
    """The plan of the tab's values (BenchControls.plan_inputs), its tree the default of `device_type`."""
    return BenchPlan.of(methods, modes, ks, num_prompts, max_new_tokens, faults, shapes, device_type)


def prompt_set(path: str | None) -> tuple[list[dict], str]:
    """(questions, source) of an uploaded file, or of the bundled project questions when there is none.
    Raises PromptFileError with one line."""
    if not path:
        return read_questions(BUNDLED_PROMPTS), f"assets/prompts/{BUNDLED_PROMPTS.name}"
    with open(path, "rb") as f:
        data = f.read(MAX_PROMPT_FILE_BYTES + 1)
    name = Path(path).name
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise PromptFileError(f"{name}: larger than {MAX_PROMPT_FILE_BYTES // 2**20} MB.")
    return questions_from_upload(data, name), name


def prompt_note(questions: list[dict], source: str) -> str:
    categories = len({q["category"] for q in questions})
    what = "the bundled project questions" if source.startswith("assets/") else "your file"
    return (f"Prompt set: {what}, `{escape(source)}`: {len(questions)} questions in {categories} "
            f"{'category' if categories == 1 else 'categories'} (MT-bench / Spec-Bench JSONL).")


def work_note(plan: BenchPlan, num_questions: int, budget: int | None) -> str:
    """What the plan asks of the target, against the public budget when there is one."""
    n = min(plan.num_prompts, num_questions) if isinstance(plan.num_prompts, int) else 0
    try:
        work, configs = plan.work(n), len(plan.configs())
    except TypeError:  # a k that is not a number: the run refuses it in a sentence
        return ""
    rule = (f"(prompts x max new tokens + {plan.warmup_tokens} warm-up tokens) x tokens verified per step (a "
            "chain's k + 1, a tree's N, target only's 1), summed over the configurations")
    if budget is None:
        return f"{configs} configuration(s); the target verifies up to {work:,} tokens ({rule})."
    verdict = "within" if work <= budget else "**over**"
    return (f"This public app allows {budget:,} verified tokens per run ({rule}); this plan: {configs} "
            f"configuration(s), {work:,} tokens, {verdict} the limit.")


def row_label(r: dict) -> str:
    return row_config(r).label


def summary_table(rows: list[dict]) -> list[list]:
    return [[row_label(r), r["prompts"], r["generated_tokens"], round(r["mean_acceptance_length"], 2),
             " · ".join(f"{a:.2f}" for a in r["acceptance_per_position"]) or "-",
             round(r["tokens_per_s"], 1), "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
             round(r["mean_draft_ms"], 2), round(r["mean_verify_ms"], 2), parity_cell(r.get("parity"))] for r in rows]


def category_rows_table(rows: list[dict]) -> list[list]:
    return [[row_label(r), r["category"], r["prompts"], round(r["mean_acceptance_length"], 2),
             round(r["tokens_per_s"], 1)] for r in rows]


def write_csv(text: str) -> str:
    """The CSV in a file of its own (demo/service/downloads.py)."""
    return write_download(f"speclens-benchmark-{time.strftime('%Y%m%d-%H%M%S')}.csv", text)


# ---------------------------------------------------------------------- layout
def build_bench_tab(session: Session, hosting: Hosting) -> BenchControls:
    with gr.Tab("Benchmark", id="bench", elem_id="sl-tab-bench"):
        gr.Markdown("## Benchmark\n" + ABOUT, elem_id="sl-bench-about")
        note = gr.Markdown(model_note(session), elem_id="sl-bench-model")
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                prompt_file = gr.File(label="Prompt set: an MT-bench / Spec-Bench JSONL file (empty: the bundled "
                                            "project questions)", file_types=[".jsonl", ".json", ".txt"],
                                      type="filepath", height=120, elem_id="sl-bench-file")
                questions, source = prompt_set(None)
                prompts = gr.Markdown(prompt_note(questions, source), elem_id="sl-bench-prompts")
                methods = gr.CheckboxGroup(label="Methods", elem_id="sl-bench-methods", **method_options(session))
                modes = gr.CheckboxGroup(label="Modes", elem_id="sl-bench-modes", **mode_options(session))
                shapes = gr.CheckboxGroup(label="Draft shapes", elem_id="sl-bench-shapes",
                                          info="chain: k drafts in a row, at each k below; tree d × K, N: d deep, "
                                               "top-K children per node, N tokens verified per step",
                                          **shape_options(session))
                ks = gr.CheckboxGroup([(str(k), k) for k in range(1, APP_MAX_SPEC_TOKENS + 1)],
                                      value=list(DEFAULT_PLAN.ks),
                                      label="k values (a chain's draft tokens per step)", elem_id="sl-bench-ks")
                faults = None if hosting.public else gr.CheckboxGroup(
                    [(FAULT_LABELS[f], f) for f in FAULTS], value=[], elem_id="sl-bench-faults",
                    label="Capture lab (local only): each drafting chain again with its steps captured",
                    info="CUDA graphs where the plan has them, else replayed by a CPU stand-in; with a capture fault, "
                         "or none. Each is held to eager's acceptance counts (the parity check). The lab replays "
                         "chains only, not the tree.")
                num_prompts = gr.Slider(1, len(questions), value=DEFAULT_PLAN.num_prompts, step=1,
                                        label="Number of prompts", elem_id="sl-bench-num-prompts")
                max_new_tokens = gr.Slider(1, 512, value=DEFAULT_PLAN.max_new_tokens, step=1, label="Max new tokens",
                                           elem_id="sl-bench-max-new")
                plan = replace(DEFAULT_PLAN, device_type=session.device.type)
                work = gr.Markdown(work_note(plan, len(questions), hosting.bench_budget(session.device)),
                                   elem_id="sl-bench-work")
                with gr.Row():
                    run = gr.Button("Run benchmark", variant="primary", elem_id="sl-bench-run")
                    stop = gr.Button("Stop", variant="stop", elem_id="sl-bench-stop")
            with gr.Column(scale=2, min_width=420):
                status = gr.HTML("", elem_id="sl-bench-status")
                summary = gr.Dataframe(headers=SUMMARY_HEADERS, value=None, label="Per configuration",
                                       interactive=False, wrap=True, column_widths=SUMMARY_WIDTHS,
                                       elem_id="sl-bench-summary")
                lab = None if hosting.public else gr.HTML("", elem_id="sl-bench-lab")
                chart = gr.Plot(bench_figure([]), show_label=False, elem_id="sl-bench-chart")
                categories = gr.Dataframe(headers=CATEGORY_HEADERS, value=None, label="Per prompt category",
                                          interactive=False, wrap=True, elem_id="sl-bench-categories")
                csv = gr.DownloadButton("Download CSV", value=None, interactive=False, elem_id="sl-bench-csv")
                with gr.Accordion("What python -m demo.bench prints", open=True):
                    report = gr.Code("", language=None, label="acceptance table per configuration", interactive=False,
                                     elem_id="sl-bench-report")
    return BenchControls(model_note=note, prompt_file=prompt_file, prompt_note=prompts, methods=methods, modes=modes,
                         shapes=shapes, ks=ks, num_prompts=num_prompts, max_new_tokens=max_new_tokens, work=work,
                         run=run, stop=stop, status=status, summary=summary, categories=categories, chart=chart,
                         report=report, csv=csv, faults=faults, lab=lab)


# ---------------------------------------------------------------------- listeners
def register(b: BenchControls, model: gr.State, cache: ModelCache, hosting: Hosting) -> None:
    """`model`: the visitor's models (Controls.model), which every run measures."""

    def questions_of(path):
        try:
            return prompt_set(path)
        except (PromptFileError, OSError) as e:
            raise RequestError(str(e)) from None

    def run_benchmark(name, path, methods, modes, shapes, ks, num_prompts, max_new_tokens, faults=(),
                      progress=gr.Progress()):
        """Check the plan, then measure it, saying which prompt of which configuration runs; at the end
        the tables, the chart, the CLI's report, the CSV and (local mode) the capture lab's panel."""
        try:
            session = visitor_session(cache, name)
            questions, source = questions_of(path)
            plan = tab_plan(session.device.type, methods, modes, shapes, ks, num_prompts, max_new_tokens, faults)
            if plan.faults and hosting.public:  # never offered there: the shared engines stay as they are
                raise RequestError("The capture lab runs in local mode only.")
            plan.check(session)
            chosen = pick_prompts(questions, plan.num_prompts)
            hosting.check_bench_work(plan.work(len(chosen)), session.device)
            check_prompts(session, chosen, plan)
        except RequestError as e:
            raise gr.Error(str(e), print_exception=False) from None
        progress(0.0, desc="warming up")
        # the last run's results go as this one starts: a Stop leaves nothing on the page from another run
        yield {b.status: status_html(f"warming up: {len(plan.configs())} configuration(s) on {len(chosen)} prompts…"),
               b.summary: None, b.categories: None, b.chart: bench_figure([]), b.report: "",
               b.csv: gr.DownloadButton(value=None, interactive=False), **({b.lab: ""} if b.lab is not None else {})}
        for step in on_engine_thread(run_plan(session, plan, chosen, source, hosting.time_limit())):
            progress(step.fraction, desc=step.what)
            if not step.finished:
                yield {b.status: status_html(f"measuring {step.what} ({step.done} of {step.total} decodes)")}
        rows, per_category = summary_rows(step.reports), category_table(step.reports)
        said = f"done: {len(rows)} configuration(s) on {len(chosen)} prompts of {source}"
        if step.cut_short:
            said = (f"stopped at this app's time limit ({hosting.time_limit():g} s a run): {len(rows)} of "
                    f"{len(plan.configs())} configuration(s), each on the prompts it reached; choose fewer prompts, "
                    "max new tokens or configurations")
        yield {b.status: status_html(said, "done"),
               b.summary: summary_table(rows), b.categories: category_rows_table(per_category),
               b.chart: bench_figure(rows), b.report: report_text(step.reports),
               b.csv: gr.DownloadButton(value=write_csv(bench_csv(rows, per_category)), interactive=True),
               **({b.lab: render_lab(step.reports, rows)} if b.lab is not None else {})}

    def describe_prompts(name, path, *plan_values):
        """A new prompt file (or none: the bundled set): what it holds, or why it cannot be read."""
        try:
            questions, source = questions_of(path)
        except RequestError as e:
            gr.Warning(str(e))
            return {b.prompt_note: f"⚠ {escape(str(e))}", b.num_prompts: gr.skip(), b.work: gr.skip()}
        n = min(DEFAULT_PLAN.num_prompts, len(questions))
        session = shown_session(cache, name)
        plan = replace(tab_plan(session.device.type, *plan_values), num_prompts=n)
        return {b.prompt_note: prompt_note(questions, source),
                b.num_prompts: gr.Slider(maximum=max(len(questions), 2), value=n),
                b.work: work_note(plan, len(questions), hosting.bench_budget(session.device))}

    def plan_work(name, path, *plan_values):
        """The work line for the plan as it stands (no engine, no file read beyond the prompt count)."""
        try:
            questions, _ = questions_of(path)
        except RequestError:
            return gr.skip()
        session = shown_session(cache, name)
        plan = tab_plan(session.device.type, *plan_values)
        return work_note(plan, len(questions), hosting.bench_budget(session.device))

    def bench_stopped():
        return status_html("stopped before the run ended: a run shows its tables and chart when it ends", "done")

    def models_changed(name):
        """The visitor chose other models in the Chat tab: what this tab offers follows them."""
        session = shown_session(cache, name)
        return {b.model_note: model_note(session), b.methods: gr.CheckboxGroup(**method_options(session)),
                b.modes: gr.CheckboxGroup(**mode_options(session)),
                b.shapes: gr.CheckboxGroup(**shape_options(session))}

    ui = PRIVATE
    inputs = [model, b.prompt_file, *b.plan_inputs]
    running = b.run.click(zerogpu.on_gpu(run_benchmark, zerogpu.BENCH_SECONDS), inputs=inputs, outputs=b.results,
                          show_progress_on=[b.summary, b.chart], concurrency_id=ENGINE, **ui)
    b.stop.click(None, cancels=[running], **ui).then(bench_stopped, outputs=[b.status], **ui)
    b.prompt_file.change(describe_prompts, inputs=inputs,
                         outputs=[b.prompt_note, b.num_prompts, b.work], **ui)
    for component in b.plan_inputs:
        component.change(plan_work, inputs=inputs, outputs=[b.work], queue=False, show_progress="hidden", **ui)
    model.change(models_changed, inputs=[model], outputs=[b.model_note, b.methods, b.modes, b.shapes], queue=False,
                 **ui)
