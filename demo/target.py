"""The target's forward: a compact Llama-family decoder over the weights transformers loaded.

No weight is copied: every op reads the parameters of the transformers model in place. The forward
writes K/V into a static ``KVCache`` at explicit positions (so verification of k+1 tokens and
rollback need no cache surgery), and returns what drafters read: the final normed hidden state
(EAGLE) and the residual streams entering selected layers (EAGLE-3).

Covers Llama 2/3.x (incl. llama3 RoPE scaling), Qwen2/2.5 (qkv bias), Qwen3 (q/k norms), Mistral
without sliding windows, SmolLM2, tied or untied heads.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from demo.kernels.attend import ORDERED_ROWS, attend, causal_seen_slots, orders_slots, seen_slots
from demo.kernels.fused import fused_runs, linear_residual, norm_gated, norm_linear, norm_qkv_rope, rope_fits
from demo.kernels.persistent import LayerStack, fits, persistent_layers, stack_current, stack_layers
from demo.kernels.runtime import DEFAULT_KERNELS, check_kernels
from demo.kv_cache import CacheInUse, KVCache
from demo.layers import attend_heads, attention, causal_slot_mask, linear, rms_norm, rope_tables, stacked, swiglu_mlp

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass
class TargetConfig:
    """The few numbers the forward needs, read from a transformers config."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str = "silu"

    @classmethod
    def from_hf(cls, cfg) -> "TargetConfig":
        model_type = getattr(cfg, "model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"target model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if model_type == "mistral" and getattr(cfg, "sliding_window", None):
            if cfg.sliding_window < cfg.max_position_embeddings:
                raise ValueError(f"Mistral sliding_window={cfg.sliding_window} is not supported")
        heads = cfg.num_attention_heads
        return cls(
            model_type=model_type,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            vocab_size=cfg.vocab_size,
            rms_norm_eps=cfg.rms_norm_eps,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            hidden_act=getattr(cfg, "hidden_act", "silu"),
        )

    def default_aux_layers(self) -> tuple[int, int, int]:
        """EAGLE-3's default feature layers: the residual streams entering layers 2, L//2, L-3."""
        L = self.num_layers
        return (2, L // 2, L - 3)


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [B, q, V] (or [B, 1, V] when only the last row was asked for)
    hidden: torch.Tensor  # [B, q, H] final hidden after the last norm (EAGLE-1 feature)
    aux: torch.Tensor | None  # [B, q, len(aux_layers) * H] residual streams entering aux layers


class Target:
    """Forward over a transformers Llama-family CausalLM's weights, with a static KV cache."""

    def __init__(self, hf_model, kernels: str = DEFAULT_KERNELS):
        """kernels: what the forwards run on a GPU (demo.kernels.runtime.KERNELS): the fused kernels,
        or PyTorch's layers, their reference (a measurement choice: the app runs the default)."""
        self.hf = hf_model
        self.kernels = check_kernels(kernels)
        self.config = TargetConfig.from_hf(hf_model.config)
        inner = hf_model.model
        self.embed = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = hf_model.lm_head  # tied heads share the embedding's storage
        self.act = _activation(self.config.hidden_act)
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq  # transformers computed it for the config's RoPE type
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.cache: KVCache | None = None
        self.cos = self.sin = None
        self._stack: LayerStack | None = None  # the layers' weights stacked for the "persistent" kernels
        self._holder: object | None = None  # the generation that holds the KV cache (hold_cache)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def rows_alike(self) -> bool:
        """Whether a decoding row's logits are the same at any forward width, bit for bit: every layer
        and the head run demo.kernels.fused's kernels (the default on a GPU) and attention takes the rows in
        slot order (demo.kernels.attend). Then 1-row target-only decoding is the exact reference of any
        verification, a chain's or a tree's (demo.engine.target_only_width)."""
        x = self.embed.weight[:1].unsqueeze(0)  # [1, 1, H]: the activations' device and dtype
        return (self._fuses(x) and all(self._fuse_layer(layer) for layer in self.layers)
                and getattr(self.lm_head, "bias", None) is None and self.ordered_masks(1))

    def ordered_masks(self, rows: int) -> bool:
        """Whether a forward of `rows` query rows attends through a mask in slot order
        (demo.kernels.attend.seen_slots): the Triton attention runs, its rows' heads fit one program, and
        the forward is a decoding step's (at most ORDERED_ROWS rows). A tree's step builds its mask
        so (demo.engine), and forward orders a boolean one itself."""
        x = self.embed.weight[:1].unsqueeze(0)  # [1, 1, H]: the activations' device and dtype
        c = self.config
        return (rows <= ORDERED_ROWS and self.kernels != "torch"
                and orders_slots(x, c.head_dim, c.num_heads // c.num_kv_heads))

    def check_aux_layers(self, layers: tuple[int, ...]) -> None:
        """Refuse feature layer ids the target does not have (id L is the last layer's output)."""
        for i in layers:
            if not 0 <= i <= self.config.num_layers:
                raise ValueError(f"aux layer id {i} is outside the target's layers 0..{self.config.num_layers}")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids that end a reply: the generation config's eos, else the model config's."""
        eos = getattr(getattr(self.hf, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(self.hf.config, "eos_token_id", None)
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @contextmanager
    def hold_cache(self, holder: object) -> Iterator[None]:
        """The KV cache for one generation, from its prefill to its last step. A generation leaves
        its state in the cache between steps, so two may never interleave on one target: a second
        hold while one is open is refused (CacheInUse), whichever engine of this target asks."""
        if self._holder is not None:
            raise CacheInUse("another generation holds this target's KV cache: one generation at a time "
                             "runs on a target (finish or close the first)")
        self._holder = holder
        try:
            yield
        finally:
            self._holder = None

    def setup_cache(self, capacity: int, batch: int = 1, exact: bool = False) -> KVCache:
        """Allocate the KV cache and RoPE tables once; a no-op when the current ones are big enough
        (`exact`: of exactly this capacity, as attention cost follows the capacity)."""
        c = self.config
        have = self.cache
        if (have is None or have.batch != batch or have.capacity < capacity
                or (exact and have.capacity != capacity)):
            self.cache = KVCache(c.num_layers, batch, c.num_kv_heads, capacity, c.head_dim, self.dtype, self.device)
            self.cos, self.sin = rope_tables(self.inv_freq, capacity, self.rope_scale, self.dtype, self.device)
        return self.cache

    def stack_weights(self) -> None:
        """Stack each layer's q/k/v and gate/up weights (demo.layers.StackedLinear), or restack them
        if a weight was replaced since; the engine calls it before capturing or compiling a forward."""
        for layer in self.layers:
            att, mlp = layer.self_attn, layer.mlp
            stacked(att.q_proj, att.k_proj, att.v_proj)
            stacked(mlp.gate_proj, mlp.up_proj)
        if self.kernels == "persistent":
            self.layer_stack()

    def _fuses(self, x: torch.Tensor) -> bool:
        """Whether this target's forwards over activations like x take demo.kernels.fused's kernels
        (the persistent kernels' too: a forward they do not take, a prefill, runs the fused ones)."""
        return self.kernels in ("fused", "persistent") and fused_runs(x, self.act)

    def _layer_parts(self, ids=None) -> dict[int, dict]:
        """Layer id -> its weights as demo.kernels.persistent.stack_layers takes them (`ids`: those
        layers only; None: every layer)."""
        ids = range(len(self.layers)) if ids is None else ids
        return {i: dict(norm1=layer.input_layernorm, qkv=stacked(layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                                 layer.self_attn.v_proj),
                        o=layer.self_attn.o_proj, norm2=layer.post_attention_layernorm,
                        gate_up=stacked(layer.mlp.gate_proj, layer.mlp.up_proj), down=layer.mlp.down_proj)
                for i in ids for layer in (self.layers[i],)}

    def layer_stack(self) -> LayerStack | None:
        """The layers' weights stacked for the persistent launch (demo.kernels.persistent), made on first
        use and again once stale; None where the launch cannot take these layers (a layer the fused
        kernels refuse, RoPE outside the projection, norms of different epsilons) or the weights'
        device runs no Triton. Under torch.compile or a capture, the one made before, as it is."""
        x = self.embed.weight[:1].unsqueeze(0)  # [1, 1, H]: the activations' device and dtype
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self._stack
        if self._stack is not None and self._fuses(x) and stack_current(
                self._stack, self._layer_parts({0, len(self.layers) - 1})):
            return self._stack  # an eager step's check: two layers, not every layer's eligibility again
        c = self.config
        if not (self._fuses(x) and all(self._fuse_layer(layer) for layer in self.layers)
                and rope_fits(c.head_dim, getattr(self.layers[0].self_attn, "q_norm", None))):
            return None
        parts = list(self._layer_parts().values())
        if len({(p["norm1"].variance_epsilon, p["norm2"].variance_epsilon) for p in parts}) != 1:
            return None
        self._stack = stack_layers(parts)
        return self._stack

    @staticmethod
    def _fuse_layer(layer) -> bool:
        """Whether a layer's weights fit demo.kernels.fused's kernels (stackable, no o_proj/down bias)."""
        att, mlp = layer.self_attn, layer.mlp
        return (stacked(att.q_proj, att.k_proj, att.v_proj).weight is not None
                and stacked(mlp.gate_proj, mlp.up_proj).weight is not None
                and getattr(att.o_proj, "bias", None) is None and getattr(mlp.down_proj, "bias", None) is None)

    def _fused_layer(self, x, layer, cos, sin, k_cache, v_cache, slots, mask) -> torch.Tensor:
        """One decoder layer through demo.kernels.fused: norm + q/k/v + RoPE + the cache write (RoPE and the
        write apart for heads rope_fits refuses), attention, o_proj + residual, norm + gate/up + silu,
        down + residual. x [B, q, H] -> [B, q, H]."""
        c, att, mlp = self.config, layer.self_attn, layer.mlp
        qkv = stacked(att.q_proj, att.k_proj, att.v_proj)
        q_norm = getattr(att, "q_norm", None)
        if rope_fits(c.head_dim, q_norm):  # RoPE and the cache write in the projection's kernel
            B, q, _ = x.shape
            qs = norm_qkv_rope(x, layer.input_layernorm, qkv.weight, qkv.bias, cos, sin, slots, k_cache, v_cache,
                               c.num_heads)  # [B, q, nh, hd]
            heads = attend(qs.transpose(1, 2), k_cache, v_cache, mask).transpose(1, 2).reshape(B, q, -1)
        else:
            qs, ks, vs = norm_linear(x, layer.input_layernorm, qkv.weight, qkv.bias).split(qkv.sizes, dim=-1)
            heads = attend_heads(qs, ks, vs, c.num_heads, c.num_kv_heads, c.head_dim, cos, sin, k_cache, v_cache,
                                 slots, mask, q_norm, getattr(att, "k_norm", None))
        x = linear_residual(heads, att.o_proj.weight, x)
        gate_up = stacked(mlp.gate_proj, mlp.up_proj)
        return linear_residual(norm_gated(x, layer.post_attention_layernorm, gate_up.weight), mlp.down_proj.weight, x)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, *, aux_layers: tuple[int, ...] = (),
                last_logits_only: bool = False, logits_rows: torch.Tensor | None = None,
                slots: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                attend: int | None = None) -> TargetOutput:
        """Run tokens at positions through the decoder, writing their K/V into the cache at `slots`
        (default: the positions) and attending as `mask` allows (default: causal over the slots; a
        draft tree passes its own, demo/tree.py). The Triton attention takes a decoding step's masks
        (up to ORDERED_ROWS rows) in slot order, demo.kernels.attend.seen_slots, so that a tree's nodes, a
        chain's rows and a 1-row step all run its one kernel. `aux_layers` names the residual
        streams to return (id i: the stream entering layer i), in that order. Logits are computed at
        every row, the last only (`last_logits_only`), or the rows `logits_rows` ([R] int64) names. `attend`: attend over
        the first `attend` cache slots only (every slot a query may see, and every slot written,
        must lie below it; a mask is cut to them); None: over the whole cache.

        No blocking CPU operation happens here: it is captured as a CUDA graph as it stands.
        """
        # tokens, positions, slots: [B, q] int64; mask: [B, 1, q, S] bool
        c, cache = self.config, self.cache
        x = self.embed(tokens)  # [B, q, H]
        cos = self.cos[positions].unsqueeze(1)  # [B, 1, q, hd]
        sin = self.sin[positions].unsqueeze(1)
        slots = positions if slots is None else slots
        S = cache.capacity if attend is None else attend
        in_order = self.ordered_masks(tokens.shape[1])
        if mask is None:  # causal over the slots: [B, 1, q, S] bool, or each row's seen slots, int32
            mask = causal_seen_slots(positions, S) if in_order else causal_slot_mask(positions, S)
        else:  # a tree's: bool, or already in slot order (int32)
            mask = mask[..., :S]
            if in_order and mask.dtype == torch.bool:  # a tree's nodes sum their ancestors as target-only sums the path
                mask = seen_slots(mask)  # int32 [B, 1, q, S]
        streams = {}  # layer id -> residual stream entering it
        fused = self._fuses(x)
        stack = (self.layer_stack() if self.kernels == "persistent" and fused and mask.dtype == torch.int32
                 else None)
        if stack is not None and not fits(stack, tokens.shape[1], c.num_heads, c.num_kv_heads, c.head_dim):
            stack = None
        if stack is not None:  # every layer in one launch (demo.kernels.persistent)
            outs = persistent_layers(x, stack, cos, sin, slots, cache.k[:, :, :, :S], cache.v[:, :, :, :S], mask,
                                     c.num_heads)  # [L, B, q, H]: the stream each layer leaves
            streams = {i: x if i == 0 else outs[i - 1] for i in aux_layers if i < c.num_layers}
            x = outs[-1]
        layers = self.layers if stack is None else ()
        for i, layer in enumerate(layers):
            if i in aux_layers:
                streams[i] = x
            att = layer.self_attn
            k_cache, v_cache = cache.layer(i)
            k_cache, v_cache = k_cache[:, :, :S], v_cache[:, :, :S]  # views: writes reach the cache
            if fused and self._fuse_layer(layer):
                x = self._fused_layer(x, layer, cos, sin, k_cache, v_cache, slots, mask)
                continue
            h = rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
            x = x + attention(
                h, stacked(att.q_proj, att.k_proj, att.v_proj), att.o_proj, c.num_heads, c.num_kv_heads,
                c.head_dim, cos, sin, k_cache, v_cache, slots, mask,
                getattr(att, "q_norm", None), getattr(att, "k_norm", None), self.kernels != "torch",
            )
            h = rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            x = x + swiglu_mlp(h, stacked(layer.mlp.gate_proj, layer.mlp.up_proj), layer.mlp.down_proj, self.act)
        if c.num_layers in aux_layers:
            streams[c.num_layers] = x  # id L: the last layer's output before the final norm
        hidden = rms_norm(x, self.norm.weight, self.norm.variance_epsilon)  # [B, q, H]
        if fused and getattr(self.lm_head, "bias", None) is None:  # the final norm in the head's kernel
            rows = x.index_select(1, logits_rows) if logits_rows is not None else (x[:, -1:] if last_logits_only else x)
            logits = norm_linear(rows, self.norm, self.lm_head.weight, None)  # [B, R, V]
        elif logits_rows is not None:
            logits = linear(self.lm_head, hidden.index_select(1, logits_rows))  # [B, R, V]
        else:
            logits = linear(self.lm_head, hidden[:, -1:] if last_logits_only else hidden)
        return TargetOutput(logits=logits, hidden=hidden, aux=torch.cat([streams[i] for i in aux_layers], dim=-1) if aux_layers else None)


def _activation(name: str):
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN

    return ACT2FN[name]
