"""What the app's Benchmark tab runs: a plan (methods x modes x draft shapes over some prompts), its
checks and its work, the prompts it picks, its run on a Session's engines through demo/bench/tools/cli.py's
``measuring`` (demo/bench/measure.py: the CLI's own loop, warm-up and report), and the rows the tab, the chart and the CSV
show. No Gradio here: demo/ui/bench_tab.py maps these onto components.

Every configuration decodes greedily (T = 0), after one uncounted warm-up generation, as ``python -m
demo.bench`` does by default. A drafting method drafts a chain of k at each chosen k and/or the tree the
Chat tab drafts by default on the session's device (``default_tree_draft``; other trees: the CLI's
``--tree-topk`` and ``--num-draft-tokens``).
A run whose steps are captured (graph mode, or the capture lab's faults: demo/bench/capture_lab.py,
local mode only) is held to eager's acceptance counts on the same prompts (demo/bench/parity.py), so a
plan with one measures eager too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from demo.bench.config import WARMUP_MAX_NEW_TOKENS, BenchConfig
from demo.bench.faults import FAULT_LABELS, FAULTS
from demo.bench.measure import measuring
from demo.bench.parity import parity, parity_sentence
from demo.bench.report import format_report
from demo.config import Deadline, TreeShape
from demo.methods import APP_MAX_SPEC_TOKENS, DEFAULT_METHOD, METHODS, METHOD_LABELS, MODES, REGISTRY, default_draft, default_tree
from demo.service.request import LIMITS, MAX_CHARS_PER_TOKEN, RequestError
from demo.service.session import Session

BUNDLED_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "categories.jsonl"
WARMUP = 1  # uncounted warm-up generations per configuration (the CLI's --warmup default)
DRAFT_SHAPES = ("chain", "tree")  # a chain at each chosen k; the device's default tree (default_tree_draft)


def _method(name: str):
    """The registry's entry of a plan's method (one the plan's check refuses: as the target alone)."""
    return REGISTRY.get(name, REGISTRY["none"])


def _drafts_of(method: str, drafts: list[dict]) -> list[dict]:
    """The plan's drafts `method` drafts: none for the target alone, its chains for a method of chains."""
    spec = _method(method)
    if spec.proposer is None:
        return [dict(num_spec_tokens=0)]
    return [d for d in drafts if spec.trees or not d.get("tree_topk")]


def default_tree_draft(device_type: str) -> tuple[int, TreeShape]:
    """(depth, tree) of the tree the Chat tab drafts first on `device_type` at T = 0 (every benchmark
    decodes greedily): its default draft (demo/config.py), or where that is a chain, its default tree
    that deep, as the settings panel starts a visitor's tree."""
    k, tree = default_draft(device_type, 0.0)
    return k, tree or default_tree(device_type)


@dataclass(frozen=True)
class BenchPlan:
    """Every (method, mode, draft shape) to measure over the same prompts; target only runs once per
    mode. A drafting method drafts a chain at each of `ks` and/or the tree `device_type` drafts by
    default (`shapes`)."""

    methods: tuple[str, ...] = ("none", DEFAULT_METHOD)
    modes: tuple[str, ...] = ("eager",)
    ks: tuple[int, ...] = (1, 2, 3)
    num_prompts: int = 8
    max_new_tokens: int = 64
    faults: tuple[str, ...] = ()  # the capture lab's runs (demo/bench/faults.py), local mode only
    # Chains only by default: the tab opens on how acceptance and speed grow with k (its chart), and the
    # default plan stays within a public CPU's work budget (target only and k = 1, 2, 3 verify 10 tokens
    # a step; the CPU's tree 6 more would take it past). The tree the Chat tab runs is one tick away.
    shapes: tuple[str, ...] = ("chain",)
    device_type: str = "cpu"  # whose default tree "tree" measures: the session's device (Session.device.type)

    @classmethod
    def of(cls, methods, modes, ks, num_prompts, max_new_tokens, faults=(), shapes=("chain",),
           device_type: str = "cpu") -> "BenchPlan":
        """A plan from the tab's values (lists in any order; sliders send floats): methods, modes,
        faults and shapes in METHODS / MODES / FAULTS / DRAFT_SHAPES order, k ascending. Whatever is
        not allowed stays, for ``check`` to refuse."""
        ks = tuple(dict.fromkeys(_whole(k) for k in ks or ()))
        return cls(_ordered(methods, METHODS), _ordered(modes, MODES),
                   tuple(sorted(ks)) if all(isinstance(k, int) for k in ks) else ks,
                   _whole(num_prompts), _whole(max_new_tokens), _ordered(faults, FAULTS),
                   _ordered(shapes, DRAFT_SHAPES), device_type)

    def drafts(self) -> list[dict]:
        """BenchConfig's draft fields of each drafting configuration: a chain at each k, then the tree."""
        chains = [dict(num_spec_tokens=k) for k in self.ks] if "chain" in self.shapes else []
        if "tree" not in self.shapes:
            return chains
        depth, tree = default_tree_draft(self.device_type)
        return chains + [dict(num_spec_tokens=depth, tree_topk=tree.topk, num_draft_tokens=tree.size,
                              lookup=tree.lookup)]

    def configs(self) -> list[BenchConfig]:
        """Mode by mode: target only, then each drafting method in each draft shape (``drafts``:
        greedy, WARMUP warm-ups; run_plan fills in the models and the prompts), eager among the modes
        whenever a run is captured (the parity check needs its counts); then the capture lab's runs,
        each fault at each drafting method and chain (the lab replays chains), in graph mode where the
        plan has it, else replayed on the CPU."""
        modes = self.modes
        if ("cudagraph" in modes or self.faults) and "eager" not in modes:
            modes = ("eager",) + modes
        lab_mode = "cudagraph" if "cudagraph" in modes else "eager"
        one = dict(max_new_tokens=self.max_new_tokens, warmup=WARMUP)
        drafts = self.drafts()
        return [BenchConfig(method=method, mode=mode, **draft, **one) for mode in modes for method in self.methods
                for draft in _drafts_of(method, drafts)] + \
               [BenchConfig(method=method, mode=lab_mode, num_spec_tokens=k, fault=fault, **one) for fault in self.faults
                for method in self.methods if _method(method).needs_drafter for k in self.ks]

    @property
    def warmup_tokens(self) -> int:
        return WARMUP * min(self.max_new_tokens, WARMUP_MAX_NEW_TOKENS)

    def work(self, num_prompts: int | None = None) -> int:
        """Tokens the target may verify in all: per configuration, its tokens per step (k + 1 for a
        chain, the tree's tokens verified for a tree, 1 for target only) times the prompts' max new
        tokens and the warm-up's (Hosting.check_bench_work bounds it)."""
        n = self.num_prompts if num_prompts is None else num_prompts
        return sum(c.width for c in self.configs()) * (n * self.max_new_tokens + self.warmup_tokens)

    def check(self, session: Session) -> None:
        """Refuse, in one sentence, a plan `session` cannot run (before any engine call)."""
        if not self.methods:
            raise RequestError("Choose at least one method.")
        if not self.modes:
            raise RequestError("Choose at least one mode.")
        for method in self.methods:
            if method not in session.methods():
                raise RequestError(f"{session.name} has no {METHOD_LABELS.get(method, repr(method))} drafter loaded; "
                                   f"choose among: {', '.join(METHOD_LABELS[m] for m in session.methods())}.")
        for mode in self.modes:
            if mode not in MODES:
                raise RequestError(f"Unknown mode {mode!r}: choose among {', '.join(MODES)}.")
        if "cudagraph" in self.modes and session.cudagraph_unavailable():
            raise RequestError(f"CUDA graph mode is unavailable: {session.cudagraph_unavailable()}. "
                               "Measure eager mode.")
        self._check_shapes(session)
        for fault in self.faults:
            if fault not in FAULTS:
                raise RequestError(f"Unknown capture fault {fault!r}: choose among "
                                   f"{', '.join(FAULT_LABELS[f] for f in FAULTS)}.")
        if self.faults and not any(_method(m).needs_drafter for m in self.methods):
            raise RequestError("A capture fault acts on the drafter's step: choose a method with a drafter too.")
        if self.faults and "chain" not in self.shapes:
            raise RequestError("The capture lab replays chains: choose the chain shape too.")
        for k in self.ks:
            _check_whole("k", k, 1, APP_MAX_SPEC_TOKENS)
        _check_whole("number of prompts", self.num_prompts, 1, 10**6)
        _check_whole("max new tokens", self.max_new_tokens, *LIMITS["max_new_tokens"])

    def _check_shapes(self, session: Session) -> None:
        if all(m == "none" for m in self.methods):
            return  # target only drafts nothing: no shape to check
        if not self.shapes:
            raise RequestError("Choose at least one draft shape (chain or tree) for the drafting methods.")
        for shape in self.shapes:
            if shape not in DRAFT_SHAPES:
                raise RequestError(f"Unknown draft shape {shape!r}: choose among {', '.join(DRAFT_SHAPES)}.")
        if "chain" in self.shapes and not self.ks:
            raise RequestError("Choose at least one k for the drafting methods' chains.")
        if "tree" in self.shapes and self.device_type != session.device.type:
            raise RequestError(f"This plan drafts the default tree of a {self.device_type} device, but "
                               f"{session.name} runs on {session.device.type}.")


def _whole(value):
    """A slider's 3.0 as 3; anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _ordered(values, order: tuple[str, ...]) -> tuple:
    values = tuple(dict.fromkeys(values or ()))
    return tuple(v for v in order if v in values) + tuple(v for v in values if v not in order)


def _check_whole(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RequestError(f"{name} = {value!r} is not allowed: a whole number from {lo} to {hi}.")


def pick_prompts(questions: list[dict], n: int) -> list[dict]:
    """n questions taken in turn from each category (in the file's order), so that a few prompts
    already cover every category; all of them when there are no more than n."""
    by_category: dict[str, list[dict]] = {}
    for q in questions:
        by_category.setdefault(q.get("category") or "-", []).append(q)
    picked, queues = [], [list(qs) for qs in by_category.values()]
    while len(picked) < n and any(queues):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop(0))
    return picked


def check_prompts(session: Session, questions: list[dict], plan: BenchPlan) -> None:
    """Each first turn must fit the context with max new tokens and the widest step's tokens."""
    from demo.models.prompts import chat_ids

    cap = session.max_context * MAX_CHARS_PER_TOKEN
    width = max(c.width for c in plan.configs())
    for q in questions:
        text, name = q["turns"][0], f"question {q.get('question_id')}"
        if len(text) > cap:
            raise RequestError(f"{name} is {len(text):,} characters, more than the {session.max_context}-token "
                               "context can hold.")
        need = len(chat_ids(session.tokenizer, [{"role": "user", "content": text}])) + plan.max_new_tokens + width
        if need > session.max_context:
            raise RequestError(f"{name} needs {need:,} tokens of the {session.max_context}-token context with max "
                               f"new tokens {plan.max_new_tokens}: lower max new tokens, or leave that question out.")


def measured_config(session: Session, config: BenchConfig, source: str) -> BenchConfig:
    """`config` on the session's models and `source`'s prompts, checked as the CLI checks its flags."""
    drafter = session.drafter_labels[config.method] if config.k else None
    return replace(config, target=session.target_spec, drafter=drafter, prompts=source).check()


@dataclass
class BenchProgress:
    """Where a run is: `done` of `total` prompt decodes, and the reports of the configurations finished."""

    done: int
    total: int
    what: str
    reports: list[dict]
    finished: bool = False  # the last value: every configuration measured
    cut_short: bool = False  # the run's time limit ended it: what it holds was measured by then

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


def run_plan(session: Session, plan: BenchPlan, questions: list[dict], source: str,
             time_limit_s: float | None = None) -> Iterator[BenchProgress]:
    """Measure every configuration of `plan` on `questions` (already picked and checked) with the
    session's engines, yielding after each prompt; the last value holds every report. Stopping the
    iteration stops the run between two prompts. With `time_limit_s` the run ends once that many
    seconds have passed: the last value holds the reports measured by then (cut_short)."""
    configs, reports = plan.configs(), []
    total = len(configs) * len(questions)
    deadline = Deadline(time_limit_s)
    for i, config in enumerate(configs):
        if deadline.expired():
            yield BenchProgress(total, total, "out of time", reports, finished=True, cut_short=True)
            return
        engine = session.engine(config.method, config.mode)
        if config.fault is not None:  # the capture lab's engine of its own, on the same models
            from demo.bench.capture_lab import lab_around

            engine = lab_around(engine, config.fault)
        steps = measuring(engine, session.tokenizer, questions, measured_config(session, config, source), deadline)
        while True:
            try:
                done = next(steps)
            except StopIteration as end:
                reports.append(end.value)
                break
            yield BenchProgress(i * len(questions) + done, total,
                                f"{config.label}: prompt {done} of {len(questions)}", list(reports))
    yield BenchProgress(total, total, "done", reports, finished=True,
                        cut_short=any(r["totals"]["cut_short"] for r in reports))


# ---------------------------------------------------------------------- what a run shows
def eager_report(reports: list[dict], config: dict) -> dict | None:
    """The run a captured configuration's counts are held to: the same method and draft shape, eager,
    no fault (a chain of 7 is not a tree 7 deep)."""
    return next((r for r in reports if (c := r["totals"]["config"])["mode"] == "eager" and c.get("fault") is None
                 and (c["method"], c["k"], c.get("shape")) == (config["method"], config["k"], config.get("shape"))),
                None)


def draft_fields(config: dict) -> dict:
    """A report config's draft shape as BenchConfig's fields: tree_topk, num_draft_tokens and lookup of a
    tree, None for a chain (and target only), so that a row names its shape and a CSV reader can rerun it."""
    shape = config.get("shape") or {}
    # a tree of top-1 is a chain (shape_label), unless a lookup branch hangs on it
    tree = bool(shape.get("tree")) and (shape.get("topk", 1) > 1 or bool(shape.get("lookup")))
    return {"tree_topk": shape["topk"] if tree else None, "num_draft_tokens": shape["nodes"] + 1 if tree else None,
            "lookup": shape.get("lookup", 0) if tree else None}


def row_config(row: dict) -> BenchConfig:
    """The configuration a summary or category row measured, as far as its label needs (BenchConfig.label)."""
    return BenchConfig(method=row["method"], mode=row["mode"], num_spec_tokens=row["k"], fault=row.get("fault"),
                       tree_topk=row.get("tree_topk"), num_draft_tokens=row.get("num_draft_tokens") or 0,
                       lookup=row.get("lookup") or 0)


def run_parity(reports: list[dict], report: dict) -> dict | None:
    """The parity check of a captured run against its eager run (None: it captures nothing, or its
    eager run was not measured on the same prompts, as when a time limit cut one short)."""
    c = report["totals"]["config"]
    eager = eager_report(reports, c) if c["mode"] == "cudagraph" or c.get("fault") is not None else None
    try:
        return None if eager is None else parity(eager, report)
    except ValueError:
        return None


def summary_rows(reports: list[dict]) -> list[dict]:
    """One row per configuration: the bench's totals, the speedup over target only in the same
    mode when the run measured it, and a captured run's parity check."""
    baseline = {r["totals"]["config"]["mode"]: r["totals"]["summary"]["tokens_per_s"] for r in reports
                if r["totals"]["config"]["method"] == "none"}
    rows = []
    for r in reports:
        c, s = r["totals"]["config"], r["totals"]["summary"]
        base = baseline.get(c["mode"])
        checked = run_parity(reports, r)
        rows.append({"method": c["method"], "mode": c["mode"], "k": c["k"], **draft_fields(c), "fault": c.get("fault"),
                     "parity": checked, "parity_sentence": checked and parity_sentence(checked),
                     "prompts": r["totals"]["num_prompts"],
                     "generated_tokens": s["num_generated"], "mean_acceptance_length": s["mean_acceptance_length"],
                     "acceptance_per_position": s["acceptance_per_position"], "tokens_per_s": s["tokens_per_s"],
                     "speedup": s["tokens_per_s"] / base if base and c["method"] != "none" else None,
                     "mean_draft_ms": s["mean_draft_ms"], "mean_verify_ms": s["mean_verify_ms"]})
    return rows


def category_table(reports: list[dict]) -> list[dict]:
    """One row per configuration and prompt category (bench.category_rows of each report)."""
    return [{"method": (c := r["totals"]["config"])["method"], "mode": c["mode"], "k": c["k"], **draft_fields(c),
             "fault": c.get("fault"), **row} for r in reports for row in r["totals"]["categories"]]


def report_text(reports: list[dict]) -> str:
    """What ``python -m demo.bench`` prints for each configuration, one after another."""
    return "\n\n".join(format_report(r) for r in reports)
