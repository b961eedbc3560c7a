"""Verification: decide how many drafts the target accepts, and which token it adds.

Drafts are greedy (a point mass on the drafter's argmax), so the exact rule needs only the
target's distribution p (Leviathan et al. 2023 with q = one-hot; vLLM's rejection sampler with
``draft_probs=None``):

- T = 0: accept the longest prefix of drafts equal to the target's argmax, then emit the target's
  argmax at the first mismatch (or after the last draft: the bonus token).
- T > 0: accept draft d with probability min(1, p(d) / q(d)) = p(d); at the first rejection sample
  from the residual max(p - q, 0) normalised, i.e. p with d removed and renormalised; if all k pass,
  sample a bonus token from p at the next position. The output is distributed exactly as p.

These run on the device without host syncs; the engine reads the results once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from demo.config import SamplingParams
from demo.kernels.topk import row_topk


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's distribution after temperature and top-p; [N, V] -> [N, V] float32.
    At T = 0 this is the plain softmax (used only to show each token's probability)."""
    x = logits.float()
    if params.greedy:
        return torch.softmax(x, dim=-1)
    x = x / params.temperature
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # probability of strictly better tokens
        drop_sorted = mass_before >= params.top_p  # keeps the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


class ShownProbs:
    """The target's probabilities where a step shows them (each emitted token's, each draft's, the top
    candidates'). At T = 0 from the logits less each row's logsumexp, so no [N, V] softmax is written
    (a tree's 97 rows over a 49,152-token vocabulary: 19 MB a step); at T > 0 from target_probs,
    which the acceptance rules need whole anyway. logits: [N, V]."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams):
        self.logits = logits
        if params.greedy:
            self.probs, self.lse = None, torch.logsumexp(logits.float(), dim=-1)  # [N]
        else:
            self.probs, self.lse = target_probs(logits, params), None  # [N, V]

    def at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """rows, cols: [R] int64 -> [R] float32: p of token cols[i] at row rows[i]."""
        if self.probs is not None:
            return self.probs[rows, cols]
        return (self.logits[rows, cols].float() - self.lse[rows]).exp()

    def top(self, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """rows: [R] int64 -> (p [R, k] float32, token ids [R, k] int64): each row's k likeliest."""
        if self.probs is not None:
            return row_topk(self.probs[rows], k)
        values, ids = row_topk(self.logits[rows], k)
        return (values.float() - self.lse[rows, None]).exp(), ids


def verify_greedy(drafts: torch.Tensor, logits: torch.Tensor):
    """drafts: [k] int64; logits: [k+1, V] -> (num_accepted: [] int64, tokens: [k+1] int64).

    tokens[:n] are the accepted drafts (equal to the target's argmax there) and tokens[n] is the
    target's own token; entries after n are meaningless."""
    target_ids = logits.argmax(-1)  # [k+1]
    k = drafts.shape[0]
    matches = (drafts == target_ids[:k]).to(torch.int64)
    num_accepted = matches.cumprod(0).sum()
    return num_accepted, target_ids


def verify_sampled(drafts: torch.Tensor, probs: torch.Tensor, generator: torch.Generator | None):
    """drafts: [k] int64; probs: [k+1, V] target distribution -> (num_accepted: [], tokens: [k+1]).

    Accept draft i with probability p_i(d_i) until the first rejection at row n; tokens[n] is drawn
    from p_n with d_{n+1} removed (renormalised), or from p_k when all k drafts were accepted."""
    u = torch.rand(drafts.shape[0], generator=generator, device=probs.device)  # [k]
    noise = torch.empty_like(probs[0]).exponential_(generator=generator)  # [V]
    return sampled_rule(drafts, probs, u, noise)


def sampled_rule(drafts: torch.Tensor, probs: torch.Tensor, u: torch.Tensor, noise: torch.Tensor):
    """verify_sampled with its draws given: u [k] uniforms in [0, 1), noise [V] Exp(1) for the
    exponential race of the target's own token."""
    k = drafts.shape[0]
    rows = torch.arange(k, device=probs.device)
    accepted = (u < probs[rows, drafts]).to(torch.int64)
    num_accepted = accepted.cumprod(0).sum()
    residual = probs.index_select(0, num_accepted.view(1)).squeeze(0)  # [V] row n
    if k:  # (index_select, not tensor[0-d tensor], which would read the index on the host)
        rejected = drafts.index_select(0, num_accepted.clamp(max=k - 1).view(1))  # [1]
        keep = (num_accepted >= k).to(residual.dtype)  # drop the rejected draft only after a rejection
        residual = residual.scatter(0, rejected, residual.index_select(0, rejected) * keep)
    token = (residual / noise).argmax()  # exponential race: a sample from residual / residual.sum()
    tokens = torch.cat((drafts, drafts.new_zeros(1)))
    tokens = tokens.scatter(0, num_accepted.view(1), token.view(1))
    return num_accepted, tokens


@dataclass(frozen=True)
class CapturedSampling:
    """T > 0 inside a captured step: the temperature is read from a device scalar that each generation
    fills, so one graph serves every temperature. Top-p is 1: a request with top_p < 1 runs its
    acceptance test eagerly after the graph (its sort and scan stay out of the captured step)."""

    temperature: torch.Tensor  # [1] float32, > 0
    top_p: float = 1.0
    greedy: bool = False


@dataclass
class Draws:
    """A sampled step's acceptance draws, persistent so that a captured step reads them: made from the
    request's generator before the step (outside any graph), in the order the rules read them, which
    is the order verify_sampled and the tree rules draw them in: u, one uniform per draft, then Exp(1)
    noise over the vocabulary for the exponential race of the target's own token. Eager and graph
    mode so take the same draws from a seed."""

    u: torch.Tensor  # [N] float32
    noise: torch.Tensor  # [V] float32

    def draw_(self, generator: torch.Generator) -> None:
        self.u.uniform_(generator=generator)
        self.noise.exponential_(generator=generator)
