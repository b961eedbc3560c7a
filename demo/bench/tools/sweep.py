"""Several draft shapes, rules and prompt sets measured on one engine, in one process: the "same
run" that a comparison such as "the tree against the point-mass chain" needs.

    python -m demo.bench.sweep --method eagle3 --mode cudagraph --kernels fused --compile drafter \
        --max-new-tokens 256 --temperature 1 --seed 0 \
        --prompts assets/prompts/categories.jsonl --prompts sharegpt77.jsonl \
        --row "-k 7 --draft-sampling pointmass" \
        --row "-k 5 --tree-topk 10 --num-draft-tokens 80 --draft-sampling wor"

Every flag but --row, --prompts and --json-dir is the bench's own (``python -m demo.bench -h``) and
holds for every row; a row adds or overrides bench flags. The engine is built once from the first
row's models and engine settings (a row that names another target, drafter, mode, compile scope,
kernels, device, dtype or context is refused before anything loads), so each new shape pays only
its own graph capture. Rows run in order, each over every prompt set; the table gives each row's
mean acceptance length, tokens/s, its tokens/s over the first row's on the same prompts, and
propose/verify time per step.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from demo.bench.tools.cli import parse
from demo.bench.config import BenchConfig
from demo.bench.report import shape_label

# What build_engine reads: one engine serves rows that agree on all of these.
ENGINE_FIELDS = ("target", "drafter", "hot_tokens", "method", "ceiling", "mode", "compile", "kernels", "device",
                 "dtype", "max_context", "drafter_dtype", "fault")


@dataclass(frozen=True)
class SweepRow:
    """One measured (row, prompt set): what the table prints."""
    prompts: str
    drafts: str
    temperature: float
    mean_acceptance_length: float
    tokens_per_s: float
    vs_first: float  # tokens/s over the first row's on the same prompts
    propose_ms: float
    verify_ms: float


def engine_key(config: BenchConfig) -> tuple:
    return tuple(getattr(config, f) for f in ENGINE_FIELDS)


def plan(argv: list[str] | None = None) -> tuple[list[list[BenchConfig]], Path | None]:
    """The sweep's configs, rows by prompt sets, checked; exits as argparse does on a bad one."""
    p = argparse.ArgumentParser(prog="python -m demo.bench.sweep", description=__doc__.split("\n\n")[0],
                                epilog="every other flag is python -m demo.bench's")
    p.add_argument("--row", action="append", required=True, help="bench flags of one row, quoted")
    p.add_argument("--prompts", action="append", required=True, help="a prompt set (repeatable)")
    p.add_argument("--json-dir", type=Path, default=None, help="write each measurement's report here")
    args, common = p.parse_known_args(argv)
    if "--json" in common:
        p.error("--json writes one report; give --json-dir")
    configs = [[parse(common + shlex.split(row) + ["--prompts", prompts])[0] for prompts in args.prompts]
               for row in args.row]
    first = engine_key(configs[0][0])
    for row, cs in zip(args.row, configs):
        if engine_key(cs[0]) != first:
            differ = [f for f, a, b in zip(ENGINE_FIELDS, engine_key(cs[0]), first) if a != b]
            p.error(f"row {row!r} needs another engine than the first row (another {', '.join(differ)}): "
                    "one sweep measures one engine")
    return configs, args.json_dir


def sweep_row(report: dict, first_tokens_per_s: float | None) -> SweepRow:
    """A measurement's table row, from its report."""
    from demo.metrics import AcceptanceStats

    t, c = report["totals"], report["totals"]["config"]
    stats = AcceptanceStats.from_counts(t["counts"])
    tps = stats.tokens_per_s
    return SweepRow(prompts=Path(c["prompts"] or "-").name, drafts=shape_label(c) + (
        f", {c['draft_sampling']}" if c["temperature"] > 0 and c["k"] else ""), temperature=c["temperature"],
        mean_acceptance_length=stats.mean_acceptance_length, tokens_per_s=tps,
        vs_first=tps / first_tokens_per_s if first_tokens_per_s else 1.0,
        propose_ms=stats.mean_draft_ms, verify_ms=stats.mean_verify_ms)


def format_table(rows: list[SweepRow]) -> str:
    head = ["| prompts | drafts | T | mean acceptance length | tokens/s | x the first row | propose ms | verify ms |",
            "|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + [f"| {r.prompts} | {r.drafts} | {r.temperature:g} | {r.mean_acceptance_length:.3f} | "
                             f"{r.tokens_per_s:.1f} | {r.vs_first:.2f} | {r.propose_ms:.2f} | {r.verify_ms:.2f} |"
                             for r in rows])


def main(argv: list[str] | None = None) -> int:
    configs, json_dir = plan(argv)
    from demo.bench.measure import build_engine, load_questions, measure

    engine, tokenizer = build_engine(configs[0][0])
    rows, first = [], {}
    for i, row in enumerate(configs):
        for j, config in enumerate(row):
            report = measure(engine, tokenizer, load_questions(config), config)
            result = sweep_row(report, first.get(j))
            first.setdefault(j, result.tokens_per_s)
            rows.append(result)
            print(format_table([result]).splitlines()[-1], flush=True)
            if json_dir is not None:
                json_dir.mkdir(parents=True, exist_ok=True)
                (json_dir / f"row{i}-set{j}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
