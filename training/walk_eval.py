"""The headline's acceptance at T = 0, measured without decoding.

At T = 0 a lossless engine writes the target's own greedy text whatever the drafter, and each
chain's fate is fixed by that text: the chain rooted at slot i accepts its leading drafts that
equal the text, and the next chain is rooted right after. So the target's greedy answers to the
hold-out prompts, regenerated once (`training.data regen --prompts artifacts/prompts/holdout`),
measure any EAGLE-3 head in one teacher-forced pass per batch (`eagle3_chain_walk`): the mean
acceptance length and the acceptance at each token of `training.validate`'s k = 7, T = 0 row, on every
hold-out prompt, in seconds on a GPU and minutes on a CPU. On the engine's own output the walk is
its run, draft for draft (tests/training/test_walk_eval.py); on regenerated text the two can part where a
batched forward rounds a near-tie the other way, so `training.validate` stays the measurement of
record and this is the one to compare heads and follow training with (`training.train --eval-data`).

    python -m training.walk_eval --drafter assets/drafters/smollm2-135m-eagle3 --data regen:artifacts/holdout-greedy
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import torch

from training.data import SequenceSet, collate, length_batches
from training.losses import eagle3_chain_walk, run_target

MAX_LEN = 2048  # walked texts are cut here (hold-out prompts of at most 1,024 tokens + 256 new ones fit)


@dataclass
class WalkResult:
    """Chains of k drafts walked over a set of greedy texts."""

    k: int
    chains: int
    accepted_counts: list[int]  # [k + 1]: chains that accepted 0..k drafts
    teacher_forced_acc: list[float]  # [k]: per draft step, over every scored slot
    sequences: int
    seconds: float

    @property
    def mean_acceptance_length(self) -> float:
        """1 + drafts accepted per chain (the target's own token counts), as AcceptanceStats has it."""
        return 1.0 + sum(n * c for n, c in enumerate(self.accepted_counts)) / max(self.chains, 1)

    @property
    def acceptance_per_position(self) -> list[float]:
        """[k]: the share of chains that accepted more than i drafts."""
        return [sum(self.accepted_counts[i + 1:]) / max(self.chains, 1) for i in range(self.k)]

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_per_position": self.acceptance_per_position}

    def line(self) -> str:
        return (f"walk (k={self.k}, T=0, {self.sequences} texts, {self.chains} chains): mean acceptance length "
                f"{self.mean_acceptance_length:.3f}, acceptance at token i "
                f"{[round(a, 3) for a in self.acceptance_per_position]}, teacher-forced accuracy per step "
                f"{[round(a, 3) for a in self.teacher_forced_acc]}")


def walk_eval(target, drafter, data: SequenceSet, k: int = 7, batch_tokens: int = 16384,
              max_len: int = MAX_LEN) -> WalkResult:
    """Walk the drafter's T = 0 chains of k drafts over every sequence of `data` (answers the target
    wrote greedily, mask on the answer), in length-bucketed batches of at most batch_tokens padded
    tokens; bf16 autocast on CUDA, as training runs. The drafter is left in the mode it came in."""
    t0 = time.perf_counter()
    dev = target.device
    aux = tuple(drafter.cfg.aux_layer_ids or target.config.default_aux_layers())
    counts = torch.zeros(k + 1, dtype=torch.long, device=dev)
    correct = torch.zeros(k, dtype=torch.float64, device=dev)
    positions = torch.zeros(k, dtype=torch.float64, device=dev)
    was_training = drafter.training
    drafter.eval()
    try:
        for idx in length_batches(data.lengths.clip(max=max_len), batch_tokens, np.random.default_rng(0)):
            tokens, mask = collate(data, idx, max_len)
            tb = run_target(target, tokens.to(dev), mask.to(dev), aux)
            with torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext():
                walk = eagle3_chain_walk(drafter, tb, k)
            counts += torch.bincount(walk["accepted"], minlength=k + 1)
            correct += torch.stack(walk["correct"]).double()
            positions += torch.stack(walk["positions"]).double()
    finally:
        drafter.train(was_training)
    c = counts.tolist()
    return WalkResult(k, sum(c), c, (correct / positions.clamp(min=1)).tolist(), len(data),
                      round(time.perf_counter() - t0, 1))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.walk_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", required=True, action="append", help="an EAGLE-3 drafter directory or hub id "
                   "(repeat to compare heads on one pass of loading)")
    p.add_argument("--data", required=True, help="regen:DIR[,regen:DIR...]: the target's greedy answers")
    p.add_argument("--target", default="default")
    p.add_argument("--device", default="auto")
    p.add_argument("-k", type=int, default=7)
    p.add_argument("--num", type=int, default=None, help="N sequences drawn at random (seed 0), not all")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from demo.models.checkpoints import load_drafter
    from demo.models.loading import load_target
    from demo.target import Target
    from training.data import load_training_data

    hf, tok = load_target(args.target, args.device)
    target = Target(hf)
    data, metas = load_training_data(args.data, tok, MAX_LEN, progress=False, holdout_ok=True)
    if args.num is not None and args.num < len(data):  # shards run shortest prompt first: a random draw
        data = data.select(np.sort(np.random.default_rng(0).choice(len(data), args.num, replace=False)))
    for m in metas:
        if any(t != 0 for t in m["temperatures"]):
            print(f"warning: {m['dir']} holds sampled answers; the walk measures T = 0 on greedy text only",
                  file=sys.stderr)
    results = {}
    for spec in args.drafter:
        drafter = load_drafter(spec, target, method="eagle3", hot_tokens="off")
        r = walk_eval(target, drafter, data, args.k, args.batch_tokens)
        print(f"{spec}: {r.line()} ({r.seconds:.0f} s)", flush=True)
        results[spec] = r.to_dict()
    out = {"data": args.data, "sources": metas, "target": args.target, "device": str(target.device), "runs": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
