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
import sys
from pathlib import Path

from demo.bench.config import (
    DEVICES,
    DRAFTER_DTYPES,
    DTYPES,
    HOT_TOKENS,
    SHAPE_FIELDS,
    BenchConfig,
    BenchConfigError,
    default_shape,
)
from demo.bench.faults import FAULTS
from demo.bench.measure import run
from demo.bench.report import format_report
from demo.kernels.runtime import DEFAULT_KERNELS, KERNELS
from demo.methods import COMPILE_SCOPES, DEFAULT_METHOD, METHODS, MODES
from demo.config import DEFAULT_DRAFT_SAMPLING, DRAFT_SAMPLING


def parser() -> argparse.ArgumentParser:
    """The command line, flag for flag a BenchConfig field (and --json, where the report goes)."""
    p = argparse.ArgumentParser(prog="python -m demo.bench", description=__doc__.split("\n\n")[0])
    m = p.add_argument_group("models")
    m.add_argument("--target", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a local directory or a hub id")
    m.add_argument("--drafter", default=None,
                   help="drafter directory or hub id (default: the bundled drafter of --method, default target only)")
    m.add_argument("--hot-tokens", choices=HOT_TOKENS, default="auto",
                   help="a shared-head EAGLE-3's hot_tokens.json: 'auto' drafts over those tokens only on a "
                        "CPU, 'on' always, 'off' never (the full vocabulary)")
    m.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                   help="drafter family; 'none' decodes with the target alone")
    # The four shape flags default to None, "not given": with none of them the bench drafts the shape the
    # page offers first for --method on the device at --temperature (config.default_shape); with any of
    # them, those left out take the defaults in their help.
    m.add_argument("--num-spec-tokens", "-k", "--tree-depth", type=int, default=None,
                   help="draft tokens per step (k), or a tree's depth (3 beside another shape flag); without any "
                        "shape flag the method's default draft on the device at the temperature (demo/methods.py)")
    m.add_argument("--tree-topk", type=int, default=None,
                   help="draft a tree: children expanded per node per step (SGLang's --speculative-eagle-topk; "
                        "1 runs a chain through the tree machinery); beside another shape flag, default a chain")
    m.add_argument("--num-draft-tokens", type=int, default=None,
                   help="a tree's tokens verified per step, the root included (SGLang's "
                        "--speculative-num-draft-tokens); 0 (beside another shape flag, the default): every "
                        "drafted node")
    m.add_argument("--lookup", type=int, default=None,
                   help="verify a prompt-lookup branch of this many tokens beside a tree's nodes: what followed "
                        "the text's last 1 to 4 tokens where they last appeared (demo/proposers/ngram.py); trees of "
                        "the drafter's top choices only (T = 0, or --draft-sampling pointmass); beside another "
                        "shape flag, default 0")
    m.add_argument("--draft-sampling", choices=DRAFT_SAMPLING, default=DEFAULT_DRAFT_SAMPLING,
                   help="T > 0: 'pointmass' drafts the drafter's top choices, accepted with p (siblings in turn); "
                        "'q' draws drafts from the drafter's q, accepted with min(1, p/q); 'wor' draws a node's "
                        "children from q without replacement, each accepted with min(1, p/q) against what the "
                        "earlier rejections left of p and q")
    m.add_argument("--ceiling", action="store_true",
                   help="draft with the target itself (q = p): what each rule accepts with a perfect drafter, the "
                        "ceiling a drafter's acceptance is a share of (demo/bench/ceiling.py)")
    e = p.add_argument_group("engine")
    e.add_argument("--mode", choices=MODES, default="eager")
    e.add_argument("--compile", nargs="?", const="drafter", default=None, choices=COMPILE_SCOPES,
                   help="torch.compile captured steps (cudagraph mode): the drafter's and the greedy "
                        "acceptance test's (default; the output stays eager's token for token), or all of "
                        "them, verification too (fastest; the target's numerics change, so the text may "
                        "move at near-ties)")
    e.add_argument("--kernels", choices=KERNELS, default=DEFAULT_KERNELS,
                   help="on a GPU: 'fused' (Triton attention and fused layer kernels, each row computed alike "
                        "whatever the width; what the app runs) or 'torch' (PyTorch throughout, the reference); "
                        "demo/kernels/runtime.py")
    e.add_argument("--device", choices=DEVICES, default="auto")
    e.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    e.add_argument("--max-context", type=int, default=2048, help="engine context (prompt + new tokens + k + 1)")
    e.add_argument("--drafter-dtype", choices=DRAFTER_DTYPES, default="auto",
                   help="what the drafter computes in: auto is, beside an fp32 target on a CPU, fp32 with its "
                        "head and decoder layer through int8 copies (int8) where PyTorch multiplies int8, else bf16 "
                        "where the CPU does natively, else the target's (demo.drafter_common.drafter_dtype, "
                        "drafter_int8); int8-head: fp32 with the head alone in int8")
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
    o.add_argument("--check-parity", action="store_true",
                   help="a captured run (--mode cudagraph or --fault): also decode eagerly and compare acceptance "
                        "counts, which graph mode must leave equal (greedy only)")
    o.add_argument("--fault", choices=FAULTS, default=None,
                   help="the capture lab (demo/bench/capture_lab.py): capture the steps (real CUDA graphs with "
                        "--mode cudagraph, else a CPU stand-in that replays them) with this capture fault, or "
                        "'none'; the text stays target-only's, acceptance shows the fault")
    o.add_argument("--json", default=None, metavar="OUT", help="write per-prompt records and totals here")
    return p


def parse(argv: list[str] | None = None) -> tuple[BenchConfig, str | None]:
    """The command line as a checked BenchConfig and the --json path; a bad one exits as argparse does
    (status 2, the reason on stderr). Without a shape flag the shape is the method's default on the
    device at the temperature, as on the page. No model is touched here."""
    p = parser()
    args = vars(p.parse_args(argv))
    out = args.pop("json")
    shape = {f: v for f in SHAPE_FIELDS if (v := args.pop(f)) is not None}  # those left out: BenchConfig's
    if not shape:
        shape = default_shape(args["method"], args["device"], args["temperature"])
    try:
        return BenchConfig(**args, **shape).check(), out
    except BenchConfigError as e:
        p.error(str(e))


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    """The command line's BenchConfig (parse without the --json path)."""
    return parse(argv)[0]


def main(argv: list[str] | None = None) -> int:
    """Run the bench; returns the exit code (0 ok, 1 with a one-line reason, 2 bad arguments)."""
    try:
        config, out = parse(argv)
    except SystemExit as e:  # argparse has printed its usage and reason
        return int(e.code or 0)
    from demo.models.checkpoints import DrafterLoadError
    from demo.models.loading import LoadError

    errors = (LoadError, ValueError, DrafterLoadError)
    try:
        report = run(config)
    except errors as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(format_report(report))
    if out:
        try:
            Path(out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"error: could not write --json {out}: {_one_line(e)}", file=sys.stderr)
            return 1
        print(f"wrote {out}")
    return 0


def _one_line(e: Exception) -> str:
    s = " ".join(str(e).split())
    return s or type(e).__name__
