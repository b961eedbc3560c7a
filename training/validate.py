"""Validate drafters on the held-out ShareGPT prompts: mean acceptance length and acceptance at
every draft token, for each speculation depth k and temperature, through the app's own engine.

    python -m training.validate --drafter assets/drafters/smollm2-135m-eagle3 \
        --drafter assets/drafters/smollm2-135m-eagle --num-prompts 50 --json runs/validate.json

Prompts are the first user turns of the last 1000 ShareGPT records (never trained on; see
training/data.py), read from the installed ShareGPT or from ``--prompts DIR`` (exported by
``python -m training.data prompts``, for machines without it), a fixed-seed subsample with
--num-prompts. Every (drafter, T, k) is a separate
run over the same prompts (acceptance at k depends on where steps begin, so k cannot be read off a
deeper run). Metrics use demo/metrics.py's definitions: mean acceptance length includes the
target's own token; acceptance at token i is the share of steps with at least i+1 drafts accepted.
Graph mode changes nothing but time, so ``--mode cudagraph`` gives the same table faster on a GPU.

Runs split over processes or GPUs (one --ks / --temperatures / --drafter subset each, same prompts,
or one ``--shard I/N`` of the prompts each) are joined into one table with ``python -m
training.validate --merge a.json b.json ... --json all.json``: shards of a row add up to the row the
whole prompt set gives, count for count (sampling seeds follow each prompt's place in the set).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path

from demo.methods import dtype_label


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", action="append", help="drafter directory or hub id (repeatable)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="join the reports of split runs (same prompts) into one; runs nothing")
    p.add_argument("--hot-tokens", choices=("auto", "on", "off"), default="auto",
                   help="a shared-head EAGLE-3's hot_tokens.json: 'auto' drafts over those tokens only on a "
                        "CPU, 'on' always, 'off' never (the full vocabulary)")
    p.add_argument("--method", choices=("eagle", "eagle3"), default=None,
                   help="refuse a drafter of the other method (default: whatever the checkpoint is)")
    p.add_argument("--target", default="default")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--mode", choices=("eager", "cudagraph"), default="eager")
    p.add_argument("--compile", nargs="?", const="drafter", default=None, choices=("drafter", "all"),
                   help="torch.compile captured steps (cudagraph mode): the drafter's (default) or all, "
                        "verification too; rows of their own, next to eager's acceptance")
    p.add_argument("--prompts", default=None, metavar="DIR",
                   help="exported hold-out prompts (OUT/holdout of `python -m training.data prompts`); "
                        "default: read the installed ShareGPT")
    p.add_argument("--num-prompts", type=int, default=50,
                   help="fixed-seed subsample of the hold-out prompts (0: all of them)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer hold-out prompts are left out")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--ks", default="1,2,3,4,5,6,7,8", help="speculation depths, comma-separated")
    p.add_argument("--temperatures", default="0,1", help="comma-separated")
    p.add_argument("--seed", type=int, default=0, help="prompt subsample and T>0 sampling seed")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run every N-th prompt of the subsample from the I-th (0-based); --merge joins the N shards")
    p.add_argument("--json", default=None, metavar="OUT")
    p.add_argument("--markdown", default=None, metavar="OUT", help="also write the table here")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    if bool(args.merge) == bool(args.drafter):
        p.error("give --drafter (run) or --merge (join reports), not both")
    if args.compile and args.mode != "cudagraph":
        p.error("--compile compiles the captured steps: use it with --mode cudagraph")
    args.ks = [int(k) for k in args.ks.split(",")]
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    if any(not 1 <= k <= 32 for k in args.ks):
        p.error("--ks must be in 1..32")
    if args.shard is not None:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
        except ValueError:
            p.error("--shard takes I/N, e.g. 0/4")
        if not 0 <= i < n:
            p.error(f"--shard {args.shard}: I must be in 0..N-1")
        args.shard = (i, n)
    return args


def holdout_prompt_ids(tokenizer, num: int | None, max_tokens: int, seed: int,
                      prompts_dir: str | None = None) -> tuple[list[list[int]], str]:
    """Chat-formatted hold-out prompts of at most max_tokens tokens, a fixed-seed subsample of num
    (the same subsample whether read from ShareGPT or from an exported prompt directory)."""
    import numpy as np

    from demo.models.prompts import chat_ids
    from training.data import validation_prompts

    prompts, fingerprint = validation_prompts(prompts_dir)
    ids = [p if isinstance(p, list) else chat_ids(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    ids = [p for p in ids if len(p) <= max_tokens]
    if num is not None and num < len(ids):
        keep = np.sort(np.random.default_rng(seed).choice(len(ids), num, replace=False))
        ids = [ids[i] for i in keep]
    return ids, fingerprint


def run(engine, prompts: list[list[int]], k: int, temperature: float, max_new_tokens: int, seed: int, bar=None,
        places: list[int] | None = None):
    """Merged AcceptanceStats of one (k, T) over all prompts. places: each prompt's index in the
    whole prompt set (default 0, 1, ...), which seeds its sampling, so a shard samples as the whole
    set does."""
    from demo.config import GenerationConfig
    from demo.metrics import AcceptanceStats

    total = AcceptanceStats(reach=k)
    for i, ids in zip(places or range(len(prompts)), prompts):
        gen = GenerationConfig(max_new_tokens=max_new_tokens, num_spec_tokens=k, temperature=temperature,
                               seed=seed + i)
        last = deque(engine.generate(ids, gen), maxlen=1)[0]  # run to the end; the last event has the totals
        total.merge(last.stats)
        if bar is not None:
            bar.update(1)
    return total


def markdown_table(rows: list[dict], max_k: int) -> str:
    """One line per (drafter, T, k): mean acceptance length and acceptance at each draft token."""
    head = ["drafter", "T", "k", "mean acceptance length"] + [f"acc. token {i}" for i in range(max_k)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        acc = [f"{a:.3f}" for a in r["acceptance_per_position"]] + [""] * (max_k - r["k"])
        name = r["drafter"] + {"": "", "all": ", all compiled", "drafter": ", drafter compiled"}[_compiled(r)]
        lines.append("| " + " | ".join([name, f"{r['temperature']:g}", str(r["k"]),
                                         f"{r['mean_acceptance_length']:.3f}"] + acc) + " |")
    return "\n".join(lines)


def start_table(rows: list[dict]) -> str:
    """Acceptance at token 0 split by how the step before ended (all drafts accepted, or one
    rejected), one line per (drafter, T, k); empty for reports that predate the split."""
    rows = [r for r in rows if r.get("steps_after_full") is not None]
    if not rows:
        return ""
    lines = ["| drafter | T | k | acc. token 0 | after a full chain | steps | after a rejection | steps |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        split = [f"{r[f'acceptance_at_0_after_{c}']:.3f}" if r[f"steps_after_{c}"] else "-" for c in ("full", "rejection")]
        lines.append(f"| {r['drafter']} | {r['temperature']:g} | {r['k']} | {r['acceptance_per_position'][0]:.3f} | "
                     f"{split[0]} | {r['steps_after_full']} | {split[1]} | {r['steps_after_rejection']} |")
    return "\n".join(lines)


def tables(rows: list[dict], max_k: int) -> str:
    """The acceptance table, then the token-0 split under it."""
    return "\n\n".join(t for t in (markdown_table(rows, max_k), start_table(rows)) if t)


def _compiled(row: dict) -> str:
    """A row's compile scope: "" (not compiled), "all" or "drafter" (reports before the scopes
    say True for all)."""
    scope = row.get("compile") or ""
    return "all" if scope is True else scope


SAME_IN_MERGED = ("prompts", "holdout_fingerprint", "max_new_tokens", "max_prompt_tokens", "seed", "mode", "dtype")


COUNTS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_steps", "num_generated",
          "steps_after_full", "first_accepted_after_full", "steps_after_rejection", "first_accepted_after_rejection")


def _row_stats(row: dict):
    """The AcceptanceStats totals a report row was made from."""
    from demo.metrics import AcceptanceStats

    return AcceptanceStats(reach=row["k"], **{c: row.get(c, 0) for c in COUNTS},
                           accepted_per_position=list(row["accepted_per_position"]),
                           draft_ms_total=row["mean_draft_ms"] * row["num_steps"],
                           verify_ms_total=row["mean_verify_ms"] * row["num_steps"],
                           prefill_ms=row["prefill_ms"], elapsed_s=row["elapsed_s"])


def _join_shards(reports: list[dict]) -> list[dict]:
    """Reports of prompt shards (--shard I/N) become one report per (row, mode), their counts
    added; every shard 0..N-1 of a row must be there exactly once."""
    whole = [r for r in reports if not r.get("shard")]
    parts: dict[tuple, dict[int, tuple[dict, dict]]] = {}
    for r in reports:
        if not r.get("shard"):
            continue
        i, n = r["shard"]
        for row in r["runs"]:
            key = (row["path"], row["temperature"], row["k"], _compiled(row), row.get("mode", r["mode"]), n)
            if i in parts.setdefault(key, {}):
                raise SystemExit(f"--merge: shard {i}/{n} of {key[:4]} given twice")
            parts[key][i] = (r, row)
    for key, shards in parts.items():
        n = key[-1]
        if sorted(shards) != list(range(n)):
            raise SystemExit(f"--merge: {key[:4]} ({key[4]}) has shards {sorted(shards)} of {n}")
        total = _row_stats(shards[0][1])
        for i in range(1, n):
            total.merge(_row_stats(shards[i][1]))
        first_report, first_row = shards[0]
        row = {**first_row, **total.summary(), "accepted_per_position": total.accepted_per_position,
               "seconds": sum(row["seconds"] for _, row in shards.values()), "shards": n}
        whole.append({**{k: v for k, v in first_report.items() if k != "shard"}, "mode": key[4],
                      "seconds": row["seconds"], "runs": [row]})
    return whole


def merge_reports(reports: list[dict]) -> dict:
    """One report from runs split over processes: the settings must agree (same prompts, tokens,
    seed); rows are ordered by drafter, temperature, k. Prompt shards of a row are added up first.
    A (drafter, T, k) given twice must have given the same numbers (as a graph and an eager run
    do); it is kept once. Compiled runs are rows of their own (compilation may change the
    numerics)."""
    reports = _join_shards(reports)
    first = reports[0]
    for r in reports[1:]:
        for key in SAME_IN_MERGED:
            if key == "mode":  # graph and eager runs of one table may be joined; other settings must agree
                continue
            if r.get(key) != first.get(key):
                raise SystemExit(f"--merge: the reports differ in {key} ({first.get(key)!r} vs {r.get(key)!r})")
    rows: dict[tuple, dict] = {}
    for r in reports:
        for row in r["runs"]:
            row = {**row, "mode": row.get("mode", r["mode"])}
            key = (row["path"], row["temperature"], row["k"], _compiled(row))
            if key in rows:
                old = rows[key]
                same = ("num_drafts", "num_accepted_tokens", "num_generated", "acceptance_per_position")
                if any(old[f] != row[f] for f in same):
                    raise SystemExit(f"--merge: {key} was run twice with different results "
                                     f"({old['mode']}: {old['mean_acceptance_length']}, {row['mode']}: "
                                     f"{row['mean_acceptance_length']})")
                old["also_in_modes"] = sorted(set(old.get("also_in_modes", [])) | {row["mode"]})
                continue
            rows[key] = row
    order = {path: i for i, path in enumerate(dict.fromkeys(row["path"] for r in reports for row in r["runs"]))}
    runs = sorted(rows.values(), key=lambda row: (order[row["path"]], _compiled(row), row["temperature"], row["k"]))
    return {**{k: first.get(k) for k in SAME_IN_MERGED}, "modes": sorted({r["mode"] for r in reports}),
            "merged_from": len(reports), "seconds": sum(r.get("seconds", 0) for r in reports),
            "device": first.get("device"), "gpu": first.get("gpu"), "torch": first.get("torch"),
            "runs": runs, "table": tables(runs, max(row["k"] for row in runs))}


def write_report(report: dict, args) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(report["table"] + "\n")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.merge:
        report = merge_reports([json.loads(Path(f).read_text()) for f in args.merge])
        print(report["table"])
        write_report(report, args)
        return report
    import torch
    from tqdm import tqdm

    from demo.engine import Engine
    from demo.models.checkpoints import load_drafter
    from demo.models.loading import load_target
    from demo.target import Target

    t0 = time.perf_counter()
    hf, tok = load_target(args.target, args.device, args.dtype)
    target = Target(hf)
    prompts, fingerprint = holdout_prompt_ids(tok, args.num_prompts or None, args.max_prompt_tokens, args.seed,
                                              args.prompts)
    subsample = len(prompts)
    places = list(range(subsample))
    if args.shard is not None:  # every N-th prompt: shards of about equal length
        places = places[args.shard[0]::args.shard[1]]
        prompts = [prompts[i] for i in places]
    max_context = max(len(p) for p in prompts) + args.max_new_tokens + max(args.ks) + 1
    drafters = [(spec, load_drafter(spec, target, method=args.method, hot_tokens=args.hot_tokens))
                for spec in args.drafter]
    engine = Engine(target, drafters[0][1], mode=args.mode, compile=args.compile,
                    max_context=max(max_context, 2048))
    print(f"{len(prompts)} hold-out prompts (fingerprint {fingerprint})"
          + (f", shard {args.shard[0]}/{args.shard[1]} of {subsample}" if args.shard else "")
          + f", max_new_tokens {args.max_new_tokens}, mode {args.mode}, {target.device}")
    rows = []
    total_runs = len(drafters) * len(args.temperatures) * len(args.ks) * len(prompts)
    bar = tqdm(total=total_runs, desc="validate", unit="gen", disable=not args.progress, dynamic_ncols=True)
    for spec, drafter in drafters:
        engine.set_proposer(drafter)
        name = f"{drafter.cfg.method} ({Path(spec).name})"
        for temperature in args.temperatures:
            for k in args.ks:
                start = time.perf_counter()
                stats = run(engine, prompts, k, temperature, args.max_new_tokens, args.seed, bar, places)
                summary = {**stats.summary(), "accepted_per_position": stats.accepted_per_position}
                rows.append({"drafter": name, "path": str(spec), "method": drafter.cfg.method, "mode": args.mode,
                             "draft_vocab": drafter.drafting_vocab,
                             "compile": args.compile or False,
                             "temperature": temperature, "k": k, "seconds": time.perf_counter() - start, **summary})
                bar.set_postfix(method=drafter.cfg.method, T=temperature, k=k,
                                mal=f"{summary['mean_acceptance_length']:.2f}")
    bar.close()
    table = tables(rows, max(args.ks))
    print(table)
    report = {"prompts": subsample, "shard": list(args.shard) if args.shard else None,
              "holdout_fingerprint": fingerprint, "max_new_tokens": args.max_new_tokens,
              "max_prompt_tokens": args.max_prompt_tokens, "seed": args.seed, "mode": args.mode,
              "device": str(target.device), "dtype": dtype_label(target.dtype),
              "gpu": torch.cuda.get_device_name() if target.device.type == "cuda" else None,
              "torch": torch.__version__, "seconds": time.perf_counter() - t0, "capture_s": engine.capture_s,
              "runs": rows, "table": table}
    write_report(report, args)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
