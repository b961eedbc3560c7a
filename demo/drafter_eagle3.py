"""EAGLE-3 drafter: one decoder layer fed by fused target features, with its own draft vocabulary.

- ``fc`` [H, 3*Ht] fuses the residual streams entering three target layers (low, mid, high); it
  runs once per step in ``project``, eagerly, outside any captured region (vLLM #17504).
- ``midlayer``: attention input is concat(input_layernorm(embedding), hidden_norm(hidden)) (2H
  wide); the residual is the un-normed hidden (``norm_before_residual`` variants use the normed
  one); post-attention norm and SwiGLU MLP as in Llama.
- ``norm`` then ``lm_head`` [Vd, H] over the draft vocabulary; draft id i is target id
  i + d2t[i] (``d2t`` holds offsets; ``t2d`` marks target ids present in the draft vocabulary).
  A shared-head variant (``own_lm_head`` false; no ``lm_head``, no ``d2t`` in the checkpoint, as
  nvidia/gpt-oss-120b-Eagle3) reads through the target's own lm_head over the full vocabulary, or,
  after ``limit_vocab(ids)``, through the rows of its most frequent tokens only (FR-Spec's
  frequency-ranked subset: what makes a draft step cheap where reading the whole head is not).
- Later draft steps feed back the layer's own pre-norm output instead of fc(features).
"""

from __future__ import annotations

import torch
from torch import nn

from demo.drafter_common import DraftAttention, DrafterBase, DrafterConfig, DraftMLP, RMSNorm
from demo.layers import attention, linear, stacked, swiglu_mlp


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, 2 * cfg.hidden_size)
        self.mlp = DraftMLP(cfg)


class Eagle3Drafter(DrafterBase):
    feature = "aux"

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.own_lm_head:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        else:
            object.__setattr__(self, "lm_head", None)  # the target's, borrowed by share_target
        self.hot_ids = None  # limit_vocab's target ids (plain attribute, on the target's device)
        object.__setattr__(self, "_full_lm_head", None)  # the target's, whatever limit_vocab did
        if cfg.draft_vocab_size != cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None

    def _borrow_head(self, head) -> None:
        object.__setattr__(self, "_full_lm_head", head)
        if self.hot_ids is None:
            super()._borrow_head(head)
        else:  # its hot rows only, copied in the drafter's dtype
            self._limit_head()

    def limit_vocab(self, ids: torch.Tensor) -> None:
        """Draft over the target ids `ids` only, through those rows of the target's lm_head (a
        shared-head drafter; call after share_target, which keeps the limit). Verification is
        untouched, so the output stays the target's; a draft can only miss more often, where the
        target's token is outside `ids`. ids: [N] distinct target ids."""
        if self.cfg.own_lm_head:
            raise ValueError("limit_vocab: this head drafts over its own draft vocabulary, not the target's lm_head")
        if self._full_lm_head is None:
            raise ValueError("limit_vocab: share_target(target) first (the rows come from the target's lm_head)")
        self.hot_ids = ids.to(self._full_lm_head.weight.device, torch.int64).unique()  # [N] sorted
        self._limit_head()

    @property
    def drafting_vocab(self) -> int:
        return self.cfg.draft_vocab_size if self.hot_ids is None else len(self.hot_ids)

    def _limit_head(self) -> None:
        full = self._full_lm_head.weight.detach()  # [V, H]
        head = nn.Linear(full.shape[1], len(self.hot_ids), bias=False, device=full.device, dtype=self.dtype)
        head.requires_grad_(False).weight.copy_(full[self.hot_ids])  # [N, H]
        head.weight._speclens_copy = True  # the drafter's own rows (own_linears)
        object.__setattr__(self, "lm_head", head)  # not registered: never saved, like the target's
        self._mark_head()
        self.d2t = self.hot_ids - torch.arange(len(self.hot_ids), device=self.hot_ids.device)  # [N] offsets
        self.t2d = torch.zeros(self.cfg.vocab_size, dtype=torch.bool, device=self.hot_ids.device)  # [V]
        self.t2d[self.hot_ids] = True  # the same d2t/t2d contract as a draft vocabulary of its own

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Fuse the three target features; [B, q, 3*Ht] -> [B, q, H], in the drafter's dtype."""
        return linear(self.fc, features.to(self.dtype))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                slots: torch.Tensor | None = None, mask: torch.Tensor | None = None, logits: bool = True,
                attend: int | None = None):
        """One draft pass; no blocking CPU operation (captured as a CUDA graph as it stands).

        tokens, positions: [B, q]; hidden: [B, q, H]; slots: [B, q] or None; mask: [B, 1, q, S] or None;
        attend: attend over the first `attend` cache slots (None: all)
        -> logits [B, q, Vd], hidden_out [B, q, H] (pre-norm)
        """
        cfg, layer = self.cfg, self.midlayer
        hidden = hidden.to(self.dtype)  # a no-op unless the engine's buffers keep the target's dtype
        normed = layer.hidden_norm(hidden)
        residual = normed if cfg.norm_before_residual else hidden
        x = torch.cat((layer.input_layernorm(self.embed(tokens)), normed), dim=-1)  # [B, q, 2H]
        cos, sin, slots, mask, k_cache, v_cache = self.rope_slots_mask(positions, slots, mask, attend)
        att = layer.self_attn
        h = residual + attention(x, stacked(att.q_proj, att.k_proj, att.v_proj), att.o_proj, cfg.num_heads,
                                 cfg.num_kv_heads, cfg.head_dim, cos, sin, k_cache, v_cache, slots, mask,
                                 triton=self.triton)
        mlp = layer.mlp
        h = h + swiglu_mlp(layer.post_attention_layernorm(h), stacked(mlp.gate_proj, mlp.up_proj), mlp.down_proj)
        return (self.head_logits(self.norm(h)) if logits else None), h

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids mapped to the target vocabulary: target id = draft id + d2t[draft id]."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]
