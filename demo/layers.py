"""Functional Llama-family pieces shared by the target forward and the drafters.

Plain eager PyTorch over weights owned elsewhere (transformers' modules or a drafter's nn.Linear),
attention through demo.kernels.attend (Triton kernels on a GPU when demo.kernels.runtime asks): no graphs, no compilation, no hidden
allocation beyond what each op returns. Shapes use
B = batch, q = query tokens, S = cache slots, H = hidden, nh / nkv = heads, hd = head dim.
"""

from __future__ import annotations

import math
import time
import warnings

import torch
import torch.nn.functional as F

from demo.kernels.attend import attend


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 and cast back, in transformers' LlamaRMSNorm order."""
    # x: [..., H]; weight: [H]
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies for default, linear and llama3 RoPE (used for drafters' own configs)."""
    # returns [hd // 2] float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


def rope_tables(inv_freq: torch.Tensor, max_positions: int, scale: float, dtype, device):
    """cos/sin tables for positions [0, max_positions), each [S, hd], in transformers' layout."""
    pos = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = torch.outer(pos, inv_freq.to(device=device, dtype=torch.float32))  # [S, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [S, hd]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x by per-token angles (rotate-half convention)."""
    # x: [B, n, q, hd]; cos, sin: [B, 1, q, hd]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class StackedLinear:
    """Linears that read the same input, run as one matmul (one kernel where there were two or
    three: a decoding step of a small model is launch-bound). Their weights (and biases) are
    stacked into one tensor and each module's parameters become views of it: nothing is stored
    twice, and the modules (transformers, training, state_dict) still see their own weights, which
    in-place updates (load_state_dict, an optimizer) keep writing through to the stack. Linears that
    cannot be stacked (other module types, mixed dtypes or devices) run one by one.

    On a CPU in fp32 every call multiplies by a copy of the weight made on the first call and again
    after the weight changes: in oneDNN's prepacked layout for a wide output (gate/up, the head); for
    the rest (q/k/v, o_proj, down) prepacked or transposed to [in, out], whichever multiplies a
    verification's rows quicker on this CPU (``several_row_layout``: CPUs disagree). PyTorch's plain
    fp32 multiply grows with the row count on a few cores, and even for 1 row the copies are the
    quicker (docs/PERFORMANCE.md, "CPU")."""

    def __init__(self, linears: tuple):
        self.linears = linears
        self.sizes = [m.out_features if hasattr(m, "out_features") else m.weight.shape[0] for m in linears]
        self.weight = self.bias = None
        self._packed, self._packed_from = None, None  # the oneDNN copy, and (storage, version) it was made from
        if not _stackable(linears):
            return
        if len(linears) == 1:  # nothing to stack: the module's own parameters
            self.weight, self.bias = linears[0].weight, linears[0].bias
            return
        with torch.inference_mode(False), torch.no_grad():
            weight = torch.cat([m.weight for m in linears])  # [sum(out), in]
            bias = None
            if any(m.bias is not None for m in linears):
                bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.weight.shape[0])
                                  for m in linears])  # [sum(out)]
        self.rehome(weight, bias)

    def rehome(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Read this stack from `weight` ([sum(out), in], holding its values) and `bias` from now on:
        each module's parameters become views of them (made here, and by demo.kernels.persistent,
        which stacks every layer's stack into one tensor)."""
        self.weight, self.bias = weight, bias
        self._packed, self._packed_from = None, None
        with torch.inference_mode(False), torch.no_grad():
            for m, w in zip(self.linears, weight.split(self.sizes)):
                m.weight.data = w
            if bias is not None:
                for m, b in zip(self.linears, bias.split(self.sizes)):
                    if m.bias is not None:
                        m.bias.data = b

    def current(self) -> bool:
        """Whether every module still reads its weights from this stack (a ``.to()`` into another dtype
        or device, or a reassigned ``.data``, gives a module new storage: the stack is then stale)."""
        if self.weight is None:
            return not _stackable(self.linears)
        at = 0  # the row each module's slice starts at
        for m, n in zip(self.linears, self.sizes):
            views = [(m.weight, self.weight)] + ([(m.bias, self.bias)] if m.bias is not None else [])
            for p, stack in views:
                start = stack.data_ptr() + at * stack.stride(0) * stack.element_size()
                if p.device != stack.device or p.dtype != stack.dtype or p.data_ptr() != start:
                    return False
            at += n
        return True

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x: [..., in] -> one [..., out_i] per linear."""
        if self.weight is None:
            return tuple(m(x) for m in self.linears)
        w = self.weight
        if w.dtype == torch.float32 and w.device.type == "cpu" and ONEDNN and not torch.compiler.is_compiling():
            kind, copy = self._prepacked()
            if kind == "int8":
                y = torch.ops.quantized.linear_dynamic(x, copy, True)
                y = y if self.bias is None else y + self.bias
            elif kind == "onednn":
                y = torch.ops.mkldnn._linear_pointwise(x, copy, self.bias, "none", [], "")
            else:
                y = torch.matmul(x, copy)
                y = y if self.bias is None else y + self.bias
        else:
            y = F.linear(x, self.weight, self.bias)
        return y.split(self.sizes, dim=-1) if len(self.sizes) > 1 else (y,)

    def _prepacked(self) -> tuple[str, torch.Tensor]:
        """The weight's copy: ("onednn", the weight in oneDNN's layout, packed for PREPACK_ROWS rows,
        serving any count) for a wide output, else ("transposed", [in, out] contiguous, which MKL
        multiplies fastest there)."""
        # in-place updates bump the version; a weight made under torch.inference_mode keeps none
        int8 = all(getattr(m, INT8_WEIGHTS, False) for m in self.linears)
        source = (self.weight.data_ptr(), 0 if self.weight.is_inference() else self.weight._version, int8)
        if self._packed_from != source:
            w = self.weight.detach()
            with torch.no_grad():
                if int8:
                    self._packed = ("int8", int8_packed(w))
                elif several_row_layout(w) == "onednn":
                    self._packed = ("onednn", torch.ops.mkldnn._reorder_linear_weight(w, PREPACK_ROWS))
                else:
                    self._packed = ("transposed", w.t().contiguous())
            self._packed_from = source
        return self._packed


PREPACK_ROWS = 4  # the row count a CPU weight is prepacked for (a chain of 3's verification)
# A Linear carrying this attribute (True) multiplies through an int8 copy of its weight on a CPU
# (use_int8_weights): for a drafter's own weights only, whose drafts never change the output
INT8_WEIGHTS = "_speclens_int8_weights"
TRANSPOSED_MAX_RATIO = 2  # out / in up to which a CPU weight's copy may be transposed rather than prepacked
ONEDNN_MARGIN = 0.8  # a narrow weight is prepacked only where oneDNN takes under this share of the transposed time
ONEDNN = torch.backends.mkldnn.is_available()
_LAYOUTS: dict[tuple[int, int], str] = {}  # (out, in) -> the copy several_row_layout measured quicker


def several_row_layout(w: torch.Tensor) -> str:
    """The copy a [out, in] fp32 CPU weight is multiplied through: "onednn" (prepacked) for a wide
    output, where it wins on every CPU; for a narrower one whichever multiplies PREPACK_ROWS rows
    quicker here, timed once a shape a process (on some CPUs the transposed copy wins for q/k/v,
    o_proj and down, on others oneDNN by several times; docs/PERFORMANCE.md, "CPU"). oneDNN must win by a margin, so that two processes seldom pick apart on
    close timings (the two copies may round a product differently: a pick is a process's, and
    target-only and speculation in one process share it)."""
    if w.shape[0] > TRANSPOSED_MAX_RATIO * w.shape[1]:
        return "onednn"
    key = (w.shape[0], w.shape[1])
    if key not in _LAYOUTS:
        # its own generator: a probe must not move the global stream a seeded sampler draws from
        x = torch.randn(PREPACK_ROWS, w.shape[1], generator=torch.Generator().manual_seed(0))
        packed, transposed = torch.ops.mkldnn._reorder_linear_weight(w, PREPACK_ROWS), w.t().contiguous()
        onednn = _seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
        plain = _seconds(lambda: torch.matmul(x, transposed))
        _LAYOUTS[key] = "onednn" if onednn < ONEDNN_MARGIN * plain else "transposed"
    return _LAYOUTS[key]


def use_int8_weights(linears, on: bool = True) -> None:
    """Have these Linears multiply through int8 copies of their weights on a CPU (per output row
    scaled, the activations quantized per call: fbgemm's dynamic linear), or again in fp32."""
    for m in linears:
        setattr(m, INT8_WEIGHTS, on)


def int8_packed(w: torch.Tensor):
    """A [out, in] fp32 weight as fbgemm's packed int8 weight, one scale per output row."""
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
    with warnings.catch_warnings():  # PyTorch marks its quantized tensors deprecated; int8_available() checks they exist
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.int64), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None)


def int8_available() -> bool:
    """Whether this PyTorch multiplies int8 weights on a CPU (fbgemm's dynamic linear)."""
    engines = set(torch.backends.quantized.supported_engines)
    ops = torch.ops.quantized
    return bool({"x86", "fbgemm"} & engines) and hasattr(ops, "linear_dynamic") and hasattr(ops, "linear_prepack") \
        and hasattr(torch, "quantize_per_channel")


def _seconds(fn, repeats: int = 20) -> float:
    """The quickest of `repeats` timed calls of fn, after three untimed ones."""
    for _ in range(3):
        fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def linear(module, x: torch.Tensor) -> torch.Tensor:
    """x through one Linear-like module; on a CPU through its fp32 copy (StackedLinear)."""
    if torch.compiler.is_compiling() or x.device.type != "cpu":
        return module(x)
    return stacked(module)(x)[0]


def _stackable(linears) -> bool:
    ws = [getattr(m, "weight", None) for m in linears]
    if not all(isinstance(m, torch.nn.Linear) and w is not None and w.dim() == 2 for m, w in zip(linears, ws)):
        return False
    first = ws[0]
    return (first.is_floating_point() and first.device.type != "meta"
            and all(w.dtype == first.dtype and w.device == first.device and w.shape[1] == first.shape[1] for w in ws))


def stacked(*linears) -> StackedLinear:
    """The StackedLinear of these modules: made on first use, made again once stale. Under
    torch.compile the one made before (``stack_weights`` of the target and drafters) is read as it is."""
    owner, key = linears[0], f"_speclens_stack{len(linears)}"  # a module alone and in a group: two stacks
    if torch.compiler.is_compiling():
        return getattr(owner, key)
    stack = owner.__dict__.get(key)
    if stack is None or stack.linears != linears or not stack.current():
        stack = StackedLinear(linears)
        owner.__dict__[key] = stack
    return stack


def causal_slot_mask(positions: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Query at position p sees cache slots 0..p; stale slots beyond p (rejected drafts) are hidden."""
    # positions: [B, q] -> mask [B, 1, q, S] bool
    slots = torch.arange(num_slots, device=positions.device)
    return (slots[None, None, None, :] <= positions[:, None, :, None])


def attention(
    x: torch.Tensor,  # [B, q, Din]
    qkv: StackedLinear,  # the q, k and v projections (Linear-like modules), as one matmul
    o_proj,  # Linear-like module
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,  # [B, 1, q, hd]
    sin: torch.Tensor,  # [B, 1, q, hd]
    k_cache: torch.Tensor,  # [B, nkv, S, hd], written in place at `slots`
    v_cache: torch.Tensor,  # [B, nkv, S, hd]
    slots: torch.Tensor,  # [B, q] int64: the cache slots of these tokens (their positions, except in a tree)
    mask: torch.Tensor,  # [B, 1, q, S] bool
    q_norm=None,  # Qwen3-style per-head RMSNorm modules (weight, variance_epsilon)
    k_norm=None,
    triton: bool = True,  # demo.kernels.attend's kernels where they run (False: SDPA)
) -> torch.Tensor:  # [B, q, H]
    """Self-attention over a static cache: write this step's K/V at their slots, attend to all
    slots the mask allows, project out. RoPE comes in as cos/sin of the tokens' positions."""
    qs, ks, vs = qkv(x)
    heads = attend_heads(qs, ks, vs, num_heads, num_kv_heads, head_dim, cos, sin, k_cache, v_cache, slots, mask,
                         q_norm, k_norm, triton)
    return linear(o_proj, heads)


def attend_heads(qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, mask: torch.Tensor, q_norm=None, k_norm=None, triton: bool = True) -> torch.Tensor:
    """The attention between the projections (``attention``'s middle): qs [B, q, nh*hd], ks and vs
    [B, q, nkv*hd] -> [B, q, nh*hd], the rest as ``attention`` takes them."""
    B, q, _ = qs.shape
    qs = qs.reshape(B, q, num_heads, head_dim)
    ks = ks.reshape(B, q, num_kv_heads, head_dim)
    vs = vs.reshape(B, q, num_kv_heads, head_dim)
    if q_norm is not None:
        qs = rms_norm(qs, q_norm.weight, q_norm.variance_epsilon)
        ks = rms_norm(ks, k_norm.weight, k_norm.variance_epsilon)
    qs = apply_rope(qs.transpose(1, 2), cos, sin)  # [B, nh, q, hd]
    ks = apply_rope(ks.transpose(1, 2), cos, sin)  # [B, nkv, q, hd]
    vs = vs.transpose(1, 2)
    index = slots[:, None, :, None].expand(B, num_kv_heads, q, head_dim)
    k_cache.scatter_(2, index, ks)
    v_cache.scatter_(2, index, vs)
    out = attend(qs, k_cache, v_cache, mask, triton)  # [B, nh, q, hd]
    return out.transpose(1, 2).reshape(B, q, num_heads * head_dim)


def swiglu_mlp(x: torch.Tensor, gate_up: StackedLinear, down_proj, act=F.silu) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), gate and up as one matmul; x: [B, q, H] -> [B, q, H]."""
    gate, up = gate_up(x)
    return linear(down_proj, act(gate) * up)
