"""Tiny random targets and drafters for tests: no downloads, no GPU, milliseconds to build.

    hf, target = tiny_target("llama")                  # or "qwen2" (q/k/v biases), "qwen3" (q/k norms)
    drafter = tiny_drafter("eagle3", target, draft_vocab_size=64)

``initializer_range=0.2`` makes the target's logits peaked, so fp32 rounding differences between
our forward and transformers' never flip an argmax near-tie. The targets have no end-of-sequence
token, so greedy runs always go to max_new_tokens.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from demo.drafter_common import DrafterConfig
from demo.drafters import DRAFTER_CLASSES
from demo.target import Target

VOCAB, HIDDEN, LAYERS = 256, 64, 8
SIZES = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
KINDS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama-tied-mha": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "llama3-rope": (LlamaConfig, LlamaForCausalLM, dict(rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # q/k/v biases
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32)),  # per-head q/k norms, head_dim != H/heads
}


def tiny_hf(kind: str = "llama", seed: int = 0, **overrides):
    """A tiny random transformers Llama-family model (fp32, CPU, eval, no gradients)."""
    cfg_cls, model_cls, extra = KINDS[kind]
    torch.manual_seed(seed)
    hf = model_cls(cfg_cls(**{**SIZES, "tie_word_embeddings": False, **extra, **overrides})).eval()
    if kind == "qwen2":  # transformers initialises biases to zero; random ones make them matter
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                nn.init.normal_(proj.bias, std=0.2)
    return hf.requires_grad_(False)


def tiny_target(kind: str = "llama", *, tie: bool = False, seed: int = 0, **overrides):
    """(transformers model, Target) of a tiny random Llama-family model in fp32 on CPU."""
    hf = tiny_hf(kind, seed, tie_word_embeddings=tie, **overrides)
    return hf, Target(hf)


def tiny_drafter(method: str, target: Target, *, draft_vocab_size: int = 0, seed: int = 1, **overrides):
    """A random drafter shaped for `target` (one target layer wide unless `overrides` say otherwise).

    Norm weights and biases are random too, so a loader that dropped or swapped any of them would
    change the drafts. With a reduced draft vocabulary, draft id i maps to a random distinct target id.
    """
    torch.manual_seed(seed)
    cfg = DrafterConfig.for_target(method, target.config, draft_vocab_size=draft_vocab_size, **overrides)
    drafter = DRAFTER_CLASSES[method](cfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(std=0.2)
        if getattr(drafter, "d2t", None) is not None:
            ids = torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size].sort().values  # [Vd] target ids
            drafter.d2t.copy_(ids - torch.arange(cfg.draft_vocab_size))
            drafter.t2d.zero_()
            drafter.t2d[ids] = True
    return drafter.eval().requires_grad_(False)


class OracleDrafter(nn.Module):
    """Proposes the tokens of a known continuation `table` (prompt + answer), wrong wherever the
    table was corrupted: acceptance is high and uneven, so runs see full accepts, bonus tokens and
    early rejections. With `runner_up` (the true continuation), its second choice is that table's
    token: where the first choice is wrong, a tree's second child is right. Follows the drafter
    contract of demo/drafter_common.py; it reads positions only, so a tree's slots and mask do not
    matter to it."""

    feature = "hidden"

    def __init__(self, table: list[int], vocab_size: int, hidden_size: int, runner_up: list[int] | None = None):
        super().__init__()
        self.cfg = DrafterConfig(method="eagle", hidden_size=hidden_size, intermediate_size=1, num_heads=1,
                                 num_kv_heads=1, vocab_size=vocab_size)
        self.register_buffer("table", torch.tensor(table + [0] * 512))
        self.register_buffer("runner_up", torch.tensor((runner_up or table) + [0] * 512))
        self.vocab_size = vocab_size
        self.drafting_vocab = vocab_size

    def share_target(self, target):
        pass

    def stack_weights(self):
        pass  # no projections to stack

    def setup_cache(self, capacity: int, batch: int = 1):
        self.cache = types.SimpleNamespace(capacity=capacity)  # no K/V: only a tree's mask width reads it

    def project(self, features):
        return features

    def forward(self, tokens, positions, hidden, slots=None, mask=None, logits=True, attend=None):
        # the row at position i pairs token x[i+1] with feature h[i]: it predicts x[i+2]
        first = nn.functional.one_hot(self.table[positions + 2], self.vocab_size)
        second = nn.functional.one_hot(self.runner_up[positions + 2], self.vocab_size)
        return (2 * first + second).to(hidden.dtype), hidden

    def select(self, logits):
        return logits.argmax(-1)

    def to_target(self, ids):
        return ids


class FeatureOracle(OracleDrafter):
    """An oracle that finds its place by the target's features, as a trained drafter reads them: each
    row looks its feature up among the target's features along `sequence` (prompt + answer; the
    nearest by cosine) and drafts the token two past it, and its hidden output is the next
    position's feature, so a chain drafts on. With fresh features every draft inside `sequence` is
    right (but every `every`-th place's, when `every` is given); a stale or zero feature drafts from
    the wrong place (OracleDrafter reads positions only, and cannot tell)."""

    head_in_int8 = False  # no head of its own (a bench report asks)
    layer_in_int8 = False

    def __init__(self, target: Target, sequence: list[int], every: int = 0):
        super().__init__(sequence, target.config.vocab_size, target.config.hidden_size)
        n = len(sequence)
        target.setup_cache(n)
        with torch.inference_mode():
            ids = torch.tensor([sequence], device=target.device)
            features = target.forward(ids, torch.arange(n, device=target.device).view(1, -1)).hidden[0]  # [n, F]: h[i] predicts x[i+1]
        self.register_buffer("features", features.clone())
        self.register_buffer("keys", nn.functional.normalize(features, dim=-1).clone())
        after_next = sequence[2:] + [0, 0]  # [n]: x[i+2], the draft at h[i]
        if every:
            after_next = [(t + 1) % self.vocab_size if i % every == every - 1 else t for i, t in enumerate(after_next)]
        self.register_buffer("after_next", torch.tensor(after_next, device=target.device))

    def forward(self, tokens, positions, hidden, slots=None, mask=None, logits=True, attend=None):
        place = (nn.functional.normalize(hidden.float(), dim=-1) @ self.keys.float().T).argmax(-1)  # [B, q]: nearest h[j]
        drafts = nn.functional.one_hot(self.after_next[place], self.vocab_size).to(hidden.dtype)
        return drafts, self.features[(place + 1).clamp(max=len(self.features) - 1)].to(hidden.dtype)


def corrupted_oracle(table: list[int], target: Target, every: int = 5, skip: int = 0,
                     runner_up: bool = False) -> OracleDrafter:
    """An OracleDrafter whose every `every`-th proposal (after `skip` positions) is wrong; with
    `runner_up` the right token is its second choice there."""
    wrong = [t if i < skip or (i - skip) % every else (t + 1) % target.config.vocab_size for i, t in enumerate(table)]
    return OracleDrafter(wrong, target.config.vocab_size, target.config.hidden_size, table if runner_up else None)


def hf_greedy(hf, prompt: list[int], max_new: int, eos: int | None = None) -> list[int]:
    """transformers' own greedy decode of `prompt`: the reference every lossless test holds to."""
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                      pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run(engine, prompt: list[int], **gen):
    """(every emitted token, the events) of one generation with GenerationConfig(**gen)."""
    from demo.config import GenerationConfig

    events = list(engine.generate(prompt, GenerationConfig(**gen)))
    return [t for e in events for t in e.token_ids], events


def six_token_target():
    """A 6-token target flat enough that drafts are often accepted and often rejected, a prompt,
    and the exact joint P(t1, t2) of its first two generated tokens: (hf, target, prompt, joint [36])."""
    hf = tiny_hf("llama", vocab_size=6, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 initializer_range=0.1, bos_token_id=0, eos_token_id=5, pad_token_id=0)
    prompt = [0, 4, 3]
    with torch.no_grad():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
        p2 = torch.softmax(hf(torch.tensor([prompt + [t] for t in range(6)])).logits[:, -1], -1)
    return hf, Target(hf), prompt, (p1[:, None] * p2).flatten()
