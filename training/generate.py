"""Batched generation over ``demo.target.Target``, for regenerating training answers fast.

Continuous batching over a fixed set of B slots (rows of one static KV cache):

- a slot holds one prompt: its K/V occupy cache positions 0..p-1 of its row, and each decode step
  writes one token at the row's own position (positions are slots, and the causal slot mask hides
  the rest of the row, so rows of different lengths share one forward);
- a finished row (stop token or max_new_tokens) stops advancing on the device at once; every
  ``check_every`` steps the host collects finished rows and, when enough slots are free, refills
  them: the new prompts are prefilled together into a temporary cache whose rows are then copied
  into the free slots;
- the cache grows (copying its contents) when a longer prompt arrives; prompts are served shortest
  first, so it grows a few times at most and short prompts attend over a short cache.

The decode step reads and writes only persistent buffers, so with ``cuda_graph`` it is captured
once per cache size and replayed (eager decoding of a 30-layer model is launch-bound). Greedy rows
equal per-row greedy decoding; sampled rows draw from softmax(logits / T).
"""

from __future__ import annotations

import math
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from demo.kv_cache import KVCache
from demo.target import Target


@dataclass
class BatchGenConfig:
    batch_size: int = 256  # B slots
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0: greedy
    cuda_graph: bool = False  # capture the decode step (CUDA only; ignored elsewhere)
    check_every: int = 8  # decode steps between host checks for finished rows
    refill_fraction: float = 0.125  # refill once this share of the slots is free
    prefill_tokens: int = 65536  # padded prompt tokens per prefill forward
    capacity_step: int = 128  # the cache capacity is a multiple of this


class BatchGenerator:
    """Generates answers for many prompts at once; see the module docstring."""

    def __init__(self, target: Target, stop_ids: tuple[int, ...], cfg: BatchGenConfig):
        self.target, self.cfg = target, cfg
        self.stop_ids_list = tuple(int(i) for i in stop_ids)
        self.uses_graphs = bool(cfg.cuda_graph and target.device.type == "cuda")
        self.capture_s = 0.0
        self._graph = None

    # ------------------------------------------------------------------ persistent state
    def _allocate(self, batch: int, capacity: int) -> None:
        dev, M = self.target.device, self.cfg.max_new_tokens
        self.B, self.capacity = batch, capacity
        self.target.setup_cache(capacity, batch, exact=True)
        self.tok = torch.zeros(batch, 1, dtype=torch.int64, device=dev)  # [B, 1] next input token
        self.pos = torch.zeros(batch, 1, dtype=torch.int64, device=dev)  # [B, 1] its position (= cache slot)
        self.active = torch.zeros(batch, dtype=torch.bool, device=dev)  # [B] still generating
        self.ngen = torch.zeros(batch, dtype=torch.int64, device=dev)  # [B] tokens generated so far
        self.out = torch.zeros(batch, M + 1, dtype=torch.int64, device=dev)  # [B, M+1]; column M takes writes of finished rows
        self.stop = torch.tensor(self.stop_ids_list or (-1,), dtype=torch.int64, device=dev)  # [n_stop]
        self._graph = None

    def _grow(self, capacity: int) -> None:
        """Larger cache for longer prompts; live rows keep their K/V."""
        old = self.target.cache
        self.target.setup_cache(capacity, self.B)  # allocates new K/V and RoPE tables
        new = self.target.cache
        S = old.capacity
        new.k[..., :S, :].copy_(old.k)
        new.v[..., :S, :].copy_(old.v)
        self.capacity = capacity
        self._graph = None

    # ------------------------------------------------------------------ device steps
    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Next token per row, no host sync; logits [N, V] -> [N] int64."""
        if self.cfg.temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / self.cfg.temperature, dim=-1)
        return (probs / torch.empty_like(probs).exponential_()).argmax(-1)  # exponential race = a sample

    def _decode_step(self) -> None:
        """One token for every row; finished and empty rows are carried along unchanged.
        No blocking CPU operation: captured as a CUDA graph as it stands."""
        out = self.target.forward(self.tok, self.pos, last_logits_only=True)
        nxt = self._pick(out.logits[:, -1])  # [B]
        act = self.active
        self.out.scatter_(1, self.ngen.view(-1, 1), nxt.view(-1, 1))  # finished rows write past their end
        done = (nxt.view(-1, 1) == self.stop.view(1, -1)).any(-1) | (self.ngen + 1 >= self.cfg.max_new_tokens)
        step = act.to(torch.int64)
        self.ngen.add_(step)
        self.pos.add_(step.view(-1, 1))
        self.tok.copy_(torch.where(act.view(-1, 1), nxt.view(-1, 1), self.tok))
        self.active.logical_and_(~done)

    def _run_steps(self, n: int) -> None:
        if self.uses_graphs and self._graph is None:
            from demo.capture import CapturedStep  # the engine's capture helper: warm-up, then capture

            start = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start[0].record()
            # a fresh memory pool per capture: the previous graph (and its pool) was released when the
            # cache grew, and capturing into a released pool trips the caching allocator's assert
            self._graph = None
            self._graph = CapturedStep(self._decode_step, torch.cuda.graph_pool_handle())  # its warm-up steps are real steps
            start[1].record()
            start[1].synchronize()
            self.capture_s += start[0].elapsed_time(start[1]) / 1e3
        for _ in range(n):
            self._graph() if self._graph is not None else self._decode_step()

    def _prefill(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Prefill `prompts` into a temporary cache, copy its rows into `slots`, stage the first
        generated token of each."""
        t, dev = self.target, self.target.device
        c = t.config
        lens = [len(p) for p in prompts]
        n, L = len(prompts), max(lens)
        tokens = torch.zeros(n, L, dtype=torch.int64)
        for r, p in enumerate(prompts):
            tokens[r, : len(p)] = torch.tensor(p, dtype=torch.int64)
        tokens = tokens.to(dev)
        positions = torch.arange(L, device=dev).expand(n, L)
        lens_t = torch.tensor(lens, dtype=torch.int64, device=dev)  # [n]
        scratch = KVCache(c.num_layers, n, c.num_kv_heads, self.capacity, c.head_dim, t.dtype, dev)
        with _cache_swapped(t, scratch):
            out = t.forward(tokens, positions, last_logits_only=True)  # its last column is padding for most rows
        last = out.hidden[torch.arange(n, device=dev), lens_t - 1]  # [n, H] each row's last prompt token
        first = self._pick(t.lm_head(last))  # [n]
        idx = torch.tensor(slots, dtype=torch.int64, device=dev)
        t.cache.k.index_copy_(1, idx, scratch.k)
        t.cache.v.index_copy_(1, idx, scratch.v)
        self.tok.index_copy_(0, idx, first.view(-1, 1))
        self.pos.index_copy_(0, idx, lens_t.view(-1, 1))
        self.ngen.index_fill_(0, idx, 1)
        self.out[:, 0].index_copy_(0, idx, first)
        done = (first.view(-1, 1) == self.stop.view(1, -1)).any(-1) | (self.cfg.max_new_tokens <= 1)
        self.active.index_copy_(0, idx, ~done)

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def generate(self, prompts: list[list[int]],
                 should_stop: Callable[[], bool] | None = None) -> Iterator[tuple[int, list[int]]]:
        """Yield (prompt index, generated ids) as rows finish, in no particular order. The ids end
        with the stop token when one was generated. `should_stop()` is polled between checks; when
        it says yes, rows in flight are dropped and the generator returns."""
        if not prompts:
            return
        cfg, M = self.cfg, self.cfg.max_new_tokens
        if M < 1 or any(len(p) == 0 for p in prompts):
            raise ValueError("max_new_tokens must be >= 1 and every prompt non-empty")
        limit = self.target.config.max_position_embeddings
        queue = deque(sorted(range(len(prompts)), key=lambda i: len(prompts[i])))
        B = min(cfg.batch_size, len(prompts))
        self._allocate(B, self._capacity_for(len(prompts[queue[0]]), limit))
        slot_row = [-1] * B  # prompt index held by each slot, -1: free
        refill_at = max(1, math.ceil(cfg.refill_fraction * B))
        while True:
            if any(r >= 0 for r in slot_row):
                active = self.active.tolist()  # the host check: one sync every check_every steps
                finished = [b for b in range(B) if slot_row[b] >= 0 and not active[b]]
                if finished:
                    idx = torch.tensor(finished, device=self.out.device)
                    lens = self.ngen[idx].tolist()
                    rows = self.out[idx].tolist()
                    for b, n, row in zip(finished, lens, rows):
                        yield slot_row[b], row[:n]
                        slot_row[b] = -1
            if should_stop is not None and should_stop():
                return
            free = [b for b in range(B) if slot_row[b] < 0]
            if queue and (len(free) >= refill_at or len(free) == B):
                take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
                need = self._capacity_for(max(len(prompts[i]) for i in take), limit)
                if need > self.capacity:
                    self._grow(need)
                for group in self._prefill_groups(take, prompts):
                    slots = free[: len(group)]
                    free = free[len(group):]
                    self._prefill(slots, [prompts[i] for i in group])
                    for b, i in zip(slots, group):
                        slot_row[b] = i
            if all(r < 0 for r in slot_row):
                return
            self._run_steps(cfg.check_every)

    def _capacity_for(self, prompt_len: int, limit: int) -> int:
        need = prompt_len + self.cfg.max_new_tokens + 1
        if need > limit:
            raise ValueError(f"prompt of {prompt_len} tokens + {self.cfg.max_new_tokens} new tokens exceeds the "
                             f"target's {limit} positions")
        return min(limit, -(-need // self.cfg.capacity_step) * self.cfg.capacity_step)

    def _prefill_groups(self, take: list[int], prompts: list[list[int]]) -> list[list[int]]:
        """Split prompts (sorted by length) into forwards of at most prefill_tokens padded tokens."""
        groups, current = [], []
        for i in take:
            if current and len(prompts[i]) * (len(current) + 1) > self.cfg.prefill_tokens:
                groups.append(current)
                current = []
            current.append(i)
        return groups + ([current] if current else [])


@contextmanager
def _cache_swapped(target: Target, cache: KVCache):
    """Let target.forward write into `cache` for a moment (the prefill of new rows)."""
    saved = target.cache
    target.cache = cache
    try:
        yield
    finally:
        target.cache = saved
