"""Where an EAGLE-3 drafter loses acceptance: teacher-forced accuracy per draft step on held-out
generations and on training sequences (the generalisation gap), next to the engine's acceptance on
the same held-out prompts (the gap between every position and the positions where chains start).
It also checks that the engine's first drafts are the training forward's at every chain start (an
engine that lost acceptance to its own bookkeeping would differ) and counts the first drafts lost
to target tokens outside the draft vocabulary.

    python -m training.drafter_gap --drafter assets/drafters/smollm2-135m-eagle3 \
        --holdout artifacts/prompts/holdout --train artifacts/regen-c/regen0 --num 8 --device cpu
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from demo.config import GenerationConfig
from demo.engine import Engine
from demo.metrics import AcceptanceStats
from demo.models.checkpoints import load_drafter
from demo.models.loading import load_target
from demo.target import Target
from training.data import load_shards
from training.losses import TargetBatch, eagle3_loss, eagle3_ttt_forward, rope_for, run_target
from training.validate import holdout_prompt_ids


def target_pass(target, aux, ids: list[int], mask: list[int]) -> TargetBatch:
    """The target's features and logits over one full sequence, as training sees them."""
    return run_target(target, torch.tensor([ids], device=target.device),
                      torch.tensor([mask], dtype=torch.bool, device=target.device), aux)


def teacher_forced(drafter, tb: TargetBatch, steps: int) -> tuple[np.ndarray, int, float, int]:
    """Per-step accuracy of the training-time-test forward over one sequence, its slot count, and
    step-0 accuracy at the chain starts of the training loss's walk with their count (on the
    engine's own greedy text, the walk visits the engine's chain roots)."""
    with torch.no_grad():
        _, metrics = eagle3_loss(drafter, tb, steps)
    n = int(metrics["chain_starts"].sum())
    return (np.array([float(a) for a in metrics["acc"]]), int(metrics["positions"]),
            float(metrics["start_acc"]) if n else 0.0, n)


def first_drafts(drafter, tb: TargetBatch, prompt_len: int, events):
    """How many of the engine's first drafts equal the training forward's step-0 draft at the same
    chain start (slot before the drafted position), of how many steps drafted; and, for each
    rejected first draft, its rank in the target's distribution and the target's top probability.
    tb: the target pass over the prompt and the engine's output."""
    seq = tb.tokens
    with torch.no_grad():
        cos, sin = rope_for(drafter, seq.shape[1] + 1, seq.device)
        h = eagle3_ttt_forward(drafter, torch.nn.functional.pad(seq, (0, 2)), tb.features, 1, cos, sin)[0]
        picks = drafter.select(drafter.lm_head(drafter.norm(h[0])))  # [S] target ids
    probs = tb.logits[0].float().softmax(-1)  # [S, V]
    same = steps = 0
    rejected = []
    done = prompt_len
    for e in events:
        if e.draft_ids:
            steps += 1
            same += e.draft_ids[0] == int(picks[done - 2])
            if e.num_accepted == 0:
                p = probs[done - 1]  # the target's distribution of the drafted position
                rejected.append((int((p > p[e.draft_ids[0]]).sum()), float(p.max())))
        done += len(e.token_ids)
    # teacher-forced step 0 over the answer, by whether the slot before drafted its own token right:
    # the engine starts most chains right after such a miss
    slots = torch.arange(max(prompt_len - 1, 1), seq.shape[1] - 2, device=seq.device)  # slot s predicts x[s+2]
    hit = picks[slots] == seq[0, slots + 2]
    prev_hit = picks[slots - 1] == seq[0, slots + 1]
    forced = {"prev_hit": hit[prev_hit].tolist(), "prev_miss": hit[~prev_hit].tolist()}
    return same, steps, rejected, forced


def weighted(rows: list[tuple]) -> list[float]:
    acc, n = np.stack([r[0] for r in rows]), np.array([r[1] for r in rows], dtype=float)
    return np.round((acc * n[:, None]).sum(0) / n.sum(), 3).tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", required=True)
    p.add_argument("--holdout", required=True, help="exported hold-out prompts (python -m training.data prompts: OUT/holdout)")
    p.add_argument("--train", required=True, help="a training shard directory (regen output)")
    p.add_argument("--num", type=int, default=8)
    p.add_argument("-k", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--device", default="auto")
    args = p.parse_args()

    hf, _ = load_target("default", args.device)
    target = Target(hf)
    drafter = load_drafter(args.drafter, target, method="eagle3", hot_tokens="off")  # as on a GPU
    aux = tuple(drafter.cfg.aux_layer_ids or target.config.default_aux_layers())
    prompts, _ = holdout_prompt_ids(None, 50, 1024, 0, args.holdout)  # the validation subsample's first ones
    engine = Engine(target, drafter, max_context=2048)
    in_vocab = drafter.t2d.cpu() if drafter.d2t is not None else torch.ones(target.config.vocab_size, dtype=torch.bool)
    stats, generated, first_rejected, first_oov = AcceptanceStats(reach=args.k), [], 0, 0
    for ids in prompts[: args.num]:
        events = list(engine.generate(ids, GenerationConfig(max_new_tokens=args.max_new_tokens, num_spec_tokens=args.k)))
        stats.merge(events[-1].stats)
        generated.append((ids, [t for e in events for t in e.token_ids], events))
        for e in events:  # a chain whose first draft failed: could the draft vocabulary hold the target's token?
            if e.draft_ids and e.num_accepted == 0 and e.token_ids:
                first_rejected += 1
                first_oov += not bool(in_vocab[e.token_ids[0]])
    # teacher forcing resizes the target's cache: after the engine is done with it
    held_tbs = [target_pass(target, aux, ids + ans, [0] * len(ids) + [1] * len(ans)) for ids, ans, _ in generated]
    held = [teacher_forced(drafter, tb, args.k) for tb in held_tbs]
    firsts = [first_drafts(drafter, tb, len(ids), events) for tb, (ids, _, events) in zip(held_tbs, generated)]
    agree = np.array([f[:2] for f in firsts]).sum(0)
    forced = {c: [a for f in firsts for a in f[3][c]] for c in ("prev_hit", "prev_miss")}
    rejected = np.array([r for f in firsts for r in f[2]]).reshape(-1, 2)  # (rank, target's top probability)
    data = load_shards(args.train)
    rows = np.random.default_rng(1).choice(len(data), args.num, replace=False)
    train = [teacher_forced(drafter, target_pass(target, aux, *(x.astype(np.int64).tolist() for x in data.get(int(i)))),
                            args.k) for i in rows]
    print(f"hold-out, engine (k={args.k}): mean acceptance length {stats.mean_acceptance_length:.3f}, acceptance "
          f"per position {[round(a, 3) for a in stats.acceptance_per_position]}")
    print(f"hold-out, engine: its first draft equals the training forward's at {agree[0]} of {agree[1]} chain starts")
    print(f"hold-out, engine: rejected first drafts were the target's second choice in "
          f"{100 * np.mean(rejected[:, 0] == 1):.0f}%, third to fifth in {100 * np.mean((rejected[:, 0] > 1) & (rejected[:, 0] < 5)):.0f}%; "
          f"the target's top probability there: median {np.median(rejected[:, 1]):.2f} "
          f"(below 0.5 in {100 * np.mean(rejected[:, 1] < 0.5):.0f}%)")
    print("hold-out, engine: first draft accepted after a fully accepted chain "
          f"{stats.acceptance_at_0_after_full:.3f} ({stats.steps_after_full} steps), after a rejection "
          f"{stats.acceptance_at_0_after_rejection:.3f} ({stats.steps_after_rejection} steps)")
    print("hold-out, teacher-forced step 0 over every answer slot: "
          f"{np.mean(forced['prev_hit'] + forced['prev_miss']):.3f}; where the slot before drafted its token right "
          f"{np.mean(forced['prev_hit']):.3f} ({len(forced['prev_hit'])}), where it missed "
          f"{np.mean(forced['prev_miss']):.3f} ({len(forced['prev_miss'])})")
    print(f"hold-out, engine: {first_oov} of {first_rejected} rejected first drafts "
          f"({100 * first_oov / max(first_rejected, 1):.1f}%) lost to a target token outside the draft vocabulary")
    walked = sum(r[3] for r in held)
    print(f"hold-out, the training loss's chain walk: step-0 accuracy at its {walked} chain starts "
          f"{sum(r[2] * r[3] for r in held) / max(walked, 1):.3f} (the engine's acceptance at token 0 on the same "
          f"text: {stats.acceptance_per_position[0]:.3f} over {stats.num_drafts} steps)")
    print(f"hold-out, teacher-forced accuracy per draft step (slots whose target token is in the draft "
          f"vocabulary): {weighted(held)}")
    print(f"training, teacher-forced accuracy per draft step: {weighted(train)}")


if __name__ == "__main__":
    main()
