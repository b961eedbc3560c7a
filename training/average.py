"""Average the weights of drafters trained from one start (a "model soup").

Two heads trained on from the same weights with different data or loss settings stay in one basin,
and their mean often drafts better than either (the shipped EAGLE-3 head is the mean of two such
heads: docs/TRAINING.md). The inputs must be the same architecture, saved alike: equal
config.json, the same tensor names, shapes and dtypes; integer tensors (a draft vocabulary's maps)
must be equal. Floats are averaged in float32 and stored back in their own dtype.

    python -m training.average --out DIR RUN_A RUN_B [--weights 0.5 0.5]

OUT gets config.json and the weights (sharded as ``save_drafter`` shards them), the first input's
hot_tokens.json if it has one, and average_log.json: the inputs, their weights, how far apart they
were, and each input's train_log.json, or its own average_log.json where it is itself a mean, so
that the whole lineage travels with the head.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from demo.models.checkpoints import HOT_TOKENS_FILE, DrafterLoadError, read_checkpoint, write_weights

LOG_FILE = "average_log.json"
TRAIN_LOG = "train_log.json"


def average_tensors(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """sum_i w_i * states[i][name] for every float tensor (float32 accumulation, stored in the
    tensor's dtype); integer tensors must agree across states and are copied."""
    first = states[0]
    for i, state in enumerate(states[1:], 1):
        if state.keys() != first.keys():
            diff = sorted(state.keys() ^ first.keys())
            raise DrafterLoadError(f"input {i} has other tensors than input 0 (first difference: {diff[0]!r})")
        for name, t in state.items():
            if t.shape != first[name].shape or t.dtype != first[name].dtype:
                raise DrafterLoadError(f"{name}: input {i} is {t.dtype} {list(t.shape)}, input 0 "
                                       f"{first[name].dtype} {list(first[name].shape)}")
    out = {}
    for name, t0 in first.items():
        if not t0.is_floating_point():
            if any(not torch.equal(state[name], t0) for state in states[1:]):
                raise DrafterLoadError(f"{name}: an integer tensor that differs between the inputs (different "
                                       f"draft vocabularies cannot be averaged)")
            out[name] = t0.clone()
            continue
        acc = torch.zeros(t0.shape, dtype=torch.float32)
        for w, state in zip(weights, states):
            acc += w * state[name].float()
        out[name] = acc.to(t0.dtype).contiguous()
    return out


def _distance(states: list[dict[str, torch.Tensor]]) -> list[float]:
    """Relative L2 distance of each input from the first, over every float tensor."""
    ref = {k: v.float() for k, v in states[0].items() if v.is_floating_point()}
    norm = sum(float(v.pow(2).sum()) for v in ref.values()) ** 0.5
    return [round(sum(float((s[k].float() - v).pow(2).sum()) for k, v in ref.items()) ** 0.5 / norm, 6)
            for s in states]


def _lineage(d: Path) -> dict:
    """How input `d` was made: its train_log.json, or, for a head that is itself a mean, its
    average_log.json (so a mean of means keeps every run below it)."""
    if (d / TRAIN_LOG).exists():
        return {"train_log": json.loads((d / TRAIN_LOG).read_text())}
    if (d / LOG_FILE).exists():
        return {"train_log": None, "average_log": json.loads((d / LOG_FILE).read_text())}
    return {"train_log": None}


def average_drafters(inputs: list[str | Path], out_dir: str | Path, weights: list[float] | None = None,
                     max_shard_bytes: int = 9_500_000) -> Path:
    """Write the weighted mean of the drafter directories `inputs` to `out_dir` (see the module doc)."""
    if len(inputs) < 2:
        raise ValueError("averaging needs at least two drafters")
    weights = weights or [1.0 / len(inputs)] * len(inputs)
    if len(weights) != len(inputs) or any(w < 0 for w in weights) or abs(sum(weights) - 1.0) > 1e-6:
        raise ValueError(f"--weights: one non-negative weight per input, summing to 1 (got {weights})")
    dirs = [Path(d) for d in inputs]
    out = Path(out_dir)
    if out.resolve() in {d.resolve() for d in dirs}:
        raise ValueError("--out must not be one of the inputs")
    configs, states = zip(*(read_checkpoint(d) for d in dirs))
    for d, config in zip(dirs[1:], configs[1:]):
        if config != configs[0]:
            keys = sorted(k for k in config.keys() | configs[0].keys() if config.get(k) != configs[0].get(k))
            raise DrafterLoadError(f"{d}/config.json differs from {dirs[0]}/config.json in {keys}: only heads of "
                                   f"one architecture, saved alike, can be averaged")
    write_weights(average_tensors(list(states), weights), out, max_shard_bytes)
    (out / "config.json").write_text(json.dumps(configs[0], indent=2) + "\n")
    if (dirs[0] / HOT_TOKENS_FILE).exists():
        shutil.copyfile(dirs[0] / HOT_TOKENS_FILE, out / HOT_TOKENS_FILE)
    log = {"method": "average", "weights": weights, "relative_distance_from_input_0": _distance(list(states)),
           "hot_tokens_from": str(dirs[0]) if (dirs[0] / HOT_TOKENS_FILE).exists() else None,
           "inputs": [dict(dir=str(d), weight=w, **_lineage(d)) for d, w in zip(dirs, weights)]}
    (out / LOG_FILE).write_text(json.dumps(log) + "\n")
    return out


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(prog="python -m training.average", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="drafter directories (two or more), trained from one start")
    p.add_argument("--out", required=True, help="where the averaged drafter goes")
    p.add_argument("--weights", type=float, nargs="+", help="one per input, summing to 1 (default: equal)")
    p.add_argument("--max-shard-bytes", type=int, default=9_500_000)
    args = p.parse_args(argv)
    out = average_drafters(args.inputs, args.out, args.weights, args.max_shard_bytes)
    dist = json.loads((out / LOG_FILE).read_text())["relative_distance_from_input_0"]
    print(f"averaged {len(args.inputs)} drafters into {out} (relative distance from the first: {dist})")
    return out


if __name__ == "__main__":
    main()
