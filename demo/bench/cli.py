"""Benchmark CLI: acceptance, speed and losslessness of speculative decoding over a prompt set.

    python -m demo.bench --method eagle3 --num-spec-tokens 3 --prompts assets/prompts/questions.jsonl \
        --check-lossless --json out.json

Prompts are MT-bench / Spec-Bench question rows ({"question_id", "category", "turns"}), formatted
with the target's chat template. Every prompt is decoded by the same engine the app uses; totals
merge the per-prompt ``AcceptanceStats`` and print vLLM's acceptance table
(examples/offline_inference/spec_decode.py), then tokens/s and propose/verify time per step.
Warm-up generations (graph capture, compilation) are timed apart and not counted, as in gpt-fast.
``--check-lossless`` also decodes every prompt target-only (greedy, through the same engine) and
compares the tokens.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Generator

from demo.service.chat import first_difference
from demo.kernels.runtime import DEFAULT_KERNELS, KERNELS, set_kernels
from demo.methods import (COMPILE_SCOPES, DRAFT_SAMPLING, MAX_SPEC_TOKENS, METHODS, MODES, dtype_label, mode_label,
                          num_drafts)

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "questions.jsonl"
WARMUP_MAX_NEW_TOKENS = 16  # enough to capture and compile every step function; kept short for CPU runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line; no model is touched here."""
    p = argparse.ArgumentParser(prog="python -m demo.bench", description=__doc__.split("\n\n")[0])
    m = p.add_argument_group("models")
    m.add_argument("--target", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a local directory or a hub id")
    m.add_argument("--drafter", default=None,
                   help="drafter directory or hub id (default: the bundled drafter of --method, default target only)")
    m.add_argument("--hot-tokens", choices=("auto", "on", "off"), default="auto",
                   help="a shared-head EAGLE-3's hot_tokens.json: 'auto' drafts over those tokens only on a "
                        "CPU, 'on' always, 'off' never (the full vocabulary)")
    m.add_argument("--method", choices=METHODS, default="eagle3",
                   help="drafter family; 'none' decodes with the target alone")
    m.add_argument("--num-spec-tokens", "-k", "--tree-depth", type=int, default=3,
                   help="draft tokens per step (k), or a tree's depth")
    m.add_argument("--tree-topk", type=int, default=None,
                   help="draft a tree: children expanded per node per step (SGLang's --speculative-eagle-topk; "
                        "1 runs a chain through the tree machinery); default: a chain")
    m.add_argument("--num-draft-tokens", type=int, default=0,
                   help="a tree's tokens verified per step, the root included (SGLang's "
                        "--speculative-num-draft-tokens); 0: every drafted node")
    m.add_argument("--draft-sampling", choices=DRAFT_SAMPLING, default="pointmass",
                   help="T > 0: 'pointmass' drafts the drafter's top choices, accepted with p (siblings in turn); "
                        "'q' draws drafts from the drafter's q, accepted with min(1, p/q)")
    e = p.add_argument_group("engine")
    e.add_argument("--mode", choices=MODES, default="eager")
    e.add_argument("--compile", nargs="?", const="drafter", default=None, choices=COMPILE_SCOPES,
                   help="torch.compile captured steps (cudagraph mode): the drafter's and the greedy "
                        "acceptance test's (default; the output stays eager's token for token), or all of "
                        "them, verification too (fastest; the target's numerics change, so the text may "
                        "move at near-ties)")
    e.add_argument("--kernels", choices=KERNELS, default=DEFAULT_KERNELS,
                   help="on a GPU: 'attention' (Triton attention, PyTorch for the rest), 'fused' (and "
                        "fused layer kernels, each row computed alike whatever the width) or 'torch' "
                        "(PyTorch throughout); demo/kernels/runtime.py")
    e.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    e.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    e.add_argument("--max-context", type=int, default=2048, help="engine context (prompt + new tokens + k + 1)")
    e.add_argument("--drafter-dtype", choices=("auto", "target", "float32", "bfloat16"), default="auto",
                   help="what the drafter computes in: auto is bf16 beside an fp32 target on a CPU that multiplies "
                        "bf16 natively, else the target's (demo.drafter_common.drafter_dtype)")
    g = p.add_argument_group("generation")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-new-tokens", type=int, default=256)
    q = p.add_argument_group("prompts")
    src = q.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="one prompt text")
    src.add_argument("--prompts", default=None,
                     help="JSONL questions, MT-bench format (default: assets/prompts/questions.jsonl)")
    q.add_argument("--num-prompts", type=int, default=None, help="use the first N questions")
    q.add_argument("--all-turns", action="store_true",
                   help="answer every turn, continuing with the model's own answers (default: first turn only)")
    o = p.add_argument_group("run and report")
    o.add_argument("--warmup", type=int, default=1, help="uncounted warm-up generations (capture/compile happen here)")
    o.add_argument("--check-lossless", action="store_true",
                   help="also decode target-only and compare tokens (greedy only)")
    o.add_argument("--json", default=None, metavar="OUT", help="write per-prompt records and totals here")
    args = p.parse_args(argv)

    if args.method != "none" and not 1 <= args.num_spec_tokens <= MAX_SPEC_TOKENS:
        p.error(f"--num-spec-tokens must be in 1..{MAX_SPEC_TOKENS}, not {args.num_spec_tokens}")
    if args.method == "none" and args.drafter:
        p.error("--drafter has no use with --method none")
    if args.method != "none" and args.drafter is None and args.target != "default":
        p.error(f"--drafter is required for target {args.target!r}: the bundled drafters fit the default target only")
    if args.method == "none" and (args.tree_topk or args.num_draft_tokens):
        p.error("--tree-topk and --num-draft-tokens shape the drafts: --method none has none")
    if args.num_draft_tokens and not args.tree_topk:
        p.error("--num-draft-tokens sizes a tree: give --tree-topk too")
    if args.method != "none":
        try:
            tree_shape(args).check()
        except ValueError as e:
            p.error(str(e))
    if args.compile and args.mode != "cudagraph":
        p.error("--compile compiles the captured step functions: use it with --mode cudagraph")
    if args.compile == "drafter" and args.method == "none":
        p.error("--compile compiles the drafter's steps, and --method none has none: use --compile all")
    if args.temperature < 0:
        p.error(f"--temperature must be >= 0, not {args.temperature}")
    if not 0 < args.top_p <= 1:
        p.error(f"--top-p must be in (0, 1], not {args.top_p}")
    if args.check_lossless and args.temperature > 0:
        p.error("--check-lossless compares greedy decodes token for token: it needs --temperature 0 "
                "(sampled outputs are lossless in distribution, not token for token)")
    if args.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
    if args.num_prompts is not None and args.num_prompts < 1:
        p.error(f"--num-prompts must be at least 1, not {args.num_prompts}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, not {args.warmup}")
    if args.max_context < 2:
        p.error(f"--max-context must be at least 2, not {args.max_context}")
    return args


def drafter_spec(args: argparse.Namespace) -> str | None:
    """The drafter to load: --drafter, else the bundled one for --method (None for 'none')."""
    if args.method == "none":
        return None
    if args.drafter:
        return args.drafter
    from demo.models.presets import bundled_drafter_dir

    return str(bundled_drafter_dir(args.method))


def build_engine(args: argparse.Namespace):
    """Load the target and drafter and build the engine; returns (engine, tokenizer).
    Raises LoadError / DrafterLoadError / ValueError with a one-line reason."""
    import torch
    import transformers

    from demo.engine import Engine
    from demo.models.loading import load_target
    from demo.target import Target

    if args.mode == "cudagraph" and (args.device == "cpu" or not torch.cuda.is_available()):
        where = "--device cpu was chosen" if args.device == "cpu" else "this machine has no CUDA device"
        raise ValueError(f"--mode cudagraph needs a CUDA device, but {where} (use --mode eager)")
    set_kernels(args.kernels)  # before anything is captured or compiled
    spec = drafter_spec(args)
    transformers.utils.logging.disable_progress_bar()  # the bench shows its own bar, over prompts
    hf, tokenizer = load_target(args.target, device=args.device, dtype=args.dtype)
    target = Target(hf)
    drafter = None
    if spec is not None:
        from demo.models.checkpoints import load_drafter

        drafter = load_drafter(spec, target, method=args.method, hot_tokens=args.hot_tokens)
        for warning in drafter.cfg.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    engine = Engine(target, drafter, mode=args.mode, compile=args.compile, max_context=args.max_context,
                    drafter_dtype=chosen_drafter_dtype(args.drafter_dtype, target))
    return engine, tokenizer


def chosen_drafter_dtype(choice: str, target):
    """--drafter-dtype as a torch.dtype beside this target."""
    import torch

    from demo.drafter_common import drafter_dtype

    if choice == "auto":
        return drafter_dtype(target.dtype, target.device)
    return target.dtype if choice == "target" else getattr(torch, choice)


def load_questions(args: argparse.Namespace) -> list[dict]:
    from demo.models.prompts import read_questions

    if args.prompt is not None:
        if not args.prompt.strip():
            raise ValueError("--prompt is empty")
        rows = [{"question_id": "prompt", "category": "custom", "turns": [args.prompt]}]
    else:
        path = Path(args.prompts) if args.prompts else DEFAULT_PROMPTS
        if not path.is_file():
            raise ValueError(f"prompt file {str(path)!r} does not exist")
        try:
            rows = read_questions(path)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSONL ({e})") from e
        if not rows:
            raise ValueError(f"prompt file {str(path)!r} has no questions")
    return rows[: args.num_prompts] if args.num_prompts else rows


def tree_shape(args: argparse.Namespace):
    """What each step drafts (demo.tree.DraftShape): a chain of k, or a tree of depth k."""
    from demo.tree import DraftShape, TreeShape

    tree = TreeShape(args.tree_topk, args.num_draft_tokens) if args.tree_topk else None
    return DraftShape.of(num_drafts(args.method, args.num_spec_tokens), tree,
                         sampled=args.draft_sampling == "q" and args.temperature > 0)


def generation_config(args: argparse.Namespace, speculate: bool = True, max_new_tokens: int | None = None):
    """The engine's settings for this run; speculate=False: the same run with the target alone."""
    from demo.engine import GenerationConfig
    from demo.tree import TreeShape

    return GenerationConfig(max_new_tokens=max_new_tokens or args.max_new_tokens,
                            num_spec_tokens=num_drafts(args.method, args.num_spec_tokens) if speculate else 0,
                            tree=TreeShape(args.tree_topk, args.num_draft_tokens) if args.tree_topk else None,
                            draft_sampling=args.draft_sampling, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed)


def reference_config(args: argparse.Namespace, engine, max_new_tokens: int | None = None):
    """--check-lossless's target-only run: in bf16 or fp16 at the speculative run's width, so that
    it computes every token as the verification does, or at 1 row where the target computes every
    row alike at any width (the fused kernels on a GPU; demo.engine.target_only_width)."""
    from demo.engine import target_only_width

    shape = generation_config(args).draft_shape(num_drafts(args.method, args.num_spec_tokens))
    return replace(generation_config(args, speculate=False, max_new_tokens=max_new_tokens),
                   target_only_width=target_only_width(shape, engine.target.dtype, engine.target.rows_alike()))


def decode(engine, prompt_ids: list[int], gen):
    """Run one generation to the end; returns (generated token ids, final AcceptanceStats)."""
    tokens, stats = [], None
    for event in engine.generate(prompt_ids, gen):
        tokens += event.token_ids
        stats = event.stats
    return tokens, stats


def warm_up(engine, tokenizer, questions: list[dict], args: argparse.Namespace) -> float:
    """Uncounted generations of the first prompt (spec and, if checked, target-only); returns seconds."""
    if not args.warmup:
        return 0.0
    from demo.models.prompts import chat_ids

    ids = chat_ids(tokenizer, [{"role": "user", "content": questions[0]["turns"][0]}])
    budget = min(args.max_new_tokens, WARMUP_MAX_NEW_TOKENS)
    start = time.perf_counter()
    for _ in range(args.warmup):
        decode(engine, ids, generation_config(args, max_new_tokens=budget))
        if args.check_lossless and args.method != "none":
            decode(engine, ids, reference_config(args, engine, max_new_tokens=budget))
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    """Load, warm up, decode every prompt; returns the report (records and totals), JSON-ready."""
    from tqdm import tqdm

    questions = load_questions(args)
    engine, tokenizer = build_engine(args)
    with tqdm(total=len(questions), desc="prompts", unit="prompt", file=sys.stderr, disable=None) as bar:
        return measure(engine, tokenizer, questions, args, on_prompt=lambda done: bar.update(1))


def measure(engine, tokenizer, questions: list[dict], args: argparse.Namespace,
            on_prompt: Callable[[int], None] | None = None) -> dict:
    """``measuring`` run to its end; `on_prompt(n)` is called after each question with the number done."""
    steps = measuring(engine, tokenizer, questions, args)
    while True:
        try:
            done = next(steps)
        except StopIteration as end:
            return end.value
        if on_prompt is not None:
            on_prompt(done)


def measuring(engine, tokenizer, questions: list[dict], args: argparse.Namespace) -> Generator[int, None, dict]:
    """Warm up `engine`, then decode every question with the settings of `args` (as parse_args
    makes them), yielding the number of questions done after each; returns the report (records and
    totals), JSON-ready. The CLI's run, and the app's benchmark tab on the engines it already
    holds (it stops between questions when the visitor does), both measure through here."""
    from demo.metrics import AcceptanceStats
    from demo.models.prompts import chat_ids

    warmup_s = warm_up(engine, tokenizer, questions, args)
    k = num_drafts(args.method, args.num_spec_tokens)
    totals = AcceptanceStats(num_spec_tokens=k)
    baseline = AcceptanceStats(num_spec_tokens=0)  # target-only decodes of --check-lossless
    records = []
    for done, q in enumerate(questions, 1):
        messages = []
        for turn, text in enumerate(q["turns"] if args.all_turns else q["turns"][:1], 1):
            messages.append({"role": "user", "content": text})
            ids = chat_ids(tokenizer, messages)
            tokens, stats = decode(engine, ids, generation_config(args))
            totals.merge(stats)
            answer = tokenizer.decode(tokens, skip_special_tokens=True)
            record = {"question_id": q.get("question_id"), "category": q.get("category"), "turn": turn,
                      "prompt_tokens": len(ids), "generated_tokens": len(tokens), "text": answer, "token_ids": tokens,
                      "stats": stats.summary()}
            if args.check_lossless:
                if k:
                    reference, ref_stats = decode(engine, ids, reference_config(args, engine))
                else:  # --method none: the decode above is already target-only
                    reference, ref_stats = tokens, stats
                baseline.merge(ref_stats)
                diff = first_difference(tokens, reference)
                record["lossless"] = {"identical": diff is None, "first_difference": diff,
                                      "target_only_tokens": len(reference)}
            records.append(record)
            messages.append({"role": "assistant", "content": answer})
        yield done
    report = {"records": records,
              "totals": {"config": describe_config(args, engine), "num_prompts": len(records),
                         "categories": category_rows(records),
                         "summary": totals.summary(), "counts": asdict(totals), "warmup_s": warmup_s,
                         "capture_s": engine.capture_s}}
    if args.check_lossless:
        report["totals"]["lossless"] = lossless_totals(records)
        report["totals"]["lossless"]["target_only_width"] = reference_config(args, engine).target_only_width if k else 1
        report["totals"]["target_only"] = baseline.summary()
    return report


def lossless_totals(records: list[dict]) -> dict:
    diverged = [r for r in records if not r["lossless"]["identical"]]
    first = diverged[0] if diverged else None
    return {"identical": len(records) - len(diverged), "total": len(records),
            "first_divergence": None if first is None else {
                "question_id": first["question_id"], "turn": first["turn"],
                "position": first["lossless"]["first_difference"]}}


def describe_config(args: argparse.Namespace, engine) -> dict:
    import torch
    import transformers

    from demo.models.loading import DEFAULT_TARGET_NAME

    dev = engine.device
    return {"target": args.target, "target_name": DEFAULT_TARGET_NAME if args.target == "default" else args.target,
            "drafter": drafter_spec(args), "method": args.method,
            "draft_vocab": engine.drafter.drafting_vocab if engine.drafter is not None else None,
            "k": num_drafts(args.method, args.num_spec_tokens), "shape": asdict(tree_shape(args)),
            "draft_sampling": args.draft_sampling, "mode": args.mode, "compile": args.compile or False,
            "kernels": args.kernels, "device": str(dev), "dtype": dtype_label(engine.target.dtype),
            "drafter_dtype": dtype_label(engine.drafter_dtype) if engine.drafter is not None else None,
            "max_context": engine.max_context, "temperature": args.temperature, "top_p": args.top_p,
            "seed": args.seed, "max_new_tokens": args.max_new_tokens,
            "prompts": args.prompts or (None if args.prompt is not None else str(DEFAULT_PROMPTS)),
            "all_turns": args.all_turns, "warmup": args.warmup, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None}


def shape_label(config: dict) -> str:
    """"k=7", or "tree depth 6 x top-8, 64 tokens verified per step" (with "drafts sampled from q")."""
    shape = config.get("shape") or {}
    if not shape.get("tree"):
        label = f"k={config['k']}"
    else:
        label = f"tree depth {shape['depth']} x top-{shape['topk']}, {shape['nodes'] + 1} tokens verified per step"
    if shape.get("sampled"):
        label += ", drafts sampled from q"
    return label


def category_rows(records: list[dict]) -> list[dict]:
    """Per prompt category: prompts, mean acceptance length (1 + accepted / drafts) and tokens/s."""
    rows = {}
    for r in records:
        s, row = r["stats"], rows.setdefault(r.get("category") or "-", dict(prompts=0, drafts=0, accepted=0,
                                                                           tokens=0, seconds=0.0))
        row["prompts"] += 1
        row["drafts"] += s["num_drafts"]
        row["accepted"] += s["num_accepted_tokens"]
        row["tokens"] += s["num_generated"]
        row["seconds"] += s["elapsed_s"]
    return [{"category": name, "prompts": row["prompts"],
             "mean_acceptance_length": 1 + row["accepted"] / row["drafts"] if row["drafts"] else 1.0,
             "tokens_per_s": row["tokens"] / row["seconds"] if row["seconds"] else 0.0}
            for name, row in sorted(rows.items())]


def format_report(report: dict) -> str:
    """The text main prints; ends with the acceptance table, then tokens/s and ms per step."""
    from demo.metrics import AcceptanceStats

    t, c = report["totals"], report["totals"]["config"]
    stats = AcceptanceStats(**t["counts"])
    drafter = f", drafter {c['drafter']}" if c["drafter"] else ""
    if c.get("draft_vocab"):
        drafter += f" (drafting over {c['draft_vocab']:,} tokens)"
    if c.get("drafter_dtype") and c["drafter_dtype"] != c["dtype"]:
        drafter += f" in {c['drafter_dtype']}"
    mode = mode_label(c["mode"], c["compile"])
    lines = [f"target {c['target_name']}{drafter}, method {c['method']}, {shape_label(c)}, {mode}, "
             f"{c['device']} {c['dtype']}" + (f" ({c['gpu']}, kernels {c.get('kernels', DEFAULT_KERNELS)})"
                                               if c["gpu"] else ""),
             f"{t['num_prompts']} prompts, max_new_tokens {c['max_new_tokens']}, temperature {c['temperature']}",
             f"warm-up: {c['warmup']} generation(s) in {t['warmup_s']:.2f} s "
             f"(graph capture/compile {t['capture_s']:.2f} s), not counted"]
    if "lossless" in t:
        ll = t["lossless"]
        if ll["first_divergence"] is None:
            lines.append(f"lossless: identical ({ll['identical']}/{ll['total']} prompts)")
        else:
            d = ll["first_divergence"]
            lines.append(f"lossless: diverged ({ll['total'] - ll['identical']}/{ll['total']} prompts differ; first: "
                         f"question {d['question_id']} turn {d['turn']} at generated token {d['position']})")
        if c["k"]:
            base, width = t["target_only"]["tokens_per_s"], ll.get("target_only_width", 1)
            if width > 1:  # the exact reference is slower than target-only at its best: no speedup from it
                lines.append(f"target-only, run {width} rows wide as the exact reference in {c['dtype']}: "
                             f"{base:.1f} tokens/s (its speed is not target-only's best; run --method none)")
            else:
                speedup = f", speedup {stats.tokens_per_s / base:.2f}x" if base > 0 else ""
                lines.append(f"target-only: {base:.1f} tokens/s{speedup}")
    categories = t.get("categories") or []
    if len(categories) > 1:
        lines.append("by category: " + ", ".join(f"{r['category']} {r['mean_acceptance_length']:.2f} "
                                                 f"({r['prompts']})" for r in categories))
    lines.append(stats.format_table())
    if stats.steps_after_full or stats.steps_after_rejection:
        split = ["-" if r is None else f"{r:.2f}" for r in (stats.acceptance_at_0_after_full,
                                                              stats.acceptance_at_0_after_rejection)]
        lines.append(f"acceptance at token 0 after a full chain: {split[0]} ({stats.steps_after_full} steps), "
                     f"after a rejection: {split[1]} ({stats.steps_after_rejection} steps)")
    lines.append(f"tokens/s: {stats.tokens_per_s:.1f} ({stats.num_generated} tokens in {stats.elapsed_s:.2f} s "
                 "of engine time)")
    lines.append(f"propose: {stats.mean_draft_ms:.2f} ms/step, verify: {stats.mean_verify_ms:.2f} ms/step "
                 f"({stats.num_steps} steps; prefill {stats.prefill_ms / max(t['num_prompts'], 1):.2f} ms/prompt)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the bench; returns the exit code (0 ok, 1 with a one-line reason, 2 bad arguments)."""
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse has printed its usage and reason
        return int(e.code or 0)
    from demo.models.checkpoints import DrafterLoadError
    from demo.models.loading import LoadError

    errors = (LoadError, ValueError, DrafterLoadError)
    try:
        report = run(args)
    except errors as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(format_report(report))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"error: could not write --json {args.json}: {_one_line(e)}", file=sys.stderr)
            return 1
        print(f"wrote {args.json}")
    return 0


def _one_line(e: Exception) -> str:
    s = " ".join(str(e).split())
    return s or type(e).__name__
