"""EAGLE-1 drafter: fc over concat(embedding of token i+1, target feature i) (2H -> H), one decoder
layer with no input norm and no final norm, then the target's own lm_head.

Parameter names follow the published checkpoints (yuhuili/EAGLE-LLaMA3.1-Instruct-8B):
``fc.weight`` [H, 2H] (+ ``fc.bias`` when config ``bias``), ``layers.0.self_attn.{q,k,v,o}_proj``,
``layers.0.mlp.{gate,up,down}_proj``, ``layers.0.post_attention_layernorm``.
The feature is the target's final hidden state after its last norm.
"""

from __future__ import annotations

import torch
from torch import nn

from demo.drafter_common import DraftAttention, DrafterBase, DrafterConfig, DraftMLP, RMSNorm
from demo.layers import attention, linear, stacked, swiglu_mlp


class EagleLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg, cfg.hidden_size)
        self.mlp = DraftMLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class EagleDrafter(DrafterBase):
    feature = "hidden"

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([EagleLayer(cfg)])
        object.__setattr__(self, "lm_head", None)  # the target's, not registered (see DrafterBase)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """EAGLE-1 reads the target's final hidden state as it is; [B, q, H] -> [B, q, H]."""
        return features

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                slots: torch.Tensor | None = None, mask: torch.Tensor | None = None, logits: bool = True,
                attend: int | None = None):
        """One draft pass; no blocking CPU operation (captured as a CUDA graph as it stands).

        tokens, positions: [B, q]; hidden: [B, q, H]; slots: [B, q] or None; mask: [B, 1, q, S] or None;
        attend: attend over the first `attend` cache slots (None: all) -> logits [B, q, V], hidden_out [B, q, H]
        """
        cfg, layer = self.cfg, self.layers[0]
        x = linear(self.fc, torch.cat((self.embed(tokens), hidden.to(self.dtype)), dim=-1))  # [B, q, H], the residual
        cos, sin, slots, mask, k_cache, v_cache = self.rope_slots_mask(positions, slots, mask, attend)
        att = layer.self_attn
        x = x + attention(x, stacked(att.q_proj, att.k_proj, att.v_proj), att.o_proj, cfg.num_heads,
                          cfg.num_kv_heads, cfg.head_dim, cos, sin, k_cache, v_cache, slots, mask,
                          triton=self.triton)
        mlp = layer.mlp
        x = x + swiglu_mlp(layer.post_attention_layernorm(x), stacked(mlp.gate_proj, mlp.up_proj), mlp.down_proj)
        return (self.head_logits(x) if logits else None), x
