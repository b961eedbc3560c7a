"""Measuring a config: load its engine, warm it up apart (graph capture and compilation are timed
and not counted, as in gpt-fast), decode every prompt with the engine the app uses, and report
records and totals as JSON-ready data. With ``check_lossless`` every prompt is also decoded
target-only through the same engine and the tokens compared; with ``check_parity`` a captured run's
prompts are also decoded by an eager engine on the same models and the acceptance counts compared
(demo/bench/parity.py). A ``fault`` runs the capture lab's engine (demo/bench/capture_lab.py).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Generator

from demo.bench.config import DEFAULT_PROMPTS, WARMUP_MAX_NEW_TOKENS, BenchConfig
from demo.bench.parity import parity
from demo.bench.report import category_rows
from demo.config import Deadline
from demo.methods import dtype_label
from demo.service.chat import first_difference


def build_engine(config: BenchConfig):
    """Load the target and drafter and build the engine; returns (engine, tokenizer).
    Raises LoadError / DrafterLoadError / ValueError with a one-line reason."""
    import torch
    import transformers

    from demo.engine import Engine
    from demo.models.loading import load_target
    from demo.proposers import proposer_for
    from demo.target import Target

    if config.mode == "cudagraph" and (config.device == "cpu" or not torch.cuda.is_available()):
        where = "--device cpu was chosen" if config.device == "cpu" else "this machine has no CUDA device"
        raise ValueError(f"--mode cudagraph needs a CUDA device, but {where} (use --mode eager)")
    spec = config.drafter_spec()
    transformers.utils.logging.disable_progress_bar()  # the bench shows its own bar, over prompts
    hf, tokenizer = load_target(config.target, device=config.device, dtype=config.dtype)
    target = Target(hf, kernels=config.kernels)
    drafter = None
    if spec is not None:
        from demo.models.checkpoints import load_drafter

        drafter = load_drafter(spec, target, method=config.method, hot_tokens=config.hot_tokens)
        for warning in drafter.cfg.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    elif config.ceiling:
        from demo.bench.ceiling import TargetDrafter

        drafter = TargetDrafter(target)
    engine = Engine(target, proposer_for(config.method, drafter) if drafter is None else drafter, mode=config.mode,
                    compile=config.compile, max_context=config.max_context,
                    drafter_dtype=chosen_drafter_dtype(config.drafter_dtype, target),
                    drafter_int8=chosen_drafter_int8(config.drafter_dtype, target))
    if config.fault is not None:
        from demo.bench.capture_lab import lab_around

        engine = lab_around(engine, config.fault)
    return engine, tokenizer


def eager_twin(engine):
    """The product's eager engine on `engine`'s models and settings: what a captured run's counts are
    held to (on a GPU eager pads and buckets as graph mode does, so both compute the same)."""
    from demo.engine import Engine

    return Engine(engine.target, engine.drafter or engine.proposer, max_context=engine.max_context,
                  drafter_dtype=engine.drafter_dtype, drafter_int8=engine.drafter_int8)


def chosen_drafter_dtype(choice: str, target):
    """--drafter-dtype as a torch.dtype beside this target."""
    import torch

    from demo.drafter_common import drafter_dtype

    if choice == "auto":
        return drafter_dtype(target.dtype, target.device)
    if choice in ("int8", "int8-head"):
        return torch.float32
    return target.dtype if choice == "target" else getattr(torch, choice)


def chosen_drafter_int8(choice: str, target) -> bool | str:
    """--drafter-dtype: whether the drafter's head and layer multiply in int8 (a CPU only), or
    ("int8-head") its head alone."""
    from demo.drafter_common import drafter_int8

    if choice == "int8-head":
        return "head"
    return choice == "int8" or (choice == "auto" and drafter_int8(target.dtype, target.device))


def int8_label(drafter) -> str:
    """What of the drafter multiplies through int8 copies, as a report's drafter_dtype adds it."""
    layer, head = drafter.layer_in_int8, drafter.head_in_int8
    return ", layer and head int8" if layer and head else ", layer int8" if layer else ", head int8" if head else ""


def load_questions(config: BenchConfig) -> list[dict]:
    from demo.models.prompts import read_questions

    if config.prompt is not None:
        if not config.prompt.strip():
            raise ValueError("--prompt is empty")
        rows = [{"question_id": "prompt", "category": "custom", "turns": [config.prompt]}]
    else:
        path = Path(config.prompts) if config.prompts else DEFAULT_PROMPTS
        if not path.is_file():
            raise ValueError(f"prompt file {str(path)!r} does not exist")
        try:
            rows = read_questions(path)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSONL ({e})") from e
        if not rows:
            raise ValueError(f"prompt file {str(path)!r} has no questions")
    return rows[: config.num_prompts] if config.num_prompts else rows


def reference_config(config: BenchConfig, engine, max_new_tokens: int | None = None):
    """--check-lossless's target-only run: in bf16 or fp16 at the speculative run's width, so that
    it computes every token as the verification does, or at 1 row where the target computes every
    row alike at any width (the fused kernels on a GPU; demo.engine.target_only_width)."""
    from demo.engine import target_only_width

    return replace(config.generation(speculate=False, max_new_tokens=max_new_tokens),
                   target_only_width=target_only_width(config.generation().draft_shape(config.k), engine.target.dtype, engine.target.rows_alike()))


def decode(engine, prompt_ids: list[int], gen):
    """Run one generation to the end; returns (generated token ids, final AcceptanceStats)."""
    tokens, stats = [], None
    for event in engine.generate(prompt_ids, gen):
        tokens += event.token_ids
        stats = event.stats
    return tokens, stats


def warm_up(engine, tokenizer, questions: list[dict], config: BenchConfig, deadline: Deadline = Deadline(None)) -> float:
    """Uncounted generations of the first prompt (spec and, if checked, target-only), ending at
    `deadline`; returns seconds."""
    if not config.warmup:
        return 0.0
    from demo.models.prompts import chat_ids

    ids = chat_ids(tokenizer, [{"role": "user", "content": questions[0]["turns"][0]}])
    budget = min(config.max_new_tokens, WARMUP_MAX_NEW_TOKENS)
    start = time.perf_counter()
    for _ in range(config.warmup):
        decode(engine, ids, deadline.bound(config.generation(max_new_tokens=budget)))
        if config.check_lossless and config.k:
            decode(engine, ids, deadline.bound(reference_config(config, engine, max_new_tokens=budget)))
    return time.perf_counter() - start


def run(config: BenchConfig) -> dict:
    """Load, warm up, decode every prompt; returns the report (records and totals), JSON-ready."""
    from tqdm import tqdm

    questions = load_questions(config)
    engine, tokenizer = build_engine(config)
    with tqdm(total=len(questions), desc="prompts", unit="prompt", file=sys.stderr, disable=None) as bar:
        return measure(engine, tokenizer, questions, config, on_prompt=lambda done: bar.update(1))


def measure(engine, tokenizer, questions: list[dict], config: BenchConfig,
            on_prompt: Callable[[int], None] | None = None) -> dict:
    """``measuring`` run to its end; `on_prompt(n)` is called after each question with the number done."""
    steps = measuring(engine, tokenizer, questions, config)
    while True:
        try:
            done = next(steps)
        except StopIteration as end:
            return end.value
        if on_prompt is not None:
            on_prompt(done)


def measuring(engine, tokenizer, questions: list[dict], config: BenchConfig,
              deadline: Deadline = Deadline(None)) -> Generator[int, None, dict]:
    """Warm up `engine`, then decode every question with the settings of `config` (checked),
    yielding the number of questions done after each; returns the report (records and
    totals), JSON-ready. The CLI's run, and the app's benchmark tab on the engines it already
    holds (it stops between questions when the visitor does), both measure through here.
    `deadline`: the decodes end there (GenerationConfig.max_time_s), the last one cut short, and the
    report counts the questions decoded by then (totals["cut_short"])."""
    from demo.metrics import AcceptanceStats
    from demo.models.prompts import chat_ids

    warmup_s = warm_up(engine, tokenizer, questions, config, deadline)
    k = config.k
    reach = config.shape.reach  # the most drafts a step accepts (a lookup branch's included; 0: target only)
    totals = AcceptanceStats(reach=reach)
    baseline = AcceptanceStats(reach=0)  # target-only decodes of --check-lossless
    records = []
    twin = eager_twin(engine) if config.check_parity else None  # --check-parity's eager decodes
    eager = {"records": [], "totals": {"counts": AcceptanceStats(reach=reach)}}
    for done, q in enumerate(questions, 1):
        messages = []
        for turn, text in enumerate(q["turns"] if config.all_turns else q["turns"][:1], 1):
            messages.append({"role": "user", "content": text})
            ids = chat_ids(tokenizer, messages)
            if deadline.expired():
                break
            tokens, stats = decode(engine, ids, deadline.bound(config.generation()))
            totals.merge(stats)
            answer = tokenizer.decode(tokens, skip_special_tokens=True)
            record = {"question_id": q.get("question_id"), "category": q.get("category"), "turn": turn,
                      "prompt_tokens": len(ids), "generated_tokens": len(tokens), "text": answer, "token_ids": tokens,
                      "stats": stats.summary()}
            if config.check_lossless:
                if k:
                    reference, ref_stats = decode(engine, ids, deadline.bound(reference_config(config, engine)))
                else:  # --method none: the decode above is already target-only
                    reference, ref_stats = tokens, stats
                baseline.merge(ref_stats)
                diff = first_difference(tokens, reference)
                record["lossless"] = {"identical": diff is None, "first_difference": diff,
                                      "target_only_tokens": len(reference)}
            if twin is not None:
                twin_tokens, twin_stats = decode(twin, ids, deadline.bound(config.generation()))
                eager["totals"]["counts"].merge(twin_stats)
                eager["records"].append({**record, "token_ids": twin_tokens, "stats": twin_stats.summary()})
            records.append(record)
            messages.append({"role": "assistant", "content": answer})
        yield done
        if deadline.expired():
            break
    report = {"records": records,
              "totals": {"config": describe_config(config, engine), "num_prompts": len(records),
                         "categories": category_rows(records),
                         "summary": totals.summary(), "counts": asdict(totals), "warmup_s": warmup_s,
                         "capture_s": engine.capture_s, "cut_short": deadline.expired()}}
    if config.check_lossless:
        report["totals"]["lossless"] = lossless_totals(records)
        report["totals"]["lossless"]["target_only_width"] = reference_config(config, engine).target_only_width if k else 1
        report["totals"]["target_only"] = baseline.summary()
    if twin is not None:
        eager["totals"]["counts"] = asdict(eager["totals"]["counts"])
        report["totals"]["parity"] = parity(eager, report)
    return report


def lossless_totals(records: list[dict]) -> dict:
    diverged = [r for r in records if not r["lossless"]["identical"]]
    first = diverged[0] if diverged else None
    return {"identical": len(records) - len(diverged), "total": len(records),
            "first_divergence": None if first is None else {
                "question_id": first["question_id"], "turn": first["turn"],
                "position": first["lossless"]["first_difference"]}}


def describe_config(config: BenchConfig, engine) -> dict:
    import torch
    import transformers

    from demo.models.loading import DEFAULT_TARGET_NAME

    dev = engine.device
    return {"target": config.target, "target_name": DEFAULT_TARGET_NAME if config.target == "default" else config.target,
            "drafter": "the target itself (ceiling)" if config.ceiling else config.drafter_spec(),
            "method": config.method, "ceiling": config.ceiling,
            "draft_vocab": engine.drafter.drafting_vocab if engine.drafter is not None else None,
            "k": config.k, "shape": asdict(config.shape), "shape_default_on": config.shape_default_on,
            "draft_sampling": config.draft_sampling, "mode": config.mode, "compile": config.compile or False,
            "fault": config.fault,
            "kernels": config.kernels, "device": str(dev), "dtype": dtype_label(engine.target.dtype),
            "drafter_dtype": (dtype_label(engine.drafter_dtype) + int8_label(engine.drafter)
                              if engine.drafter is not None else None),
            "max_context": engine.max_context, "temperature": config.temperature, "top_p": config.top_p,
            "seed": config.seed, "max_new_tokens": config.max_new_tokens,
            "prompts": config.prompts or (None if config.prompt is not None else str(DEFAULT_PROMPTS)),
            "all_turns": config.all_turns, "warmup": config.warmup, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None}
