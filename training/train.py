"""Train an EAGLE or EAGLE-3 drafter for a target, online: the frozen target computes its features
and distributions for every batch (no feature dump), the drafter learns from them.

    python -m training.train --method eagle3 --data regen:artifacts/regen --out artifacts/eagle3 --time-budget-min 8
    python -m training.train --method eagle3 --data regen:artifacts/regen --out artifacts/eagle3 --time-budget-min 10 --resume

The run saves the drafter with ``demo.models.checkpoints.save_drafter`` in OUT (config.json + safetensors
shards, loadable by ``load_drafter``, vLLM and SGLang), ``OUT/train_log.json`` (time per stage,
throughput, metrics) and a resumable ``OUT/checkpoint/train_state.pt`` (drafter, optimiser, step,
data position, RNG), written every --save-every-min minutes and at the end.

The defaults are the shipped heads' settings (docs/TRAINING.md, "Hyperparameters"): an EAGLE-3
head drafts through the target's lm_head over the full vocabulary, and its loss adds 2 x top-1
cross-entropy, decays 0.6 per TTT step and weighs the chains the engine would start 3 times.

With --time-budget-min the learning-rate schedule runs on elapsed training time, so warm-up and
cosine decay finish exactly when the budget does; with --max-steps it runs on steps (both: the
earlier end wins).

On several GPUs of one machine, start it with torchrun (data parallel, training/dist.py); steps
then count global batches of world size x --batch-tokens:

    torchrun --nproc-per-node 2 -m training.train --method eagle3 --data regen:artifacts/regen --out artifacts/eagle3 ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.profiler import schedule as profiler_schedule

from training.data import DraftVocab, SequenceSet, build_draft_vocab, collate, length_batches, load_training_data
from training.dist import Dist, init_from_env
from training.head_loss_kernel import backend_for as head_loss_backend
from training.init import Layout, check_shardable, own_state, saved_bytes, start_drafter, trainable, unshared_copy
from training.losses import chain_acceptance, eagle3_loss, eagle_loss, run_target

STATE_FILE = "checkpoint/train_state.pt"
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 5, 2, 5  # --profile: steps skipped, warmed up, recorded
LOG_FILE = "train_log.json"
ADAMW = dict(betas=(0.9, 0.95), weight_decay=0.0)
GRAD_CLIP = 0.5  # the gradient's largest norm
FEATURE_NOISE = 0.2  # EAGLE-1: uniform noise on the input features, relative to their RMS (EAGLE's augmentation)


@dataclass
class Schedule:
    """Linear warm-up over warmup_steps, then cosine from lr to lr * min_ratio over progress."""

    lr: float
    warmup_steps: int
    min_ratio: float = 0.1

    def __call__(self, step: int, progress: float) -> float:
        warm = min(1.0, (step + 1) / max(self.warmup_steps, 1))
        cos = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
        return self.lr * warm * (self.min_ratio + (1 - self.min_ratio) * cos)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=("eagle", "eagle3"), required=True)
    p.add_argument("--target", default="default", help="'default' (SmolLM2-135M-Instruct), a directory or hub id")
    p.add_argument("--data", required=True,
                   help="comma-separated sources: 'sharegpt' (answers as they are) or 'regen:DIR' (shards)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--profile", action="store_true",
                   help=f"profile training steps {PROFILE_WAIT + PROFILE_WARMUP + 1} to "
                        f"{PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE} (torch.profiler) into OUT/profile.txt")
    p.add_argument("--time-budget-min", type=float, default=None, help="stop (and save) after this much training")
    p.add_argument("--epochs", type=float, default=None, help="stop after this many passes over the data")
    p.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per batch")
    p.add_argument("--max-len", type=int, default=1024, help="sequences are cut to this many tokens")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (the recipe continues a trained "
                   "head at 2.5e-4)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--ttt-steps", type=int, default=7, help="EAGLE-3 training-time-test depth")
    p.add_argument("--ttt-decay", type=float, default=0.6, help="EAGLE-3: step j's loss weighs decay^j "
                   "(lower puts the first draft first)")
    p.add_argument("--top1-weight", type=float, default=2.0,
                   help="EAGLE-3: add this times cross-entropy against the target's argmax to the soft loss "
                        "(greedy drafts are accepted on the argmax; 0: the soft loss alone)")
    p.add_argument("--chain-start-weight", type=float, default=3.0,
                   help="EAGLE-3: weigh the chains rooted where the engine would start one at T = 0 (the drafter's "
                        "own chains on the training text) this many times the others; 1: every slot alike")
    p.add_argument("--align-mask", action="store_true",
                   help="EAGLE-3: step j trains only chains whose greedy drafts 0..j-1 equal the text (the steps "
                        "a T = 0 chain reaches)")
    p.add_argument("--aux-layers", default=None,
                   help="EAGLE-3 feature layers, e.g. 2,15,29 (default: the target's (2, L//2, L-3), saved as 'the "
                        "default', which vLLM and SGLang agree on; id i is the residual stream entering layer i)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="a new EAGLE-3 head with an lm_head of its own over the N most frequent answer tokens (8192: "
                        "the largest whose bf16 lm_head fits a 9.5 MB shard). Default: no lm_head of its own; it "
                        "drafts over the target's full vocabulary through the target's frozen lm_head. A head from "
                        "--init-drafter or --resume keeps its own layout")
    p.add_argument("--hot-tokens", type=int, default=16384,
                   help="EAGLE-3 through the target's lm_head: also save this many most frequent answer tokens "
                        "(hot_tokens.json), which the drafter alone drafts over on a CPU")
    p.add_argument("--intermediate-size", type=int, default=None,
                   help="the drafter's MLP width (default: the --init-drafter's, else the target's); wider than "
                        "the --init-drafter's widens it without changing what it computes (new units start silent)")
    p.add_argument("--save-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--save-every-min", type=float, default=2.0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint/train_state.pt")
    p.add_argument("--init-drafter", default=None, metavar="DIR",
                   help="start from a saved drafter's weights and layout (for EAGLE-3 its feature layers and its "
                        "lm_head, its own or the target's) with a fresh optimiser: continue a run whose training "
                        "state was not kept")
    p.add_argument("--eval-data", default=None, metavar="SPEC",
                   help="EAGLE-3: regen:DIR of the target's greedy answers to the hold-out prompts; the run walks "
                        "its chains over them (training.walk_eval: the k = --ttt-steps, T = 0 acceptance) at the end "
                        "and every --eval-every-min")
    p.add_argument("--eval-every-min", type=float, default=None, help="with --eval-data: also every this many "
                   "minutes of training (the walks' time is not training time)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    if args.max_steps is None and args.time_budget_min is None and args.epochs is None:
        p.error("give --max-steps, --time-budget-min or --epochs (when to stop)")
    if args.init_drafter and args.resume:
        p.error("--init-drafter starts a new run from saved weights; --resume continues a run's own checkpoint")
    if args.intermediate_size is not None and args.resume:
        p.error("--intermediate-size: a resumed run keeps its MLP width")
    if args.chain_start_weight != p.get_default("chain_start_weight") and args.method != "eagle3":
        p.error("--chain-start-weight weighs EAGLE-3's unrolled chains (EAGLE-1 trains one step)")
    if args.chain_start_weight <= 0:
        p.error("--chain-start-weight must be positive")
    if not 0 < args.ttt_decay <= 1 or (args.ttt_decay != p.get_default("ttt_decay") and args.method != "eagle3"):
        p.error("--ttt-decay: EAGLE-3's, in (0, 1]")
    if args.align_mask and args.method != "eagle3":
        p.error("--align-mask masks EAGLE-3's unrolled steps (EAGLE-1 trains one step)")
    if args.eval_data and args.method != "eagle3":
        p.error("--eval-data walks EAGLE-3's chains (EAGLE-1 trains no unrolled steps to walk)")
    if args.eval_every_min is not None and not args.eval_data:
        p.error("--eval-every-min needs --eval-data")
    if args.aux_layers is not None:
        args.aux_layers = tuple(int(i) for i in args.aux_layers.split(","))
        if len(args.aux_layers) != 3:
            p.error(f"--aux-layers: EAGLE-3's fc reads 3 feature layers, not {len(args.aux_layers)}")
    return args


# ------------------------------------------------------------------------------------ data
def check_holdout(data: SequenceSet, metas: list[dict]) -> str | None:
    """Refuse data that came from a held-out ShareGPT record; returns the hold-out fingerprint, or
    None when no sequence came from ShareGPT. The sources' recorded fingerprints must agree (one
    split); where ShareGPT is installed every record index is checked against its split too, and
    where it is not (the GPU machine) the recorded fingerprint is what the run keeps."""
    from training.data import read_sharegpt, split_holdout

    sources = data.source[data.source >= 0]
    if not len(sources):
        return None
    recorded = sorted({m["holdout_fingerprint"] for m in metas if m.get("holdout_fingerprint")})
    if len(recorded) > 1:
        raise SystemExit(f"training data from different hold-out splits ({', '.join(recorded)}): "
                         "export every source's prompts with one version of training.data")
    try:
        split = split_holdout(read_sharegpt())
    except FileNotFoundError:
        return recorded[0] if recorded else None
    if recorded and recorded[0] != split.fingerprint():
        raise SystemExit(f"training data recorded hold-out split {recorded[0]}, and this ShareGPT's split is "
                         f"{split.fingerprint()}: regenerate it with this version of training.data")
    allowed = np.zeros(len(split.train) + len(split.holdout), dtype=bool)
    allowed[[r.index for r in split.train]] = True
    bad = sources[(sources >= len(allowed)) | ~allowed[np.minimum(sources, len(allowed) - 1)]]
    if len(bad):
        raise SystemExit(f"training data holds {len(bad)} sequences from held-out ShareGPT records "
                         f"(first: record {int(bad[0])}); regenerate it with this version of training.data")
    return split.fingerprint()


# ------------------------------------------------------------------------------------ state
def save_state(path: Path, run: "Run") -> None:
    """Drafter, optimiser, data position and RNG: everything --resume needs to continue exactly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"drafter": own_state(run.drafter), "optimizer": run.opt.state_dict(), "step": run.step,
             "epoch": run.epoch, "batch_in_epoch": run.batch_in_epoch, "elapsed": run.elapsed,
             "vocab_ids": None if run.vocab is None else run.vocab.ids, "method": run.args.method,
             "aux_layers": None if run.layout.aux_layers is None else list(run.layout.aux_layers),
             "share_lm_head": run.args.method == "eagle3" and not run.layout.own_lm_head,
             "torch_rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def read_checkpoint(path: Path) -> dict:
    """What save_state wrote, for --resume."""
    if not path.exists():
        raise SystemExit(f"--resume: no {path}")
    return torch.load(path, map_location="cpu", weights_only=False)


# ------------------------------------------------------------------------------------ main
@dataclass
class Run:
    """Everything a training run holds, and where it is."""

    args: argparse.Namespace
    target: object
    data: SequenceSet
    vocab: DraftVocab | None
    drafter: torch.nn.Module
    params: list
    opt: torch.optim.Optimizer
    aux: tuple[int, ...]  # target feature layers read (EAGLE-3), () for EAGLE-1
    dist: Dist
    layout: Layout
    hot: DraftVocab | None = None  # a shared head's most frequent answer tokens (hot_tokens.json)
    eval_data: SequenceSet | None = None  # --eval-data: greedy hold-out answers to walk
    evals: list = field(default_factory=list)  # their walks so far: {"step", "trained_s", "eval"}
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed: float = 0.0  # seconds of training so far (all resumed runs)


def setup(args, times: dict, dist: Dist | None = None) -> tuple[Run, dict]:
    """Load the target and the data, start the drafter (training/init.py) and its optimiser, and
    restore the checkpoint with --resume. Returns the run and what the log records of the data."""
    from demo.models.loading import load_target
    from demo.target import Target

    dist = dist or Dist()
    t = time.perf_counter()
    hf, tok = load_target(args.target, args.device)
    target = Target(hf)
    times["load_target_s"] = time.perf_counter() - t

    t = time.perf_counter()
    data, log_data = load_data(args, tok)
    eval_data = load_eval_data(args, tok, log_data["holdout_fingerprint"]) if args.eval_data and dist.is_main else None
    times["load_data_s"] = time.perf_counter() - t

    t = time.perf_counter()
    state = read_checkpoint(Path(args.out) / STATE_FILE) if args.resume else None
    answer = data.answer_tokens()
    drafter, vocab, layout = start_drafter(args, target, answer, state)
    times["start_drafter_s"] = time.perf_counter() - t
    params = trainable(drafter)
    save_dtype = getattr(torch, args.save_dtype)
    check_shardable(drafter, save_dtype)
    print(f"{args.method} drafter: {sum(p.numel() for p in params) / 1e6:.2f} M trainable parameters on "
          f"{target.device}, {saved_bytes(drafter, save_dtype) / 1e6:.1f} MB as {args.save_dtype}")
    opt = torch.optim.AdamW(params, lr=args.lr, **ADAMW, **({"fused": True} if target.device.type == "cuda" else {}))
    aux = tuple(drafter.cfg.aux_layer_ids or target.config.default_aux_layers()) if args.method == "eagle3" else ()
    hot = hot_tokens(args, layout, answer, target.config.vocab_size)
    run = Run(args, target, data, vocab, drafter, params, opt, aux, dist, layout, hot, eval_data)
    dist.broadcast_parameters(params)
    if state is not None:
        restore(run, state)  # rank 0's generator state, on every rank
    if dist.active:  # each rank its own feature noise (exact resumption is a one-process promise)
        torch.manual_seed(args.seed + 1000 * dist.rank + run.step)
    return run, log_data


def load_data(args, tok) -> tuple[SequenceSet, dict]:
    """The training sequences, checked against the hold-out, and what the log records of them."""
    data, metas = load_training_data(args.data, tok, args.max_len, args.progress)
    if not len(data):
        raise SystemExit(f"--data {args.data}: no sequence with at least 2 answer tokens")
    fingerprint = check_holdout(data, metas)
    answer_tokens = int(data.mask.sum())
    print(f"data: {len(data)} sequences, {int(data.lengths.sum())} tokens, {answer_tokens} answer tokens "
          f"({args.data}); hold-out fingerprint {fingerprint}")
    return data, {"sources": metas, "sequences": len(data), "tokens": int(data.lengths.sum()),
                  "answer_tokens": answer_tokens, "holdout_fingerprint": fingerprint}


def load_eval_data(args, tok, fingerprint: str | None) -> SequenceSet:
    """--eval-data: the target's greedy answers to the hold-out prompts of the training data's split."""
    from training.walk_eval import MAX_LEN

    eval_data, metas = load_training_data(args.eval_data, tok, MAX_LEN, False, holdout_ok=True)
    recorded = {m.get("holdout_fingerprint") for m in metas} - {None}
    if fingerprint and recorded and recorded != {fingerprint}:
        raise SystemExit(f"--eval-data answers the prompts of hold-out split {', '.join(sorted(recorded))}; "
                         f"the training data's is {fingerprint}")
    print(f"eval data: {len(eval_data)} sequences ({args.eval_data})")
    return eval_data


def hot_tokens(args, layout: Layout, answer: np.ndarray, V: int) -> DraftVocab | None:
    """An EAGLE-3 head reading through the target's lm_head saves its most frequent answer tokens
    (hot_tokens.json), which it alone drafts over on a CPU. None for other heads."""
    if args.method != "eagle3" or layout.own_lm_head:
        return None
    hot = build_draft_vocab(answer, min(args.hot_tokens, V), V)
    print(f"hot tokens (drafted over on a CPU): {len(hot.ids)}, covering {100 * hot.coverage:.2f}% of answer tokens")
    return hot


def restore(run: Run, state: dict) -> None:
    missing, unexpected = run.drafter.load_state_dict(state["drafter"], strict=False)
    if unexpected or any(not k.startswith("_target") for k in missing):
        raise SystemExit(f"--resume: the checkpoint does not fit this drafter (missing {missing}, unexpected {unexpected})")
    run.opt.load_state_dict(state["optimizer"])
    run.step, run.epoch, run.batch_in_epoch, run.elapsed = (state["step"], state["epoch"], state["batch_in_epoch"],
                                                            state["elapsed"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    print(f"resumed at step {run.step} (epoch {run.epoch}, batch {run.batch_in_epoch}, {run.elapsed:.0f} s trained)")


def train_step(run: Run, idx: np.ndarray, lr: float) -> tuple[dict, torch.Tensor, int, int]:
    """One optimiser step on the sequences `idx`; returns (metrics, grad norm, answer tokens, padded tokens)."""
    args, dev = run.args, run.target.device
    with record_function("batch"):
        tokens, mask = collate(run.data, idx, args.max_len)  # [B, S] each
        tokens, mask = tokens.to(dev, non_blocking=True), mask.to(dev, non_blocking=True)
    for g in run.opt.param_groups:
        g["lr"] = lr
    with record_function("target_forward"):
        tb = run_target(run.target, tokens, mask, run.aux)
    with torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext(), \
            record_function("drafter_forward_and_loss"):
        if args.method == "eagle":
            loss, metrics = eagle_loss(run.drafter, tb, run.target.lm_head, FEATURE_NOISE)
        else:
            loss, metrics = eagle3_loss(run.drafter, tb, args.ttt_steps, args.top1_weight, args.chain_start_weight,
                                        args.ttt_decay, args.align_mask)
    run.opt.zero_grad(set_to_none=True)
    has_loss = loss.requires_grad  # False: no trainable slot (e.g. every target argmax outside the draft vocabulary)
    if has_loss:
        with record_function("backward"):
            loss.backward()
    if not run.dist.average_gradients(run.params, has_loss):  # one rank steps only when all do
        return metrics, torch.zeros((), device=dev), int(mask.sum()), tokens.numel()
    with record_function("optimizer"):
        grad_norm = torch.nn.utils.clip_grad_norm_(run.params, GRAD_CLIP)
        run.opt.step()
    return metrics, grad_norm, int(mask.sum()), tokens.numel()


STAGES = ("batch", "target_forward", "drafter_forward_and_loss", "backward", "optimizer")  # a step's record_functions


def _profiler(run: Run):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.target.device.type == "cuda" else [])
    p = profile(activities=activities, schedule=profiler_schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP,
                                                                  active=PROFILE_ACTIVE, repeat=1))
    p.start()
    return p


def _write_profile(p, run: Run) -> None:
    """Stop the profiler and write where the recorded steps spent their time to OUT/profile.txt:
    the step's stages (batch, target_forward, drafter_forward_and_loss, backward, optimizer) and the
    operators, by total and by self time on the device (CPU time on a CPU)."""
    p.stop()
    on = "device" if run.target.device.type == "cuda" else "cpu"
    table = p.key_averages()
    stages = {e.key: e for e in table if e.key in STAGES}
    by_stage = "\n".join(f"{name:<26} {stages[name].cpu_time_total / 1e3:10.1f} ms cpu"
                         + (f" {stages[name].device_time_total / 1e3:10.1f} ms device" if on == "device" else "")
                         for name in STAGES if name in stages)
    text = (f"{PROFILE_ACTIVE} training steps after {PROFILE_WAIT + PROFILE_WARMUP}, {run.args.method}, "
            f"{run.target.device}\n\nby stage\n{by_stage}\n\nby total {on} time\n"
            + table.table(sort_by=f"{on}_time_total", row_limit=30)
            + f"\n\nby self {on} time\n" + table.table(sort_by=f"self_{on}_time_total", row_limit=30) + "\n")
    if run.dist.is_main:
        (Path(run.args.out) / "profile.txt").write_text(text)
        print(f"profile of {PROFILE_ACTIVE} steps written to {Path(run.args.out) / 'profile.txt'}")


def train_loop(run: Run) -> tuple[list[dict], str]:
    """Steps until --max-steps / --epochs / --time-budget-min; checkpoints every --save-every-min.
    Returns (metric history, stop reason)."""
    from tqdm import tqdm

    args, lengths = run.args, run.data.lengths
    schedule = Schedule(args.lr, args.warmup_steps, args.min_lr_ratio)
    budget_s = None if args.time_budget_min is None else 60 * args.time_budget_min
    max_steps = args.max_steps
    if args.epochs is not None:
        per_epoch = len(run.dist.shard(length_batches(lengths, args.batch_tokens, np.random.default_rng([args.seed, 0]))))
        by_epochs = int(math.ceil(args.epochs * per_epoch))
        max_steps = by_epochs if max_steps is None else min(max_steps, by_epochs)

    def progress() -> float:
        return max([0.0] + ([run.step / max_steps] if max_steps else []) + ([run.elapsed / budget_s] if budget_s else []))

    history, window = [], _Window()
    last_save = last_print = time.perf_counter()
    last_eval = run.elapsed
    bar = tqdm(total=max_steps, initial=run.step, desc=f"train {args.method}", unit="step",
               disable=not (args.progress and run.dist.is_main),
               dynamic_ncols=True, mininterval=2.0)
    stop_reason = None
    profiler = _profiler(run) if args.profile else None
    while stop_reason is None:
        order = run.dist.shard(length_batches(lengths, args.batch_tokens, np.random.default_rng([args.seed, run.epoch])))
        if not order:  # fewer batches than ranks: no rank would ever step
            raise SystemExit(f"the data makes fewer batches per epoch than the {run.dist.world} ranks: "
                             f"use a smaller --batch-tokens or fewer ranks")
        while run.batch_in_epoch < len(order):
            if max_steps is not None and run.step >= max_steps:
                stop_reason = "max_steps"
                break
            if budget_s is not None and run.elapsed >= budget_s:
                stop_reason = "time_budget"
                break
            t_step = time.perf_counter()
            lr = schedule(run.step, progress())
            metrics, grad_norm, answer, padded = train_step(run, order[run.batch_in_epoch], lr)
            run.step += 1
            run.batch_in_epoch += 1
            # every rank adds the slowest rank's time, so all stop at the same step
            dt, answer, padded = run.dist.agree(time.perf_counter() - t_step, answer, padded, run.target.device)
            window.add(metrics, grad_norm, answer, padded)  # answer = int(mask.sum()): syncs every step
            if run.step % args.log_every == 0 or run.step == max_steps:
                row = window.flush(run.step, run.epoch, lr, run.elapsed)
                history.append(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc'][0]:.3f}", lr=f"{lr:.1e}",
                                **({"tau7": f"{row['chain_acceptance_k7']:.2f}"} if len(row["acc"]) > 1 else {}),
                                **({"start0": f"{row['start_acc']:.3f}"} if row.get("start_acc") is not None else {}),
                                tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
                if not args.progress and time.perf_counter() - last_print > 60:  # a log file's progress line
                    last_print = time.perf_counter()
                    print(f"step {run.step}, {run.elapsed / 60:.1f} min: loss {row['loss']:.3f}, "
                          f"acc0 {row['acc'][0]:.3f}"
                          + (f", step-0 accuracy at chain starts {row['start_acc']:.3f}"
                             if row.get("start_acc") is not None else "")
                          + f", {row['tokens_per_s']:.0f} tokens/s", flush=True)
            bar.update(1)
            run.elapsed += dt
            if profiler is not None and profiler.step_num < PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE:
                profiler.step()
                if profiler.step_num == PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE:
                    _write_profile(profiler, run)
            if args.eval_every_min and run.elapsed - last_eval >= 60 * args.eval_every_min:
                last_eval = run.elapsed
                evaluate(run)
            if run.dist.is_main and time.perf_counter() - last_save > 60 * args.save_every_min:
                save_state(Path(args.out) / STATE_FILE, run)
                last_save = time.perf_counter()
        if stop_reason is None:
            run.epoch += 1
            run.batch_in_epoch = 0
    bar.close()
    if profiler is not None and profiler.step_num < PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE:
        profiler.stop()
        print(f"--profile: training stopped at step {run.step}, before the profiled steps ended (no profile.txt)")
    if window.steps:
        history.append(window.flush(run.step, run.epoch, schedule(run.step, progress()), run.elapsed))
    if args.eval_data:
        evaluate(run)
    return history, stop_reason


def evaluate(run: Run) -> None:
    """Walk the drafter's chains over --eval-data (rank 0; the others wait), print the line and
    add {"step", "trained_s", "eval": WalkResult.to_dict()} to run.evals."""
    from training.walk_eval import walk_eval

    if run.dist.is_main:
        r = walk_eval(run.target, run.drafter, run.eval_data, run.args.ttt_steps, run.args.batch_tokens)
        print(f"step {run.step}, {run.elapsed / 60:.1f} min: {r.line()} ({r.seconds:.0f} s)", flush=True)
        run.evals.append({"step": run.step, "trained_s": round(run.elapsed, 2), "eval": r.to_dict()})
    run.dist.barrier()


def main(argv=None) -> dict:
    args = parse_args(argv)
    dist, args.device = init_from_env(args.device)
    quiet = None
    if not dist.is_main:  # one voice: rank 0 prints, logs and saves
        quiet = sys.stdout = open(os.devnull, "w")
    try:
        return _main(args, dist)
    finally:
        dist.close()
        if quiet is not None:
            sys.stdout = sys.__stdout__
            quiet.close()


def _main(args, dist: Dist) -> dict:
    times = {}
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    run, log_data = setup(args, times, dist)

    t = time.perf_counter()
    history, stop_reason = train_loop(run)
    times["train_s"] = time.perf_counter() - t
    in_sync = dist.in_sync(run.params)
    if not in_sync:
        print("warning: the ranks ended with different weights; rank 0's are saved", file=sys.stderr)

    t = time.perf_counter()
    if dist.is_main:
        save_state(out / STATE_FILE, run)
        from demo.models.checkpoints import save_drafter, write_hot_tokens

        save_drafter(unshared_copy(run.drafter, getattr(torch, args.save_dtype)), out)
        if run.hot is not None:
            write_hot_tokens(out, run.hot.ids, run.hot.coverage, f"most frequent answer tokens of {args.data}")
    times["save_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0

    last = history[-1] if history else {}
    log = {
        "method": args.method, "args": vars(args), "stop_reason": stop_reason, "steps": run.step,
        "epochs_done": run.epoch, "trained_s": run.elapsed, "times": times, "data": log_data,
        "world_size": dist.world, "ranks_in_sync": in_sync,
        "draft_vocab": None if run.vocab is None else {"size": len(run.vocab.ids), "coverage": run.vocab.coverage},
        "hot_tokens": None if run.hot is None else {"size": len(run.hot.ids), "coverage": run.hot.coverage},
        "drafter": {"parameters": sum(p.numel() for p in run.params), "config": run.drafter.cfg.to_dict(),
                    "save_dtype": args.save_dtype},
        "device": _device_info(run.target.device), "head_loss": head_loss_backend(run.target.device),
        "final": last, "history": history, "evals": run.evals,
    }
    if dist.is_main:
        if args.resume and (out / LOG_FILE).exists():
            log["previous"] = json.loads((out / LOG_FILE).read_text())
        (out / LOG_FILE).write_text(json.dumps(log, indent=2, default=_jsonable) + "\n")
    dist.barrier()  # the drafter is on disk before any rank returns
    print(f"stopped ({stop_reason}) at step {run.step}, epoch {run.epoch}; trained {run.elapsed:.0f} s; stages: "
          + ", ".join(f"{k} {v:.1f}" for k, v in times.items())
          + (f"; {dist.world} ranks, in sync: {in_sync}" if dist.active else ""))
    if last:
        estimate = last["chain_acceptance_k7"]
        print(f"final window: loss {last['loss']:.4f}, accuracy per step {[round(a, 3) for a in last['acc']]}"
              + (f", chain acceptance estimate (k=7) {estimate:.2f}" if estimate is not None else "")
              + (f", step-0 accuracy at chain starts {last['start_acc']:.3f}" if last.get("start_acc") is not None else "")
              + f", {last['tokens_per_s']:.0f} tokens/s")
    print(f"drafter saved to {out}")
    return log


class _Window:
    """Metrics averaged over the steps since the last log line."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.steps, self.loss, self.acc, self.grad, self.answer, self.padded = 0, [], [], [], 0, 0
        self.start_acc = []
        self.start = time.perf_counter()

    def add(self, metrics: dict, grad_norm, answer_tokens: int, padded_tokens: int):
        self.steps += 1
        self.loss.append(metrics["loss"])
        self.acc.append(torch.stack([a.float() for a in metrics["acc"]]))
        if metrics.get("start_acc") is not None:
            self.start_acc.append(metrics["start_acc"])
        self.grad.append(grad_norm)
        self.answer += answer_tokens
        self.padded += padded_tokens

    def flush(self, step: int, epoch: int, lr: float, elapsed: float) -> dict:
        dt = max(time.perf_counter() - self.start, 1e-9)
        acc = torch.stack(self.acc).mean(0).tolist()
        row = {"step": step, "epoch": epoch, "lr": lr, "trained_s": round(elapsed, 2),
               "loss": float(torch.stack(self.loss).mean()), "acc": acc,
               "grad_norm": float(torch.stack([g.float() for g in self.grad]).mean()),
               "chain_acceptance_k7": chain_acceptance(acc, 7) if len(acc) > 1 else None,
               "start_acc": float(torch.stack(self.start_acc).mean()) if self.start_acc else None,
               "tokens_per_s": self.padded / dt, "answer_tokens_per_s": self.answer / dt}
        self.reset()
        return row


def _device_info(dev: torch.device) -> dict:
    info = {"device": str(dev), "torch": torch.__version__}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    import transformers

    info["transformers"] = transformers.__version__
    return info


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


if __name__ == "__main__":
    main(sys.argv[1:])
