"""Tiny random targets and drafters for tests: no weights, no GPU, milliseconds to build."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from demo.drafter_common import DrafterConfig
from demo.drafter_eagle import EagleDrafter
from demo.drafter_eagle3 import Eagle3Drafter
from demo.target import Target

# initializer_range 0.2 makes logits peaked, so fp32 rounding never flips an argmax near-tie
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, bos_token_id=1,
            eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
KINDS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama-tied-mha": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "llama3-rope": (LlamaConfig, LlamaForCausalLM, dict(rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # q/k/v biases
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32)),  # per-head q/k norms
}


def tiny_hf(kind: str = "llama", seed: int = 0, **overrides):
    cfg_cls, model_cls, extra = KINDS[kind]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{**BASE, **extra, **overrides})).eval()
    if kind == "qwen2":  # random biases, so that the test would see them dropped
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                nn.init.normal_(proj.bias, std=0.2)
    return model


def tiny_target(kind: str = "llama", seed: int = 0, **overrides) -> Target:
    return Target(tiny_hf(kind, seed, **overrides))


def random_drafter(method: str, target: Target, seed: int = 1, draft_vocab_size: int = 0):
    """A randomly initialised drafter (accepts little, but runs every code path)."""
    torch.manual_seed(seed)
    cfg = DrafterConfig.for_target(method, target.config, draft_vocab_size=draft_vocab_size)
    drafter = (EagleDrafter if method == "eagle" else Eagle3Drafter)(cfg)
    if method == "eagle3" and draft_vocab_size:
        # draft id i -> target id 2i: d2t holds offsets, t2d marks the mapped target ids
        drafter.d2t.copy_(torch.arange(draft_vocab_size))
        drafter.t2d.zero_()
        drafter.t2d[torch.arange(draft_vocab_size) * 2] = True
    return drafter


class OracleDrafter(nn.Module):
    """Proposes the tokens of a known continuation, except where `table` was corrupted: acceptance
    is high and uneven, so runs see full accepts, bonus tokens and early rejections."""

    feature = "hidden"

    def __init__(self, table: list[int], vocab_size: int, hidden_size: int):
        super().__init__()
        self.cfg = DrafterConfig(method="eagle", hidden_size=hidden_size, intermediate_size=1, num_heads=1,
                                 num_kv_heads=1, vocab_size=vocab_size)
        self.register_buffer("table", torch.tensor(table + [0] * 64))
        self.vocab_size = vocab_size

    def share_target(self, target):
        pass

    def setup_cache(self, capacity: int, batch: int = 1):
        pass

    def project(self, features):
        return features

    def forward(self, tokens, positions, hidden):
        # slot at position i pairs token x[i+1] with feature h[i]; it predicts x[i+2]
        nxt = self.table[positions + 2]
        return nn.functional.one_hot(nxt, self.vocab_size).to(hidden.dtype), hidden

    def select(self, logits):
        return logits.argmax(-1)
