"""What the EAGLE and EAGLE-3 drafters share: their config, attention/MLP modules with the published
parameter names, and the drafter contract the engine relies on.

Drafter contract (duck-typed, vLLM's proposer verbs):
- ``feature``: which target output it reads, "hidden" (final normed, EAGLE) or "aux" (EAGLE-3).
- ``project(features) -> hidden``: turn target features into drafter-width input, once per step,
  at the start of the step's propose phase (EAGLE-3's fc; identity for EAGLE).
- ``setup_cache(capacity)``: its own one-layer static KV cache and RoPE tables, sized to the
  target's context (not the drafter's max_position_embeddings, vLLM #48894).
- ``forward(tokens, positions, hidden, slots=None, mask=None, logits=True, attend=None) -> (logits,
  hidden_out)``: one pass of the draft layer; row i pairs token x[i+1] with feature h[i] at position
  i. K/V go to the cache at `slots` (default: the positions) and attention follows `mask` (default:
  causal) over the first `attend` cache slots (default: all); a draft tree passes its own mask
  (demo/tree.py). ``logits=False`` returns None for them (the prefill only fills the cache).
- ``stack_weights()``: stack its q/k/v and gate/up projections before the engine compiles or
  captures (demo.layers.stacked).
- ``select(logits) -> target ids``: greedy draft token, mapped from the draft vocabulary (d2t);
  ``to_target(draft_ids)`` maps any draft ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from demo.kv_cache import KVCache
from demo.layers import (INT8_WEIGHTS, causal_slot_mask, int8_available, linear, rms_norm, rope_inv_freq,
                         rope_tables, stacked, use_int8_weights)


# The drafter architectures, by the names their published checkpoints and the drafter methods
# (demo/methods.py) give them: EAGLE-1 reads the target's final hidden state through the target's
# lm_head; EAGLE-3 fuses aux layers' residual streams and has a head of its own.
EAGLE1, EAGLE3 = "eagle", "eagle3"


@dataclass
class DrafterConfig:
    """A drafter's architecture, whatever layout it was read from."""

    method: str  # the architecture: EAGLE1 or EAGLE3 (the drafter methods of demo/methods.py, by the same names)
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int  # the target's vocabulary
    head_dim: int = 0  # 0: hidden_size // num_heads
    draft_vocab_size: int = 0  # 0: vocab_size (no d2t mapping)
    target_hidden_size: int = 0  # 0: hidden_size
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # published EAGLE-3 Llama heads omit rope_theta: 10000, not the target's
    rope_scaling: dict | None = None
    aux_layer_ids: tuple[int, ...] | None = None  # EAGLE-3 feature layers; None: the target's default
    fc_bias: bool = False  # EAGLE-1's `bias`
    attention_bias: bool = False
    norm_before_residual: bool = False  # speculators' EAGLE-3 variant: residual is hidden_norm(h)
    own_embedding: bool = False  # checkpoint carries embed_tokens (needed when target_hidden_size differs)
    own_lm_head: bool = True  # EAGLE-3 carries its lm_head; False: the target's, over the full vocabulary
    warnings: list[str] = field(default_factory=list)  # shown to the user after loading

    def __post_init__(self):
        if self.method not in (EAGLE1, EAGLE3):
            raise ValueError(f"unknown drafter method {self.method!r} ({EAGLE1} or {EAGLE3})")
        self.head_dim = self.head_dim or self.hidden_size // self.num_heads
        self.draft_vocab_size = self.draft_vocab_size or self.vocab_size
        self.target_hidden_size = self.target_hidden_size or self.hidden_size
        if self.aux_layer_ids is not None:
            self.aux_layer_ids = tuple(int(i) for i in self.aux_layer_ids)
        if self.method == EAGLE1:
            self.own_lm_head = False  # EAGLE-1 always reads through the target's lm_head
        elif not self.own_lm_head and self.draft_vocab_size != self.vocab_size:
            raise ValueError(f"an EAGLE-3 head sharing the target's lm_head drafts over the full vocabulary "
                             f"({self.vocab_size} tokens), not a draft vocabulary of {self.draft_vocab_size}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("warnings")
        return d

    @classmethod
    def for_target(cls, method: str, target_config, **overrides) -> "DrafterConfig":
        """A drafter shaped like one layer of the target (what this project trains)."""
        c = target_config
        base = dict(method=method, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                    num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    vocab_size=c.vocab_size, rms_norm_eps=c.rms_norm_eps)
        base.update(overrides)
        return cls(**base)


class RMSNorm(nn.Module):
    """Weight-only RMSNorm with transformers' attribute names (weight, variance_epsilon)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.variance_epsilon)


class DraftAttention(nn.Module):
    """q/k/v/o projections named as in the published checkpoints; input width `in_size`."""

    def __init__(self, cfg: DrafterConfig, in_size: int):
        super().__init__()
        nh, nkv, hd, bias = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(in_size, nh * hd, bias=bias)
        self.k_proj = nn.Linear(in_size, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(in_size, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)


class DraftMLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        """Separate matmuls, which autograd follows (training); the engine's forward stacks them."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


INT8_MIN_BYTES = 8 << 20  # the fp32 bytes from which a head, or a layer's projections together, go int8 (use_int8)


def drafter_int8(target_dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a drafter's own head and decoder layer multiply in int8 beside a target of
    `target_dtype` on `device`: on a CPU whose drafter computes in fp32 (``drafter_dtype``), where a
    draft step is bound by reading its weights and fbgemm's int8 multiply reads a quarter of the
    bytes (docs/PERFORMANCE.md, "On a CPU")."""
    return torch.device(device).type == "cpu" and drafter_dtype(target_dtype, device) == torch.float32 \
        and int8_available()


def drafter_dtype(target_dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """What a drafter computes in beside a target of `target_dtype` on `device`. Beside an fp32
    target on a CPU a draft step is memory-bound: fp32 with its head and layer read through int8
    copies (``drafter_int8``) where this PyTorch multiplies int8, the quicker draft even on a CPU that
    multiplies bf16 natively (docs/PERFORMANCE.md, "On a CPU"); else bf16 on a CPU that multiplies
    it natively (AVX-512 BF16 or AMX), half the bytes; else the target's. Drafts never change the
    output, only how many are accepted."""
    if torch.device(device).type == "cpu" and target_dtype == torch.float32:
        if int8_available():
            return torch.float32
        native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or \
            getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        if native:
            return torch.bfloat16
    return target_dtype


def in_dtype(module: nn.Linear, dtype: torch.dtype) -> nn.Linear:
    """`module` itself if its weight is in `dtype`, else a frozen copy in `dtype` (registered nowhere)."""
    if module.weight.dtype == dtype:
        return module
    copy = nn.Linear(1, 1, bias=False, device="meta")
    copy.in_features, copy.out_features = module.in_features, module.out_features
    copy.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
    copy.weight._speclens_copy = True  # the drafter's own copy, not the target's module
    copy.bias = None if module.bias is None else nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
    return copy


class HeadView(nn.Linear):
    """A Linear over another Linear's weight tensor, not a copy: a drafter's own module for the
    target's head, so that marking it for int8 (``use_int8_weights``) quantizes the drafter's reads
    only. Registered nowhere (``source`` is kept outside the module tree)."""

    def __init__(self, source: nn.Linear):
        nn.Module.__init__(self)
        self.in_features, self.out_features = source.in_features, source.out_features
        self.weight, self.bias = source.weight, source.bias
        object.__setattr__(self, "source", source)


class DrafterBase(nn.Module):
    """Cache, RoPE and shared-weight plumbing common to both drafters."""

    feature = "hidden"

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.own_embedding else None
        # borrowed from the target: set with object.__setattr__ so that nn.Module does not register
        # them, and the drafter's parameters(), state_dict() and .to() never include the target's
        object.__setattr__(self, "_target_embed", None)
        object.__setattr__(self, "logits_dtype", None)  # the target's dtype once shared: logits come back in it
        self.triton = True  # attention through demo.kernels.attend's kernels where they run; the target's choice once shared
        self.cache: KVCache | None = None
        self.cos = self.sin = None
        self.int8_head = False  # use_int8: its own head multiplies in int8 on a CPU

    @property
    def dtype(self) -> torch.dtype:
        """What the drafter computes in: its weights' dtype (Engine's drafter_dtype; the target's by
        default), read off ``fc``, which every drafter has (a plain attribute torch.compile traces)."""
        return self.fc.weight.dtype

    def share_target(self, target) -> None:
        """Borrow the target's embedding (and, for EAGLE-1 and a shared-head EAGLE-3, its lm_head)
        without copying; a drafter in another dtype than the target's (a CPU's bf16 drafter beside an
        fp32 target) drafts through a copy of the head in its own dtype. Call after moving the
        drafter to its device and dtype."""
        object.__setattr__(self, "_target_embed", target.embed)
        object.__setattr__(self, "logits_dtype", target.dtype)
        self.triton = target.kernels != "torch"
        if not self.cfg.own_lm_head:
            self._borrow_head(target.lm_head)

    def _borrow_head(self, head: nn.Linear) -> None:
        object.__setattr__(self, "lm_head", in_dtype(head, self.dtype))
        self._mark_head()

    def own_head(self) -> nn.Linear | None:
        """The head if it is the drafter's own module (its lm_head, a shared-head EAGLE-3's hot rows,
        a copy in another dtype, a view of the target's head's weight), None where it is the
        target's module itself."""
        head = self.lm_head
        if not isinstance(head, nn.Linear):
            return None
        registered = any(m is head for m in self.modules())
        own = registered or getattr(head.weight, "_speclens_copy", False) or isinstance(head, HeadView)
        return head if own else None

    def use_int8(self, on: bool = True, layer: bool = True) -> None:
        """Multiply the drafter's own head, and with `layer` its decoder layer's projections (q/k/v,
        o, gate/up, down), through int8 copies on a CPU (demo.layers: a scale per output row, the
        input quantized per call), each from INT8_MIN_BYTES of fp32 weights. A draft step there is
        bound by reading its weights, the head and the layer's MLP most of them, and drafts never
        change the output: quantizing the layer cost the bundled EAGLE-3 no measurable acceptance
        (docs/PERFORMANCE.md, "On a CPU"). ``fc`` stays in fp32: its inputs, the target's features,
        carry outliers that one activation scale a call cannot keep."""
        self.int8_head = on
        self._mark_head()
        linears = self.layer_linears()
        large = sum(m.weight.numel() for m in linears) * 4 >= INT8_MIN_BYTES  # a tiny layer is no draft step's cost
        use_int8_weights(linears, on and layer and large)

    def layer_linears(self) -> list[nn.Linear]:
        """The decoder layer's projections: every registered Linear but ``fc`` and a registered head."""
        head = self._modules.get("lm_head")
        return [m for m in self.modules() if isinstance(m, nn.Linear) and m is not self.fc and m is not head]

    @property
    def layer_in_int8(self) -> bool:
        """Whether drafting multiplies the decoder layer's projections through int8 copies now (use_int8)."""
        linears = self.layer_linears()
        return bool(linears) and all(getattr(m, INT8_WEIGHTS, False) for m in linears)

    @property
    def head_in_int8(self) -> bool:
        """Whether drafting reads the head through its int8 copy now (use_int8, a head large enough)."""
        head = self.own_head()
        return head is not None and getattr(head, INT8_WEIGHTS, False)

    def _mark_head(self) -> None:
        head = self.lm_head
        if not isinstance(head, nn.Linear):
            return
        int8 = self.int8_head and head.weight.numel() * 4 >= INT8_MIN_BYTES  # a small head is no draft step's cost
        if int8 and self.own_head() is None:
            # the target's own module (EAGLE-1's head): draft through a view of its weight, which
            # only the drafter reads in int8; the target's module and its multiplies stay as they are
            object.__setattr__(self, "lm_head", HeadView(head))
        elif isinstance(head, HeadView) and not int8:
            object.__setattr__(self, "lm_head", head.source)  # no second fp32 copy of the target's head
        head = self.own_head()
        if head is not None:
            use_int8_weights([head], int8)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings in the drafter's dtype (the target's table may be in another)."""
        return (self.embed_tokens or self._target_embed)(tokens).to(self.dtype)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The draft head over x [B, q, H], in the target's dtype once shared."""
        logits = linear(self.lm_head, x)
        return logits if self.logits_dtype is None else logits.to(self.logits_dtype)

    def setup_cache(self, capacity: int, batch: int = 1) -> KVCache:
        """One-layer KV cache and RoPE tables for `capacity` positions; idempotent."""
        p = next(self.parameters())
        cfg = self.cfg
        if self.cache is None or self.cache.capacity < capacity or self.cache.k.shape[1] != batch:
            self.cache = KVCache(1, batch, cfg.num_kv_heads, capacity, cfg.head_dim, p.dtype, p.device)
            inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
            self.cos, self.sin = rope_tables(inv_freq, capacity, 1.0, p.dtype, p.device)
        return self.cache

    def rope_slots_mask(self, positions: torch.Tensor, slots: torch.Tensor | None, mask: torch.Tensor | None,
                        attend: int | None = None):
        """cos, sin [B, 1, q, hd] of the positions [B, q]; the cache slots (default: the positions),
        the attention mask [B, 1, q, S] (default: causal over the slots, see causal_slot_mask) and the
        cache's K and V [B, nkv, S, hd], S = `attend` (the first slots only; default: all), as
        views whose writes reach the cache."""
        if slots is None:
            slots = positions
        S = self.cache.capacity if attend is None else attend
        mask = causal_slot_mask(positions, S) if mask is None else mask[..., :S]
        k_cache, v_cache = self.cache.layer(0)
        return (self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1), slots, mask,
                k_cache[:, :, :S], v_cache[:, :, :S])

    def stack_weights(self) -> None:
        """Stack the draft layer's q/k/v and gate/up weights (demo.layers.StackedLinear), or restack
        them if a weight was replaced since; the engine calls it before capturing or compiling."""
        for module in self.modules():
            if isinstance(module, DraftAttention):
                stacked(module.q_proj, module.k_proj, module.v_proj)
            elif isinstance(module, DraftMLP):
                stacked(module.gate_proj, module.up_proj)

    def select(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy draft ids in the target's vocabulary; logits [..., Vd] -> [...] int64."""
        return self.to_target(logits.argmax(-1))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids, same shape (identity without a draft vocabulary)."""
        return draft_ids

    @property
    def drafting_vocab(self) -> int:
        """How many target tokens a draft can be: the draft vocabulary (EAGLE-3: or its limit_vocab subset)."""
        return self.cfg.draft_vocab_size
