"""Drafter checkpoints: read every published EAGLE / EAGLE-3 layout, check it against the target
before use, and save this project's drafters so that vLLM and SGLang (>= 0.5.2) load them (EAGLE-3:
vLLM >= 0.11; EAGLE-1, with the zero fc.bias SGLang needs: vLLM >= 0.25); where one checkpoint
cannot serve a library, ``python -m demo.export_drafter`` writes its own.

Layouts read (``architectures`` in config.json first, weight names second):

- EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B): ``LlamaForCausalLM``, ``num_hidden_layers`` 1,
  ``bias``; ``fc`` [H, 2H] (+ ``fc.bias``), ``layers.0.*`` without input norm, no final norm, no
  lm_head; an ``embed_tokens`` copy of the target's is skipped (the target's is used). SpecLens
  saves ``["LlamaForCausalLMEagle", "LlamaForCausalLM"]``: SGLang takes the first name it knows
  (its EAGLE-1 class), vLLM prefixes each with ``Eagle`` and takes the first it knows
  (``EagleLlamaForCausalLM``). ``fc.bias`` is read when present, whatever ``bias`` says: SGLang's
  EAGLE-1 fc always has a bias, and vLLM and SGLang both read ``bias`` as the attention's biases.
- EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): ``LlamaForCausalLM`` + ``draft_vocab_size``, no
  ``rope_theta`` (so 10000, not the target's); ``fc`` [H, 3H], ``midlayer.*``, ``norm``,
  ``lm_head`` [Vd, H], ``d2t`` [Vd] offsets, ``t2d`` [V] mask.
- SpecForge / vLLM (``LlamaForCausalLMEagle3``): EAGLE-3 names, maybe under ``model.``, single or
  sharded safetensors, ``eagle_config.eagle_aux_hidden_state_layer_ids`` and ``target_hidden_size``
  (then ``fc`` is [H, 3*Ht] and the checkpoint carries its own ``embed_tokens``).
- Shared-head EAGLE-3 (nvidia/gpt-oss-120b-Eagle3): no ``lm_head``, no ``d2t``, ``draft_vocab_size``
  null or absent; it drafts over the full vocabulary through the target's lm_head. SGLang shares
  the target's head only when the key is there and null; vLLM 0.11.0 when the head's shape is the
  target's, 0.11.1+ when the checkpoint has none (0.10.2 reads the key with no default).
- speculators (``Eagle3Speculator``): layer sizes in ``transformer_layer_config``, EAGLE-3 extras at
  the top level, ``layers.0.*`` for ``midlayer.*`` (mapped as vLLM's ``load_weights`` does), and
  ``norm_before_residual`` true unless it says otherwise (vLLM's default for this format).

A shared-head EAGLE-3 may come with ``hot_tokens.json`` (this project's trainer writes it): the
most frequent target tokens of its training answers. On a CPU, where reading the target's whole
lm_head for every draft step costs more than the head itself, the drafter projects onto those rows
only (FR-Spec); on a GPU it drafts over the full vocabulary. ``load_drafter(..., hot_tokens="on"
| "off")`` overrides the choice.

Aux layer ids: a DrafterConfig holds "the residual stream entering target layer i" (HF
``hidden_states[i]``, index 0 the embedding output), and a config.json's ids are read by the
convention of the tool that writes that field (AUX_ID_FIELDS). With no ids, every engine and
trainer uses (2, L//2, L-3) in that sense.

Every refusal is a ``DrafterLoadError`` with a one-line message that names the field and both values.
Weights come from safetensors, or from ``.bin`` through ``torch.load(weights_only=True)``; remote
code is never run.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import torch

from demo.drafter_common import DrafterBase, DrafterConfig
from demo.drafters import DRAFTER_CLASSES
from demo.layers import rope_inv_freq
from demo.methods import dtype_label
from demo.models.hub import HUB_ID, HubError, HubRepo, cached_snapshot, gigabytes

__all__ = ["DrafterLoadError", "load_drafter", "save_drafter", "read_drafter", "read_drafter_config",
           "read_aux_layer_ids", "write_hot_tokens"]

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator",)
EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle", "EagleLlamaForCausalLM")  # SGLang's EAGLE-1 class, vLLM's
# Published heads reuse the target family's class name; EAGLE-1 or EAGLE-3 is told by the weights.
EITHER_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
SUPPORTED_ARCHITECTURES = EAGLE3_ARCHITECTURES + SPECULATORS_ARCHITECTURES + EAGLE_ARCHITECTURES + EITHER_ARCHITECTURES
SHARD_NAME = "model-{:05d}-of-{:05d}.safetensors"
# EAGLE-1 as saved: SGLang takes the first name it knows, vLLM the first it knows once prefixed with
# "Eagle" (EagleLlamaForCausalLMEagle is no class; EagleLlamaForCausalLM is)
SAVED_EAGLE_ARCHITECTURES = ["LlamaForCausalLMEagle", "LlamaForCausalLM"]
SAVED_MAX_POSITIONS = 8192  # written for other engines, which size the drafter's RoPE by it (vLLM #48894)
HOT_TOKENS_FILE = "hot_tokens.json"  # a shared-head EAGLE-3's most frequent target tokens (read by SpecLens only)

# Where a config.json names EAGLE-3 aux layers, who writes that field, and what its ids mean, as an
# offset to "the stream entering layer i" (HF hidden_states[i]); the first field present wins.
# - speclens.aux_layer_ids: this project's saver, exact; null (the target default) yields to the others.
# - eagle_aux_hidden_state_layer_ids (top level): speculators writes it (scripts/launch_vllm.py: default
#   [2, L//2, L-3], "the layer id directly") and vLLM >= 0.11.1 reads it first, capturing the stream
#   entering layer i (llama.py: `if idx in aux_hidden_state_layers` before running layer idx).
# - eagle_config.eagle_aux_hidden_state_layer_ids: SpecForge writes it (default [1, L//2-1, L-4],
#   "capture layer id L == hidden_states[L+1]") and SGLang reads it, capturing the stream entering
#   layer i + 1 (llama.py set_eagle3_layers_to_capture: `val + 1`): the output of layer i.
AUX_ID_FIELDS = (
    ("speclens.aux_layer_ids", "SpecLens", 0),
    ("eagle_aux_hidden_state_layer_ids", "vLLM / speculators", 0),
    ("eagle_config.eagle_aux_hidden_state_layer_ids", "SGLang / SpecForge", 1),
)


class DrafterLoadError(ValueError):
    """A drafter checkpoint was refused; the one-line message names the field and both values."""


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# The kinds of value a config.json field may hold: (how a message says it, the test).
POSITIVE_INT = ("a positive integer", lambda v: _whole(v) and v > 0)
POSITIVE_NUMBER = ("a finite positive number",
                   lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0)
FLAG = ("true or false", lambda v: isinstance(v, bool))
TEXT = ("a string", lambda v: isinstance(v, str))
OBJECT = ("an object", lambda v: isinstance(v, dict))
CLASS_NAMES = ("a list of class names", lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v))
LAYER_IDS = ("a list of layer ids (integers >= 0)",
             lambda v: isinstance(v, list) and all(_whole(i) and i >= 0 for i in v))
ROPE_FIELDS = {"rope_theta": POSITIVE_NUMBER, "rope_type": TEXT, "type": TEXT, "factor": POSITIVE_NUMBER,
               "low_freq_factor": POSITIVE_NUMBER, "high_freq_factor": POSITIVE_NUMBER,
               "original_max_position_embeddings": POSITIVE_INT}
# Every config.json field the loader reads, checked before any is used; a dotted name is a field of
# an object, and absent or null means the default. A speculators config's transformer_layer_config
# is checked against the same table.
CONFIG_FIELDS = {
    "architectures": CLASS_NAMES, "speculators_model_type": TEXT, "transformer_layer_config": OBJECT,
    "hidden_size": POSITIVE_INT, "intermediate_size": POSITIVE_INT, "num_attention_heads": POSITIVE_INT,
    "num_key_value_heads": POSITIVE_INT, "head_dim": POSITIVE_INT, "num_hidden_layers": POSITIVE_INT,
    "vocab_size": POSITIVE_INT, "draft_vocab_size": POSITIVE_INT, "target_hidden_size": POSITIVE_INT,
    "rms_norm_eps": POSITIVE_NUMBER, "rope_theta": POSITIVE_NUMBER, "rope_scaling": OBJECT, "rope_parameters": OBJECT,
    **{f"{scope}.{name}": kind for scope in ("rope_scaling", "rope_parameters") for name, kind in ROPE_FIELDS.items()},
    "hidden_act": TEXT, "attention_bias": FLAG, "bias": FLAG, "norm_before_fc": FLAG, "norm_before_residual": FLAG,
    "eagle_aux_hidden_state_layer_ids": LAYER_IDS, "eagle_config": OBJECT,
    "eagle_config.eagle_aux_hidden_state_layer_ids": LAYER_IDS, "eagle_config.use_aux_hidden_state": FLAG,
    "speclens": OBJECT, "speclens.aux_layer_ids": LAYER_IDS, "speclens.own_embedding": FLAG,
}


def check_config_fields(config) -> None:
    """Refuse a config.json that is not an object, or any field of CONFIG_FIELDS holding another
    kind of value, in one line naming the field and the value."""
    if not isinstance(config, dict):
        raise DrafterLoadError(f"config.json: holds a JSON {_json_kind(config)}, not an object of fields")
    scopes = [("", config)]
    if isinstance(config.get("transformer_layer_config"), dict):
        scopes.append(("transformer_layer_config.", config["transformer_layer_config"]))
    for prefix, scope in scopes:
        for name, (what, ok) in CONFIG_FIELDS.items():  # an object comes before its fields
            value = scope
            for part in name.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is not None and not ok(value):
                raise DrafterLoadError(f"{prefix}{name}: config.json has {_shown(value)}, not {what}")


def _json_kind(value) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------- reading
@dataclass
class _Plan:
    """How one checkpoint's tensors become one drafter module's state."""

    cfg: DrafterConfig
    rename: dict[str, str]  # checkpoint name -> module name, for every tensor that is loaded
    shared_embedding: str | None = None  # checkpoint name of an embed_tokens replaced by the target's
    identity_vocab: dict[str, str] = field(default_factory=dict)  # d2t/t2d of a full-vocabulary head: dropped
    derive_t2d: bool = False  # t2d absent: made from d2t (drafting never reads it)


def read_drafter_config(config: dict, weights: Mapping[str, Sequence[int]], *,
                        method: str | None = None) -> DrafterConfig:
    """The DrafterConfig a config.json and its weight shapes (name -> shape) describe; refuses
    unknown architectures, missing or unexpected weights and shapes that contradict the config.
    Without a target, absent EAGLE-3 aux layer ids stay None (load_drafter fills in the default)."""
    return _plan(config, {k: tuple(v) for k, v in weights.items()}, method).cfg


def _plan(config: dict, shapes: dict[str, tuple[int, ...]], method: str | None, target=None) -> _Plan:
    """Layout -> DrafterConfig -> checks against the target -> checkpoint names mapped to the module's."""
    check_config_fields(config)
    arch = _architecture(config)
    speculators = arch in SPECULATORS_ARCHITECTURES or config.get("speculators_model_type") == "eagle3"
    found = _detect_method(arch, speculators, config, shapes)
    if method is not None and method != found:
        raise DrafterLoadError(f"method: {method!r} was asked for, but the checkpoint is an {found!r} drafter")
    names = _canonical_names(shapes, found)
    canon = {new: shapes[old] for old, new in names.items()}  # module name -> shape
    cfg = _drafter_config(config, canon, found, speculators, target)
    if target is not None:
        _check_target(cfg, config, canon, target)
    plan = _Plan(cfg, rename=names)
    _match_weights(plan, canon)
    return plan


def _drafter_config(config: dict, canon: dict, method: str, speculators: bool, target) -> DrafterConfig:
    """Sizes, RoPE and EAGLE-3 extras from config.json (speculators: sizes in its layer config)."""
    layer_cfg = config
    if speculators:
        layer_cfg = config.get("transformer_layer_config")
        if not isinstance(layer_cfg, dict):
            raise DrafterLoadError("transformer_layer_config: missing from a speculators config.json "
                                   "(an Eagle3Speculator checkpoint needs it)")
    H = _required(layer_cfg, "hidden_size")
    heads = _required(layer_cfg, "num_attention_heads")
    kv_heads = layer_cfg.get("num_key_value_heads") or heads
    if not layer_cfg.get("head_dim") and H % heads:
        raise DrafterLoadError(f"num_attention_heads: {heads} does not divide hidden_size {H}, and config.json "
                               f"gives no head_dim")
    if heads % kv_heads:
        raise DrafterLoadError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}")
    theta, scaling = _rope(layer_cfg)
    _check_unsupported(config, layer_cfg, canon, method, speculators)
    speclens = config.get("speclens") or {}  # written by save_drafter
    vocab = layer_cfg.get("vocab_size") or _rows(canon, "t2d") or _rows(canon, "embed_tokens.weight")
    if not vocab:
        raise DrafterLoadError("vocab_size: missing from config.json and not implied by any weight")
    target_hidden = int(config.get("target_hidden_size") or H)
    cfg = dict(
        method=method, hidden_size=H, intermediate_size=int(_required(layer_cfg, "intermediate_size")),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=layer_cfg.get("head_dim") or 0, vocab_size=int(vocab),
        rms_norm_eps=float(layer_cfg.get("rms_norm_eps") or 1e-6),  # LlamaConfig's default, as other engines read it
        rope_theta=theta, rope_scaling=scaling,
        attention_bias=bool(layer_cfg.get("attention_bias")) or _has_bias(canon, method),
        own_embedding="embed_tokens.weight" in canon and (bool(speclens.get("own_embedding")) or target_hidden != H),
    )
    if method == "eagle":  # the EAGLE repo's `bias` is the fc's; SGLang's layout carries fc.bias without it
        return DrafterConfig(**cfg, fc_bias=bool(layer_cfg.get("bias", False)) or "fc.bias" in canon)
    named = read_aux_layer_ids(config)
    aux, warnings = named.ids, list(named.warnings)
    if named.field is None and target is not None:
        aux = target.config.default_aux_layers()
        warnings.append(f"the checkpoint names no aux layers (eagle_aux_hidden_state_layer_ids): using the target "
                        f"default {list(aux)}; if acceptance is near zero, the head was trained on other layers")
    own_head = "lm_head.weight" in canon
    draft_vocab = config.get("draft_vocab_size") or _rows(canon, "lm_head.weight") or vocab
    if not own_head and int(draft_vocab) != int(vocab):
        raise DrafterLoadError(f"lm_head.weight: missing; draft_vocab_size {draft_vocab} needs the head's own lm_head "
                               f"(only a full-vocabulary head, {vocab} tokens, drafts through the target's)")
    # vLLM reads a speculators config without norm_before_residual as true
    norm_before_residual = config.get("norm_before_residual")
    if norm_before_residual is None:
        norm_before_residual = speculators
    return DrafterConfig(**cfg, draft_vocab_size=int(draft_vocab), own_lm_head=own_head,
                         target_hidden_size=target_hidden, aux_layer_ids=None if aux is None else tuple(aux),
                         norm_before_residual=bool(norm_before_residual), warnings=warnings)


@dataclass(frozen=True)
class AuxLayerIds:
    """EAGLE-3 aux layers as a config.json names them."""

    ids: tuple[int, ...] | None  # the streams entering these target layers; None: the target default
    field: str | None = None  # the config field read (None: no field names any)
    written: tuple[int, ...] | None = None  # the ids as that field holds them
    writer: str = ""  # whose convention that field follows (AUX_ID_FIELDS)
    warnings: tuple[str, ...] = ()


def read_aux_layer_ids(config: dict) -> AuxLayerIds:
    """The aux layers a config.json names, each field read by the convention of the tool that writes
    it (AUX_ID_FIELDS), the first one present winning; an empty list counts as absent, as in vLLM, and
    our own null ("the target default") only where no engine's field names layers."""
    found = []
    for name, writer, offset in AUX_ID_FIELDS:
        scope, _, key = name.rpartition(".")
        holder = config.get(scope) if scope else config
        if isinstance(holder, dict) and holder.get(key):
            found.append((name, writer, tuple(holder[key]), offset))
    if not found:
        said_default = isinstance(config.get("speclens"), dict) and "aux_layer_ids" in config["speclens"]
        return AuxLayerIds(None, "speclens.aux_layer_ids" if said_default else None)
    name, writer, written, offset = found[0]
    ids = tuple(i + offset for i in written)
    warnings = [f"{name} {list(written)} ({writer}) and {other} {list(other_written)} ({other_writer}) name "
                f"different target layers; SpecLens reads the first"
                for other, other_writer, other_written, other_offset in found[1:]
                if tuple(i + other_offset for i in other_written) != ids]
    return AuxLayerIds(ids, name, written, writer, tuple(warnings))


def _check_unsupported(config: dict, layer_cfg: dict, canon: dict, method: str, speculators: bool) -> None:
    """Variants no SpecLens drafter computes: refused rather than run wrong."""
    hidden_act = layer_cfg.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise DrafterLoadError(f"hidden_act: config.json has {hidden_act!r}, SpecLens drafters use 'silu'")
    if config.get("norm_before_fc"):
        raise DrafterLoadError("norm_before_fc: config.json has true, SpecLens drafters have no norm before fc (false)")
    if (config.get("eagle_config") or {}).get("use_aux_hidden_state") is False:
        raise DrafterLoadError("eagle_config.use_aux_hidden_state: config.json has false, SpecLens EAGLE-3 "
                               "drafters read aux hidden states (true)")
    layer_ids = {int(m.group(1)) for n in canon if (m := re.match(r"layers\.(\d+)\.", n))}
    if any(n.startswith("midlayer.") for n in canon):
        layer_ids.add(0)
    if len(layer_ids) > 1:
        raise DrafterLoadError(f"num_hidden_layers: the checkpoint has {len(layer_ids)} decoder layers, "
                               f"SpecLens drafters have 1")
    declared = layer_cfg.get("num_hidden_layers")
    if not speculators and declared is not None and declared != 1:  # speculators may carry the verifier's count
        raise DrafterLoadError(f"num_hidden_layers: config.json has {declared}, SpecLens drafters have 1")


def _match_weights(plan: _Plan, canon: dict) -> None:
    """Every tensor the module needs, with the shape the config implies, and nothing else."""
    cfg, names = plan.cfg, plan.rename
    what = "an EAGLE-1" if cfg.method == "eagle" else "an EAGLE-3"
    expected = _expected_shapes(cfg)
    _match_vocab_tensors(plan, canon, expected)
    if "embed_tokens.weight" in canon and "embed_tokens.weight" not in expected:
        _check_shape("embed_tokens.weight", canon["embed_tokens.weight"], (cfg.vocab_size, cfg.hidden_size))
        plan.shared_embedding = _original(names, "embed_tokens.weight")
    missing = sorted(set(expected) - set(canon) - ({"t2d"} if plan.derive_t2d else set()))
    if "embed_tokens.weight" in missing:
        raise DrafterLoadError(f"embed_tokens.weight: missing; a drafter of hidden_size {cfg.hidden_size} reading "
                               f"target features of width {cfg.target_hidden_size} needs its own embedding")
    if missing:
        raise DrafterLoadError(f"missing weights: {_some(missing)} (the checkpoint has {len(canon)} tensors; "
                               f"config.json describes {what} drafter that needs {len(expected)})")
    ignored = {n for n in canon if _ignorable(n)} | {"embed_tokens.weight"} | set(plan.identity_vocab)
    unexpected = sorted(set(canon) - set(expected) - ignored)
    if unexpected:
        raise DrafterLoadError(f"unexpected weights: {_some([_original(names, n) for n in unexpected])} "
                               f"(not part of {what} drafter as config.json describes it)")
    for name, shape in expected.items():
        if name in canon:
            _check_shape(_original(names, name), canon[name], shape, cfg)
    plan.rename = {old: new for old, new in names.items() if new in expected}


def _some(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _architecture(config: dict) -> str:
    archs = config.get("architectures") or []
    if not archs:
        raise DrafterLoadError(f"architectures: missing from config.json "
                               f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    known = [a for a in archs if a in SUPPORTED_ARCHITECTURES]  # the first one known, as SGLang and vLLM take it
    if not known:
        shown = repr(archs[0]) if len(archs) == 1 else repr(archs)
        raise DrafterLoadError(f"architectures: config.json has {shown}, not a drafter SpecLens reads "
                               f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    return known[0]


def _detect_method(arch: str, speculators: bool, config: dict, shapes: dict) -> str:
    """EAGLE-1 or EAGLE-3: by architecture where it says, else by the weights (fc width, names)."""
    if speculators or arch in EAGLE3_ARCHITECTURES:
        return "eagle3"
    if arch in EAGLE_ARCHITECTURES:
        return "eagle"
    stripped = {_strip_prefix(n) for n in shapes}
    H = int(config.get("hidden_size") or 0)
    fc_in = shapes.get("fc.weight", shapes.get("model.fc.weight", (0, 0)))[-1]
    eagle3_signs = [sign for sign, present in (
        ("midlayer.* weights", any(n.startswith("midlayer.") for n in stripped)),
        ("draft_vocab_size", "draft_vocab_size" in config),
        ("d2t", "d2t" in stripped),
        ("lm_head.weight", "lm_head.weight" in stripped),
        (f"fc input width {fc_in} = 3 x {int(config.get('target_hidden_size') or H)}",
         H > 0 and fc_in == 3 * int(config.get("target_hidden_size") or H)),
    ) if present]
    eagle = H > 0 and fc_in == 2 * H and any(n.startswith("layers.0.") for n in stripped)
    if eagle3_signs and not eagle:
        return "eagle3"
    if eagle and not eagle3_signs:
        return "eagle"
    if eagle:
        verb = "mark" if len(eagle3_signs) > 1 else "marks"
        raise DrafterLoadError(f"fc.weight: input width {fc_in} = 2 x hidden_size {H} marks an EAGLE-1 drafter, but "
                               f"{', '.join(eagle3_signs)} {verb} an EAGLE-3 one")
    raise DrafterLoadError(f"fc.weight: input width {fc_in} with hidden_size {H} fits neither an EAGLE-1 drafter "
                           f"(2 x {H}, layers.0.*) nor an EAGLE-3 one (3 x {H}, midlayer.*)")


def _strip_prefix(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def _canonical_names(shapes: dict, method: str) -> dict[str, str]:
    """Checkpoint name -> our module's name: no ``model.`` prefix; EAGLE-3's layer is ``midlayer``."""
    out, seen = {}, {}
    for old in shapes:
        new = _strip_prefix(old)
        if method == "eagle3" and new.startswith("layers.0."):
            new = "midlayer." + new[len("layers.0."):]
        if new in seen:
            raise DrafterLoadError(f"weights: {seen[new]!r} and {old!r} both name {new!r}")
        seen[new] = old
        out[old] = new
    return out


def _original(names: dict[str, str], canonical: str) -> str:
    return next((old for old, new in names.items() if new == canonical), canonical)


def _required(cfg: dict, key: str):
    if cfg.get(key) is None:
        raise DrafterLoadError(f"{key}: missing from config.json")
    return cfg[key]


def _rows(shapes: dict, name: str) -> int:
    return shapes[name][0] if name in shapes else 0


def _has_bias(shapes: dict, method: str) -> bool:
    layer = "layers.0." if method == "eagle" else "midlayer."
    return f"{layer}self_attn.q_proj.bias" in shapes


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """rope_theta (absent: 10000, LlamaConfig's default) and a linear/llama3 scaling dict or None."""
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"} or None
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    try:
        rope_inv_freq(2, theta, scaling)
    except (ValueError, KeyError, TypeError) as e:
        raise DrafterLoadError(f"rope_scaling: config.json has type {kind!r}, SpecLens drafters support "
                               f"default, linear and llama3 ({e})") from None
    return theta, dict(scaling)


def _check_target(cfg: DrafterConfig, config: dict, canon: dict, target) -> None:
    """The drafter must fit the target's features, vocabulary and layers."""
    t = target.config
    if cfg.method == "eagle" and cfg.hidden_size != t.hidden_size:
        raise DrafterLoadError(f"hidden_size: drafter {cfg.hidden_size}, target {t.hidden_size} (an EAGLE-1 drafter "
                               f"reads the target's final hidden state and its lm_head)")
    if cfg.method == "eagle3" and cfg.target_hidden_size != t.hidden_size:
        key = "target_hidden_size" if config.get("target_hidden_size") else "hidden_size"
        raise DrafterLoadError(f"{key}: drafter expects target features of width {cfg.target_hidden_size}, "
                               f"target hidden_size is {t.hidden_size}")
    if "t2d" in canon and canon["t2d"][0] != t.vocab_size:
        raise DrafterLoadError(f"t2d: length {canon['t2d'][0]}, target vocabulary {t.vocab_size} tokens")
    if cfg.vocab_size != t.vocab_size:
        raise DrafterLoadError(f"vocab_size: drafter {cfg.vocab_size}, target {t.vocab_size}")
    if cfg.aux_layer_ids is not None:
        ids = list(cfg.aux_layer_ids)
        named = read_aux_layer_ids(config)
        where = named.field or "eagle_aux_hidden_state_layer_ids"
        said = f"{list(named.written)}" if named.written is not None else f"{ids}"
        if named.written is not None and list(named.written) != ids:
            said += f" ({named.writer}: the outputs of those layers, i.e. the streams entering layers {ids})"
        bad = [i for i in ids if not 0 <= i <= t.num_layers]
        if bad:
            raise DrafterLoadError(f"{where}: {said} has {bad[0]}, outside the target's layers 0..{t.num_layers}")
        if len(ids) != 3:
            raise DrafterLoadError(f"{where}: {len(ids)} ids {said}, an EAGLE-3 fc reads 3")


def _expected_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        module = DRAFTER_CLASSES[cfg.method](cfg)
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _match_vocab_tensors(plan: _Plan, canon: dict, expected: dict) -> None:
    """A full-vocabulary EAGLE-3 head has no d2t/t2d (an all-zero d2t is dropped after reading); a
    reduced one needs d2t, and t2d is made from d2t when absent."""
    cfg = plan.cfg
    if cfg.method != "eagle3":
        return
    if "d2t" not in expected:
        plan.identity_vocab = {n: _original(plan.rename, n) for n in ("d2t", "t2d") if n in canon}
        for name in plan.identity_vocab:
            _check_shape(name, canon[name], (cfg.vocab_size,))
    elif "d2t" in canon and "t2d" not in canon:
        plan.derive_t2d = True
    elif "d2t" not in canon:
        raise DrafterLoadError(f"d2t: missing; a draft vocabulary of {cfg.draft_vocab_size} tokens needs it to map "
                               f"into the target's {cfg.vocab_size}")


def _check_shape(name: str, got: tuple, want: tuple, cfg: DrafterConfig | None = None) -> None:
    if tuple(got) != tuple(want):
        sizes = ""
        if cfg is not None:
            sizes = (f" (hidden_size {cfg.hidden_size}, intermediate_size {cfg.intermediate_size}, heads "
                     f"{cfg.num_heads}/{cfg.num_kv_heads} x {cfg.head_dim}, draft_vocab_size {cfg.draft_vocab_size}, "
                     f"target_hidden_size {cfg.target_hidden_size})")
        raise DrafterLoadError(f"{name}: shape {list(got)} in the checkpoint, {list(want)} from config.json{sizes}")


def _ignorable(name: str) -> bool:
    """Tensors some trainers save that no drafter reads: RoPE tables, speculators' frozen verifier copies."""
    return name.endswith("rotary_emb.inv_freq") or name.startswith("verifier_")


# ---------------------------------------------------------------------------------------- files
# Weights a hub drafter may have, by the target's device kind (the target's own limit is
# demo/models/loading.py's TARGET_MAX_HUB_BYTES): beside a CPU target of at most 2 GB a drafter is a few
# hundred MB; an 8B target's EAGLE-3 head with its own copy of a 152k-token embedding is about 2 GB
# in bf16. Other device kinds take the CPU's.
DRAFTER_MAX_HUB_BYTES = {"cpu": 500_000_000, "cuda": 4_000_000_000}
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def resolve_drafter_dir(spec: str | os.PathLike, max_bytes: int = DRAFTER_MAX_HUB_BYTES["cuda"]) -> Path:
    """A local directory as it is; a hub id (owner/name) through fetch_hub_drafter."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    text = str(spec)
    if path.exists() or not re.fullmatch(HUB_ID, text):  # a file reads as a missing path: nothing else is told
        raise DrafterLoadError(f"drafter: {text!r} is neither a local directory nor a hub id (owner/name)")
    return fetch_hub_drafter(text, max_bytes)


def fetch_hub_drafter(repo_id: str, max_bytes: int) -> Path:
    """Fetch a hub drafter into the hub cache, looking before each download: config.json first, its
    fields checked; then the weight files its layout needs (an index's shards, or one file), refused
    together over `max_bytes` before any is fetched; then those files and hot_tokens.json, nothing
    else. Returns the snapshot directory they share."""
    try:
        repo = HubRepo.open(repo_id)
    except HubError as e:
        cached = cached_snapshot(repo_id)  # offline: a drafter fetched before loads from the hub cache
        if cached is not None:
            return cached
        raise DrafterLoadError(f"drafter: {repo_id!r} {e}, or pass a local directory") from None
    where = repr(repo_id)
    try:
        config = repo.fetch("config.json")
        check_config_fields(_read_json(config, where))
        files = weight_files(set(repo.sizes), repo.read_json, where)
        total = repo.total_bytes(files)
        if total > max_bytes:
            raise DrafterLoadError(f"drafter: {where} has {gigabytes(total)} of weights in {len(files)} file(s), "
                                   f"over the {gigabytes(max_bytes)} a drafter may have on this device")
        for name in files:
            repo.fetch(name, max_bytes=None)
        if HOT_TOKENS_FILE in repo.sizes:
            repo.fetch(HOT_TOKENS_FILE)
    except HubError as e:
        raise DrafterLoadError(str(e)) from None
    return config.parent


def weight_files(names: set[str], read_json, where: str) -> list[str]:
    """The weight files a checkpoint loads, chosen by file name: an index's shards, else
    model.safetensors or pytorch_model.bin, else every *.safetensors (or else every *.bin).
    `read_json(name)` reads an index; `where` names the checkpoint in messages."""
    for index in WEIGHT_INDEXES:
        if index in names:
            body = read_json(index)
            weight_map = body.get("weight_map") if isinstance(body, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise DrafterLoadError(f"{index}: has no weight_map of file names (the file is corrupted)")
            files = sorted(set(weight_map.values()))
            for f in files:
                if f not in names:
                    raise DrafterLoadError(f"{index}: names shard {f}, which is missing from {where}")
            return files
    for single in WEIGHT_FILES:
        if single in names:
            return [single]
    files = sorted(n for n in names if n.endswith(".safetensors")) or sorted(n for n in names if n.endswith(".bin"))
    if not files:
        raise DrafterLoadError(f"weights: no *.safetensors or *.bin file in {where}")
    return files


def _read_json(path: Path, where: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DrafterLoadError(f"{path.name}: missing from {where}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DrafterLoadError(f"{path.name}: not valid JSON ({_first_line(e)}); the file is corrupted or "
                               f"truncated, download it again") from None
    except OSError as e:
        raise DrafterLoadError(f"{path.name}: cannot be read from {where} ({type(e).__name__})") from None


def _weight_files(d: Path, where: str) -> list[Path]:
    names = {p.name for p in d.iterdir() if p.is_file()}
    return [d / f for f in weight_files(names, lambda name: _read_json(d / name, where), where)]


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        else:
            tensors = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors header errors, truncated zip archives, refused pickles
        if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
            raise DrafterLoadError(_refused_pickle(path, e)) from None
        raise DrafterLoadError(f"{path.name}: cannot be read ({type(e).__name__}: {_first_line(e)}); the file is "
                               f"corrupted or truncated, download it again") from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise DrafterLoadError(f"{path.name}: holds {type(tensors).__name__}, not a flat name -> tensor state dict")
    return tensors


def _refused_pickle(path: Path, e: Exception) -> str:
    """Why torch.load(weights_only=True) refused a pickle, and what to do instead."""
    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    what = f"it calls {found.group(1)}" if found else "it holds objects other than tensors"
    return (f"{path.name}: refused, because loading it could run code ({what}, which torch.load(weights_only=True) "
            f"does not allow); use a safetensors checkpoint, or, if you trust its source, convert it with "
            f"safetensors.torch.save_file(torch.load(path, weights_only=False), 'model.safetensors')")


def read_checkpoint(d: Path, where: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """A drafter directory's config.json (its fields checked first) and every tensor of its weight
    files (CPU, as stored). `where` names the checkpoint in messages (default: the directory)."""
    where = where or repr(str(d))
    config = _read_json(d / "config.json", where)
    check_config_fields(config)
    tensors: dict[str, torch.Tensor] = {}
    for f in _weight_files(d, where):
        part = _read_tensors(f)
        dup = set(part) & set(tensors)
        if dup:
            raise DrafterLoadError(f"weights: {sorted(dup)[0]!r} appears in two files ({f.name} and another)")
        tensors.update(part)
    return config, tensors


def read_drafter(d: str | os.PathLike) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """A local drafter directory's DrafterConfig and tensors (CPU, as stored) under the drafter
    module's names, without a target (for converting checkpoints): an embed_tokens copy of the
    target's and the d2t/t2d of a full vocabulary are left out, as load_drafter leaves them out."""
    path = Path(d)
    config, tensors = read_checkpoint(path)
    plan = _plan(config, {k: tuple(v.shape) for k, v in tensors.items()}, None)
    return plan.cfg, {new: tensors[old] for old, new in plan.rename.items()}


def _first_line(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else type(e).__name__


# ---------------------------------------------------------------------------------------- loading
def load_drafter(spec: str | os.PathLike, target, *, method: str | None = None,
                 hot_tokens: str = "auto") -> DrafterBase:
    """Load a drafter for `target` from a local directory or a hub id, in the target's dtype and on
    its device, sharing its embedding (and the lm_head of EAGLE-1 and shared-head EAGLE-3).
    Everything that would not fit the target is refused here, before any generation;
    `drafter.cfg.warnings` says what was assumed.
    hot_tokens: project a shared-head EAGLE-3 onto the rows of its hot_tokens.json only: "auto" on a
    CPU target when the file is there, "on" always (the file must be there), "off" never."""
    where = repr(str(spec))  # messages name what the user gave, never the hub cache's path
    d = resolve_drafter_dir(spec, DRAFTER_MAX_HUB_BYTES.get(target.device.type, DRAFTER_MAX_HUB_BYTES["cpu"]))
    config, tensors = read_checkpoint(d, where)
    plan = _plan(config, {k: tuple(v.shape) for k, v in tensors.items()}, method, target)
    cfg = plan.cfg
    state = {}
    for old, new in plan.rename.items():
        t = tensors[old]
        if new == "d2t":
            t = t.to(torch.int64)
        elif new == "t2d":
            t = t.to(torch.bool)
        elif t.is_floating_point():
            t = t.to(target.dtype)
        else:
            raise DrafterLoadError(f"{old}: dtype {t.dtype} in the checkpoint, a floating-point weight was expected")
        state[new] = t
    _check_vocab_values(plan, tensors, state)
    if plan.derive_t2d:
        state["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        state["t2d"][torch.arange(cfg.draft_vocab_size) + state["d2t"]] = True
    if plan.shared_embedding is not None:
        note = _embedding_note(tensors[plan.shared_embedding], target.embed.weight)
        if note:
            cfg.warnings.append(note)
    with torch.device("meta"):
        drafter = DRAFTER_CLASSES[cfg.method](cfg)
    drafter.load_state_dict(state, strict=True, assign=True)
    drafter.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    drafter.share_target(target)
    if hot_tokens not in ("auto", "on", "off"):
        raise ValueError(f"hot_tokens: {hot_tokens!r}, not 'auto', 'on' or 'off'")
    hot = _read_hot_tokens(d, cfg, where) if hot_tokens != "off" else None
    if hot_tokens == "on" and hot is None:
        shared = cfg.method == "eagle3" and not cfg.own_lm_head
        raise DrafterLoadError(f"{HOT_TOKENS_FILE}: missing from {where}" if shared else
                               f"{HOT_TOKENS_FILE}: only an EAGLE-3 head drafting through the target's lm_head reads "
                               f"it; this {cfg.method} head drafts over {cfg.draft_vocab_size} tokens")
    if hot is not None and (hot_tokens == "on" or target.device.type == "cpu"):
        drafter.limit_vocab(hot)
    return drafter


def _read_hot_tokens(d: Path, cfg: DrafterConfig, where: str) -> torch.Tensor | None:
    """The ids of a shared-head EAGLE-3's hot_tokens.json ([N] int64), or None without one."""
    path = d / HOT_TOKENS_FILE
    if cfg.method != "eagle3" or cfg.own_lm_head or not path.exists():
        return None
    body = _read_json(path, where)
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not ids or not all(_whole(i) and 0 <= i < cfg.vocab_size for i in ids):
        raise DrafterLoadError(f"{HOT_TOKENS_FILE}: 'ids' must be a non-empty list of target ids in "
                               f"[0, {cfg.vocab_size}) (the file is corrupted)")
    return torch.tensor(ids, dtype=torch.int64)


def write_hot_tokens(out_dir: str | os.PathLike, ids, coverage: float, source: str) -> Path:
    """Write a shared-head EAGLE-3's hot tokens: target ids (sorted), the share of answer tokens
    they cover, and where they were counted."""
    path = Path(out_dir) / HOT_TOKENS_FILE
    body = {"ids": sorted(int(i) for i in ids), "coverage": round(float(coverage), 6), "source": source}
    path.write_text(json.dumps(body) + "\n")
    return path


def _check_vocab_values(plan: _Plan, tensors: dict, state: dict) -> None:
    """d2t must map every draft id into the target vocabulary; a full-vocabulary d2t must be zeros."""
    cfg = plan.cfg
    if "d2t" in plan.identity_vocab:
        t = tensors[plan.identity_vocab["d2t"]]
        if bool(t.ne(0).any()):
            first = int(t.ne(0).nonzero()[0, 0])
            raise DrafterLoadError(f"d2t: the draft vocabulary equals the target's ({cfg.vocab_size} tokens) but "
                                   f"d2t[{first}] is {int(t[first])}, not 0; a permuted full vocabulary is unsupported")
    if "d2t" in state:
        ids = torch.arange(cfg.draft_vocab_size) + state["d2t"]  # [Vd] target ids
        bad = ((ids < 0) | (ids >= cfg.vocab_size)).nonzero()
        if len(bad):
            i = int(bad[0, 0])
            raise DrafterLoadError(f"d2t: draft id {i} maps to target id {int(ids[i])}, outside the target "
                                   f"vocabulary [0, {cfg.vocab_size})")


def _embedding_note(ckpt: torch.Tensor, target_weight: torch.Tensor) -> str | None:
    """The checkpoint's embed_tokens is skipped for the target's; say so when they differ (a head
    trained for another target, or with a trained embedding), comparing up to 1024 spread rows."""
    rows = torch.linspace(0, ckpt.shape[0] - 1, min(ckpt.shape[0], 1024)).long()
    a = ckpt[rows].float()
    b = target_weight.detach()[rows.to(target_weight.device)].float().cpu()
    diff = float((a - b).abs().max())
    if diff <= 1e-2 * float(b.abs().max()) + 1e-6:
        return None
    return (f"embed_tokens.weight in the checkpoint differs from the target's embedding (max |diff| {diff:.3g}); "
            f"the target's is used: was this drafter trained for another target?")


# ---------------------------------------------------------------------------------------- saving
def save_drafter(drafter, out_dir: str | os.PathLike, max_shard_bytes: int = 9_500_000, *,
                 target_layers: int | None = None) -> Path:
    """Write `drafter` as config.json + safetensors (config_json says which fields each engine
    reads), sharded with ``model.safetensors.index.json`` so that every file stays within
    `max_shard_bytes` (a Hugging Face Space takes files under 10 MB without LFS). Tensors keep their
    dtype; loading is exact. An EAGLE-1 head gets a zero ``fc.bias`` when it has none (zero_fc_bias:
    SGLang would leave it random, vLLM >= 0.25 drops it); what one checkpoint cannot give every
    library is written by ``python -m demo.export_drafter``.

    target_layers: the target's layer count; aux ids equal to its default (2, L//2, L-3) are then
    saved as the default, which every engine reads alike, and written nowhere.
    """
    cfg = drafter.cfg
    if target_layers is not None and cfg.aux_layer_ids == (2, target_layers // 2, target_layers - 3):
        cfg = replace(cfg, aux_layer_ids=None, warnings=[])
    out = Path(out_dir)
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in drafter.state_dict().items()
               if not k.startswith("_target")}  # borrowed target modules are never saved
    if cfg.method == "eagle":
        zero_fc_bias(tensors)
    dtype = next(t.dtype for k, t in tensors.items() if t.is_floating_point())
    write_weights(tensors, out, max_shard_bytes)
    (out / "config.json").write_text(json.dumps(config_json(cfg, dtype), indent=2) + "\n")
    return out


def zero_fc_bias(state: dict[str, torch.Tensor]) -> bool:
    """Give an EAGLE-1 state without ``fc.bias`` a zero one, which computes what none does; True
    when one was added. SGLang's EAGLE-1 fc always has a bias and leaves a missing one at its random
    initialisation; vLLM >= 0.25 drops an unexpected bias unread (vLLM <= 0.24 refuses it: the
    vLLM export drops it again)."""
    if "fc.bias" in state:
        return False
    w = state["fc.weight"]  # [H, 2H]
    state["fc.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    return True


def write_weights(tensors: dict[str, torch.Tensor], out_dir: str | os.PathLike,
                  max_shard_bytes: int = 9_500_000) -> list[Path]:
    """Write CPU `tensors` into `out_dir` as ``model.safetensors``, or as shards with
    ``model.safetensors.index.json`` when one file would pass `max_shard_bytes`; earlier weight
    files there are removed first. Returns the files written."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = _shard(tensors, max_shard_bytes)
    for stale in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        stale.unlink()
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        written = [out / "model.safetensors"]
    else:
        weight_map, written = {}, []
        for i, shard in enumerate(shards, 1):
            name = SHARD_NAME.format(i, len(shards))
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
            written.append(out / name)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for f in written:
        if f.stat().st_size > max_shard_bytes:
            raise RuntimeError(f"{f.name}: {f.stat().st_size} bytes written, over max_shard_bytes {max_shard_bytes}")
    return written


def _shard(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy packing in name order; each file's budget leaves room for its JSON header."""
    shards, current, used = [], {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        size = t.numel() * t.element_size() + len(name) + 96  # data + this tensor's header entry
        if size + 128 > max_bytes:
            hint = "save in bfloat16 or use" if t.element_size() > 2 else "use"
            raise ValueError(f"{name}: {t.numel() * t.element_size()} bytes ({t.dtype}, shape {list(t.shape)}) cannot "
                             f"fit in a shard of max_shard_bytes {max_bytes}; {hint} a smaller draft vocabulary")
        if current and used + size + 128 > max_bytes:
            shards.append(current)
            current, used = {}, 0
        current[name] = t
        used += size
    if current or not shards:
        shards.append(current)
    return shards


def config_json(cfg: DrafterConfig, dtype: torch.dtype) -> dict:
    """config.json for vLLM >= 0.11 and SGLang >= 0.5.2 (tests/models/test_interop.py replays how each
    reads it; tests/models/test_exports.py runs vLLM's own loader). EAGLE-1: both architecture names (see SAVED_EAGLE_ARCHITECTURES) and `bias` false,
    which both engines read as the attention's biases (an fc bias travels as the fc.bias tensor).
    EAGLE-3: `draft_vocab_size` always present, null for a head sharing the target's lm_head (SGLang
    reads the attribute without a default); aux ids only when not the target default, then in both
    engines' fields, each in its engine's convention (AUX_ID_FIELDS), and in ours."""
    common = {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "num_hidden_layers": 1, "vocab_size": cfg.vocab_size, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": SAVED_MAX_POSITIONS,
        "attention_bias": cfg.attention_bias, "tie_word_embeddings": False,
        "torch_dtype": dtype_label(dtype),
    }
    if cfg.rope_scaling:
        common["rope_scaling"] = dict(cfg.rope_scaling)
    speclens = {"method": cfg.method, "aux_layer_ids": list(cfg.aux_layer_ids) if cfg.aux_layer_ids else None,
                "own_embedding": cfg.own_embedding}
    if cfg.method == "eagle":
        return {"architectures": list(SAVED_EAGLE_ARCHITECTURES), **common, "bias": False, "speclens": speclens}
    config = {"architectures": ["LlamaForCausalLMEagle3"], **common,
              "draft_vocab_size": cfg.draft_vocab_size if cfg.own_lm_head else None}
    if cfg.target_hidden_size != cfg.hidden_size:
        config["target_hidden_size"] = cfg.target_hidden_size
    if cfg.norm_before_residual:
        config["norm_before_residual"] = True
    if cfg.aux_layer_ids is not None:
        ids = list(cfg.aux_layer_ids)
        config["eagle_aux_hidden_state_layer_ids"] = ids  # vLLM >= 0.11.1: the streams entering these layers
        if min(ids) >= 1:  # SGLang adds 1 to these; the embedding output (0) has no SGLang id
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}
    config["speclens"] = speclens
    return config
