"""Data-parallel training over the GPUs of one machine, for ``training.train`` started by torchrun:

    torchrun --nproc-per-node 2 -m training.train --method eagle3 --data regen:artifacts/regen ...

Every rank holds the frozen target and the whole drafter, takes every world-th batch of the
epoch's shared order, and averages its gradients with the others before the optimiser step, so the
ranks stay in lockstep (checked at the end). Time, stop decisions and throughput are agreed on by
all-reduces; rank 0 alone writes checkpoints, logs and the drafter. A plain ``python -m
training.train`` is world size 1 and touches none of this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, batches: list) -> list:
        """This rank's batches of an epoch: every world-th, the same count on every rank."""
        if not self.active:
            return batches
        per_rank = len(batches) // self.world
        return batches[self.rank::self.world][:per_rank]

    def average_gradients(self, params: list[torch.nn.Parameter], has_loss: bool) -> bool:
        """Average the gradients of all ranks (a rank without a trainable slot sends zeros).
        Returns whether any rank had a loss: all ranks then step, or none does."""
        if not self.active:
            return has_loss
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads] + [grads[0].new_tensor([float(has_loss)]).float()])
        dist.all_reduce(flat)
        any_loss = bool(flat[-1] > 0)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = (flat[offset:offset + n] / self.world).view_as(p).to(p.dtype)
            offset += n
        return any_loss

    def agree(self, elapsed: float, answer: int, padded: int, device) -> tuple[float, int, int]:
        """The slowest rank's elapsed time (so every rank stops at the same step) and the summed
        token counts of this step."""
        if not self.active:
            return elapsed, answer, padded
        t = torch.tensor([elapsed], dtype=torch.float64, device=device)
        counts = torch.tensor([answer, padded], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(counts)
        return float(t), int(counts[0]), int(counts[1])

    def broadcast_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Start every rank from rank 0's weights."""
        if self.active:
            for p in params:
                dist.broadcast(p.data, src=0)

    def in_sync(self, params: list[torch.nn.Parameter]) -> bool:
        """Whether every rank holds exactly rank 0's weights."""
        if not self.active:
            return True
        diffs = []
        for p in params:
            ref = p.data.clone()
            dist.broadcast(ref, src=0)
            diffs.append((p.data != ref).any())
        bad = torch.stack(diffs).any().to(torch.int64).view(1)
        dist.all_reduce(bad)
        return int(bad) == 0

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def init_from_env(device: str) -> tuple[Dist, str]:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK); returns the rank
    info and the device this rank trains on (cuda:LOCAL_RANK, or the CPU with gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world)
    return Dist(rank, world, local), device
