"""vLLM and SGLang load SpecLens' drafters as shipped: each engine's config and weight-name rules,
re-implemented here from its source for the versions named, run on the two shipped heads; each
defect of the configs shipped before is a failing case; and SpecLens reads aux layer ids by the
convention of the tool that wrote them.

The rules are our own small re-implementations of code read (not copied) at these versions:

- vLLM 0.10.2, 0.11.0, 0.11.1, 0.12.0 (the PyPI wheels), and for EAGLE-1's fc.bias also 0.24.0 and
  0.25.0: llama_eagle.py LlamaModel.load_weights (<= 0.24.0: `params_dict[name]`, a KeyError for a
  name it lacks; 0.25.0: AutoWeightsLoader, whose load_weights in models/utils.py appends ".bias" to
  ignore_unexpected_suffixes, so an unexpected bias is dropped unread); vllm/config/speculative.py (0.10.2:
  vllm/config/__init__.py) SpeculativeConfig.__post_init__ (method detection, EAGLEConfig wrapping);
  vllm/transformers_utils/configs/eagle.py (architecture renaming); vllm/model_executor/models/
  registry.py resolve_model_cls (the first registered name); llama_eagle.py and llama_eagle3.py
  (__init__, load_weights); vllm/v1/spec_decode/eagle.py load_model (embedding and lm_head sharing);
  vllm/v1/worker/gpu_model_runner.py load_model and _get_eagle3_aux_layers_from_config (0.11.1+);
  models/llama.py (aux capture `if idx in aux_hidden_state_layers` before layer idx; the default
  (2, L//2, L-3)).
- SGLang 0.5.2, 0.5.3, 0.5.23 (the PyPI wheels): python/sglang/srt/models/registry.py
  (_normalize_archs, resolve_model_cls); models/llama_eagle.py (LlamaForCausalLMEagle: fc with
  bias); models/llama_eagle3.py (LlamaForCausalLMEagle3: `config.draft_vocab_size` read as an
  attribute, None -> load_lm_head_from_target); models/llama.py (load_weights skips unknown names;
  set_eagle3_layers_to_capture adds 1); model_executor/model_runner.py (0.5.23:
  model_runner_components/spec_aux_hidden_state.py: ids only from eagle_config);
  speculative/eagle_worker.py (set_embed_and_head / set_embed).
- Aux-id writers: SpecForge a6b6b02 specforge/algorithms/model_providers.py (default
  [1, L//2-1, L-4]) and tests/test_runtime/test_server_capture_gate.py ("capture layer id L
  (sglang convention) == hidden_states[L+1]"), SpecForge v0.1.0 3234e24 specforge/core/eagle3.py;
  speculators c05b95b scripts/launch_vllm.py (default [2, L//2, L-3]) and
  src/speculators/convert/dflash/converter.py ("speculators uses the layer id directly"); EAGLE
  cb7e084 eagle/model/modeling_llama_kv.py (captures before layers 2, L//2, L-3; writes no ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from safetensors import safe_open

from demo.models.checkpoints import (
    DrafterLoadError,
    load_drafter,
    read_aux_layer_ids,
    read_drafter,
    read_drafter_config,
    save_drafter,
)
from demo.models.export_drafter import ExportError, export_drafter, main
from demo.models.presets import bundled_drafter_dir
from tests.models.test_checkpoints import own_state, tokens_and_drafts
from tests.tiny import tiny_drafter, tiny_target

VLLM = ("0.10.2", "0.11.0", "0.11.1", "0.12.0")
VLLM_FC_BIAS = ("0.12.0", "0.24.0", "0.25.0")  # the last that refuses an EAGLE-1 fc.bias, the first that drops it
SGLANG = ("0.5.2", "0.5.3", "0.5.23")
EAGLE3_VERSIONS = [("vllm", v) for v in VLLM[1:]] + [("sglang", v) for v in SGLANG]  # vLLM 0.10.2: see below


@dataclass(frozen=True)
class TargetFacts:
    num_layers: int
    vocab_size: int
    hidden_size: int

    def default_aux(self) -> tuple[int, ...]:
        L = self.num_layers
        return (2, L // 2, L - 3)  # both engines' default, as streams entering these layers


SMOLLM2 = TargetFacts(num_layers=30, vocab_size=49152, hidden_size=576)  # SmolLM2-135M-Instruct's config.json


class EngineError(Exception):
    """What the engine raises at startup."""


@dataclass
class Built:
    """What one engine makes of a drafter checkpoint."""

    cls: str  # the class it builds
    params: set[str]  # that class's parameters
    loaded: set[str] = field(default_factory=set)  # filled from the checkpoint
    shared: set[str] = field(default_factory=set)  # replaced by the target's after loading
    aux: tuple[int, ...] | None = None  # EAGLE-3: the target layers whose entering streams feed fc
    dropped: set[str] = field(default_factory=set)  # checkpoint tensors read and thrown away, without a word

    @property
    def random(self) -> set[str]:
        """Parameters left at their initialisation: the head then drafts noise, and no engine says so."""
        return self.params - self.loaded - self.shared


def at_least(version: str, floor: str) -> bool:
    return tuple(map(int, version.split("."))) >= tuple(map(int, floor.split(".")))


STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
           (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))


def stacked(name: str) -> str:
    """Both engines fuse q/k/v and gate/up into one parameter each."""
    for part, fused in STACKED:
        if part in name:
            return name.replace(part, fused)
    return name


def layer_params(prefix: str, *, input_norm: bool = True, hidden_norm: bool = False) -> set[str]:
    names = {"self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
             "mlp.down_proj.weight", "post_attention_layernorm.weight"}
    names |= {"input_layernorm.weight"} if input_norm else set()  # EAGLE-1's layer 0 has none
    names |= {"hidden_norm.weight"} if hidden_norm else set()
    return {f"{prefix}.{n}" for n in names}


def check_fc(config: dict, weights: dict, wide: int):
    """fc.weight must be [H, wide * (target_hidden_size if the config has it, else H)]."""
    H = config["hidden_size"]
    want = (H, wide * config.get("target_hidden_size", H))
    if tuple(weights["fc.weight"]) != want:
        raise EngineError(f"fc.weight {list(weights['fc.weight'])}, the engine builds {list(want)}")


# ------------------------------------------------------------------------------ vLLM
VLLM_REGISTRY = {"LlamaForCausalLM": "LlamaForCausalLM", "EagleLlamaForCausalLM": "EagleLlamaForCausalLM",
                 "Eagle3LlamaForCausalLM": "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3": "Eagle3LlamaForCausalLM"}


def vllm_method(draft_path: str, method: str | None) -> str:
    """SpeculativeConfig: "eagle"/"eagle3" as given, else guessed from the draft's path."""
    if method in ("eagle", "eagle3"):
        return method
    if "eagle-" in draft_path.lower():
        return "eagle"
    if "eagle3" in draft_path.lower():
        return "eagle3"
    raise EngineError("Speculative decoding with draft model is not supported yet")


def vllm_architectures(archs: list[str], method: str) -> list[str]:
    """EAGLEConfig: every name renamed for the method, then the first registered one is built."""
    if method == "eagle":
        return [a if a.startswith("Eagle") else f"Eagle{a}" for a in archs]
    return [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in archs]


def vllm_load(config: dict, weights: dict, version: str, method: str, target: TargetFacts) -> Built:
    renamed = vllm_architectures(config["architectures"], method)
    cls = next((VLLM_REGISTRY[a] for a in renamed if a in VLLM_REGISTRY), None)
    if cls is None:
        raise EngineError(f"Model architectures {renamed} are not supported for now")
    if cls == "EagleLlamaForCausalLM":
        built = Built(cls, {"model.fc.weight", "model.embed_tokens.weight", "lm_head.weight"}
                      | layer_params("model.layers.0", input_norm=False))
        check_fc(config, weights, 2)
    elif cls == "Eagle3LlamaForCausalLM":
        draft_vocab = config["draft_vocab_size"] if "draft_vocab_size" in config else None
        if not at_least(version, "0.11.0"):  # `self.config.draft_vocab_size`, then ParallelLMHead(that, H)
            if "draft_vocab_size" not in config:
                raise EngineError("AttributeError: 'EAGLEConfig' object has no attribute 'draft_vocab_size'")
            if draft_vocab is None:
                raise EngineError("TypeError: ParallelLMHead(num_embeddings=None)")
        draft_vocab = draft_vocab or config["vocab_size"]  # 0.11.0+: absent or null -> vocab_size
        built = Built(cls, {"model.fc.weight", "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}
                      | layer_params("model.layers.0", hidden_norm=True)
                      | ({"draft_id_to_target_id"} if "d2t" in weights else set()))  # else zeros: the identity
        check_fc(config, weights, 3)
    else:
        raise EngineError(f"{cls} is no EAGLE drafter")
    for name in weights:
        if name == "t2d" or (cls == "EagleLlamaForCausalLM" and name.startswith("embed_tokens")
                             and not at_least(version, "0.11.1")):
            continue  # t2d is never read; 0.10.2-0.11.0 skip an EAGLE-1 embed_tokens copy at PP = 1
        mapped = "draft_id_to_target_id" if name == "d2t" else name if "lm_head" in name else "model." + name
        mapped = stacked(mapped.replace("midlayer.", "layers.0."))
        if mapped not in built.params:
            if mapped.endswith(".bias") and at_least(version, "0.25.0"):
                built.dropped.add(name)  # AutoWeightsLoader ignores unexpected biases
                continue
            raise EngineError(f"KeyError: {mapped!r} (load_weights looks every name up)")
        built.loaded.add(mapped)
    # eagle.py load_model: the embedding, then the lm_head
    has_embed = any(n.startswith("embed_tokens") for n in weights)
    if at_least(version, "0.11.1") and has_embed:
        pass  # kept as loaded (has_own_embed_tokens)
    else:  # 0.10.2-0.11.0: shared when its shape is the target's; 0.11.1+: when the checkpoint has none
        built.shared.add("model.embed_tokens.weight")
    if cls == "EagleLlamaForCausalLM":
        built.shared.add("lm_head.weight")  # EAGLE-1 always drafts through the target's
    elif at_least(version, "0.11.1"):
        if "lm_head.weight" not in weights:  # has_own_lm_head
            built.shared.add("lm_head.weight")
    elif at_least(version, "0.11.0") and (draft_vocab, config["hidden_size"]) == (target.vocab_size,
                                                                                   target.hidden_size):
        built.shared.add("lm_head.weight")  # 0.11.0: its lm_head's shape is the target's
    if cls == "Eagle3LlamaForCausalLM":
        ids = config.get("eagle_aux_hidden_state_layer_ids") if at_least(version, "0.11.1") else None
        built.aux = tuple(ids) if ids else target.default_aux()  # passed through: streams entering layers
    return built


# ------------------------------------------------------------------------------ SGLang
SGLANG_REGISTRY = ("LlamaForCausalLM", "LlamaForCausalLMEagle", "LlamaForCausalLMEagle3")


def sglang_load(config: dict, weights: dict, version: str, algorithm: str, target: TargetFacts) -> Built:
    known = [a for a in config["architectures"] if a in SGLANG_REGISTRY]  # in the config's order
    if not known:
        raise EngineError(f"Model architectures {config['architectures']} are not supported")
    cls = known[0]
    if cls == "LlamaForCausalLM":  # a plain Llama of num_hidden_layers layers
        built = Built(cls, {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
            p for i in range(config["num_hidden_layers"]) for p in layer_params(f"model.layers.{i}")})
        names = {n: stacked(n) for n in weights}  # loaded only where a name is one of its parameters
    elif cls == "LlamaForCausalLMEagle":
        built = Built(cls, {"model.fc.weight", "model.fc.bias", "model.embed_tokens.weight", "lm_head.weight"}
                      | layer_params("model.layers.0", input_norm=False))  # nn.Linear(2H, H): a bias, always
        check_fc(config, weights, 2)
        names = {n: stacked("model." + n) for n in weights if "lm_head" not in n}
    else:
        if config["num_hidden_layers"] != 1:
            raise EngineError("EAGLE3 currently only supports 1 layer")
        if not config.get("tie_word_embeddings", False) and "draft_vocab_size" not in config:
            raise EngineError("AttributeError: 'LlamaConfig' object has no attribute 'draft_vocab_size'")
        head_from_target = config.get("draft_vocab_size") is None
        built = Built(cls, {"model.fc.weight", "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}
                      | ({"model.fc.bias"} if config.get("bias") else set())
                      | layer_params("model.midlayer", hidden_norm=True))
        check_fc(config, weights, 3)
        names = {}
        for n in weights:
            if n in ("d2t", "t2d"):
                continue  # d2t becomes hot_token_id; t2d is never read
            n = stacked(n.replace("layers.0.", "midlayer.")) if at_least(version, "0.5.23") else stacked(n)
            names[n] = n if n in built.params else "model." + n
    built.loaded = {p for p in names.values() if p in built.params}  # the rest: skipped, with a warning at most
    # eagle_worker: EAGLE shares embedding and lm_head; EAGLE3 the embedding, and the head when it has none
    built.shared.add("model.embed_tokens.weight")
    if algorithm == "EAGLE" or (cls == "LlamaForCausalLMEagle3" and head_from_target):
        built.shared.add("lm_head.weight")
    if cls == "LlamaForCausalLMEagle3":
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        built.aux = tuple(i + 1 for i in ids) if ids is not None else target.default_aux()  # `val + 1`
    return built


def load_in(engine: str, version: str, config: dict, weights: dict, method: str,
            target: TargetFacts = SMOLLM2) -> Built:
    if engine == "vllm":
        return vllm_load(config, weights, version, method, target)
    return sglang_load(config, weights, version, {"eagle": "EAGLE", "eagle3": "EAGLE3"}[method], target)


# ------------------------------------------------------------------------------ checkpoints
def checkpoint(d: Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """config.json and every tensor's name -> shape, from the safetensors headers only."""
    weights = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            weights.update({k: tuple(s.get_slice(k).get_shape()) for k in s.keys()})
    return json.loads((d / "config.json").read_text()), weights


def shipped(method: str):
    return checkpoint(bundled_drafter_dir(method))


def speclens_aux(config: dict, target: TargetFacts = SMOLLM2) -> tuple[int, ...]:
    return read_aux_layer_ids(config).ids or target.default_aux()


# ------------------------------------------------------------------------------ the shipped EAGLE-3
@pytest.mark.parametrize("engine,version", EAGLE3_VERSIONS)
def test_shipped_eagle3_loads_whole_sharing_the_targets_embedding_and_lm_head(engine, version):
    config, weights = shipped("eagle3")
    built = load_in(engine, version, config, weights, "eagle3")
    assert built.cls in ("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3")
    assert built.random == set()  # every parameter loaded or shared
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= built.shared
    assert built.aux == speclens_aux(config) == (2, 15, 27)  # the layers SpecLens feeds it


def test_shipped_eagle3_config_says_null_draft_vocab_and_writes_no_aux_ids():
    config, _ = shipped("eagle3")
    assert "draft_vocab_size" in config and config["draft_vocab_size"] is None
    assert "eagle_config" not in config and "eagle_aux_hidden_state_layer_ids" not in config
    assert read_aux_layer_ids(config).ids is None  # the target default, (2, 15, 27) for SmolLM2-135M


def test_shipped_eagle3_cannot_run_in_vllm_0_10_2_either_way():
    """vLLM 0.10.2 reads draft_vocab_size with no default: absent or null, no shared-head EAGLE-3 runs."""
    config, weights = shipped("eagle3")
    with pytest.raises(EngineError, match="TypeError"):
        vllm_load(config, weights, "0.10.2", "eagle3", SMOLLM2)
    with pytest.raises(EngineError, match="AttributeError"):
        vllm_load({k: v for k, v in config.items() if k != "draft_vocab_size"}, weights, "0.10.2", "eagle3", SMOLLM2)


def test_old_eagle3_config_fails_sglangs_draft_vocab_rule_and_its_aux_ids_feed_sglang_other_layers():
    config, weights = shipped("eagle3")
    old = {k: v for k, v in config.items() if k != "draft_vocab_size"}  # as shipped before
    old["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 15, 27], "use_aux_hidden_state": True}
    for version in SGLANG:
        with pytest.raises(EngineError, match="draft_vocab_size"):
            sglang_load(old, weights, version, "EAGLE3", SMOLLM2)
    fixed_vocab = {**old, "draft_vocab_size": None}
    assert sglang_load(fixed_vocab, weights, "0.5.2", "EAGLE3", SMOLLM2).aux == (3, 16, 28)  # not (2, 15, 27)
    assert vllm_load(fixed_vocab, weights, "0.12.0", "eagle3", SMOLLM2).aux == (2, 15, 27)


def test_midlayer_and_speculators_layer_names_map_onto_each_engines_parameters():
    config, weights = shipped("eagle3")
    as_speculators = {k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
    for names in (weights, as_speculators):
        assert vllm_load(config, names, "0.12.0", "eagle3", SMOLLM2).random == set()
    assert sglang_load(config, as_speculators, "0.5.23", "EAGLE3", SMOLLM2).random == set()  # 0.5.23 maps layers.0
    assert "model.midlayer.self_attn.qkv_proj.weight" in sglang_load(config, weights, "0.5.2", "EAGLE3",
                                                                      SMOLLM2).loaded


# ------------------------------------------------------------------------------ the shipped EAGLE-1
@pytest.mark.parametrize("version", VLLM_FC_BIAS)
def test_shipped_eagle_zero_fc_bias_is_refused_by_vllm_up_to_0_24_and_dropped_from_0_25(version):
    """The shipped EAGLE-1 carries a zero fc.bias for SGLang; vLLM >= 0.25 drops it unread, which
    computes the same, and vLLM <= 0.24 refuses it at startup; the vLLM export loads whole in both."""
    config, weights = shipped("eagle")
    assert "fc.bias" in weights
    method = vllm_method("smollm2-135m-eagle", "eagle")
    if at_least(version, "0.25.0"):
        built = vllm_load(config, weights, version, method, SMOLLM2)
        assert built.random == set() and built.dropped == {"fc.bias"}
    else:
        with pytest.raises(EngineError, match="KeyError: 'model.fc.bias'"):
            vllm_load(config, weights, version, method, SMOLLM2)


@pytest.mark.parametrize("version", VLLM + VLLM_FC_BIAS[1:])
def test_vllm_export_of_the_shipped_eagle_loads_whole_in_vllm(tmp_path, version):
    out = tmp_path / "vllm"
    export_drafter(bundled_drafter_dir("eagle"), out, "vllm")
    built = vllm_load(*checkpoint(out), version, "eagle", SMOLLM2)
    assert built.cls == "EagleLlamaForCausalLM" and built.random == set() and built.dropped == set()
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= built.shared


def test_vllm_needs_method_eagle_for_the_shipped_eagle_directory():
    """Its path has no "eagle-" in it, so vLLM would not guess EAGLE-1; the README passes "method"."""
    with pytest.raises(EngineError):
        vllm_method("assets/drafters/smollm2-135m-eagle", None)
    assert vllm_method("assets/drafters/smollm2-135m-eagle3", None) == "eagle3"


@pytest.mark.parametrize("version", SGLANG)
def test_shipped_eagle_loads_whole_in_sglang_as_it_is(version):
    config, weights = shipped("eagle")
    built = sglang_load(config, weights, version, "EAGLE", SMOLLM2)
    assert built.cls == "LlamaForCausalLMEagle" and built.random == set()  # fc.bias included
    without = {k: v for k, v in weights.items() if k != "fc.bias"}  # as shipped before
    assert sglang_load(config, without, version, "EAGLE", SMOLLM2).random == {"model.fc.bias"}


def test_old_eagle_architectures_make_sglang_build_a_plain_llama_that_drops_every_tensor():
    config, weights = shipped("eagle")
    old = {**config, "architectures": ["LlamaForCausalLM"]}  # as shipped before
    built = sglang_load(old, weights, "0.5.2", "EAGLE", SMOLLM2)
    assert built.cls == "LlamaForCausalLM" and built.loaded == set()
    assert vllm_load(old, weights, "0.25.0", "eagle", SMOLLM2).cls == "EagleLlamaForCausalLM"  # vLLM was fine


@pytest.mark.parametrize("archs", [["LlamaForCausalLMEagle", "LlamaForCausalLM"], ["LlamaForCausalLMEagle"],
                                   ["EagleLlamaForCausalLM"], ["LlamaForCausalLM"]])
def test_speclens_reads_the_eagle_head_under_every_name_the_engines_use(archs):
    config, weights = shipped("eagle")
    assert read_drafter_config({**config, "architectures": archs}, weights).method == "eagle"


# ------------------------------------------------------------------------------ aux layer ids
TINY = TargetFacts(num_layers=8, vocab_size=256, hidden_size=64)  # tests/tiny.py's target

# (writer, the config's aux fields, the streams entering these layers): each read as its writer meant
CONVENTIONS = [
    ("speculators (vLLM's reading)", {"eagle_aux_hidden_state_layer_ids": [1, 4, 7]}, (1, 4, 7)),
    ("SpecForge (SGLang's reading)", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 6]}}, (1, 4, 7)),
    ("EAGLE repo (none: the default)", {}, (2, 4, 5)),
    ("SpecLens (its own, beside both engines' copies)",
     {"speclens": {"aux_layer_ids": [1, 4, 7]}, "eagle_aux_hidden_state_layer_ids": [1, 4, 7],
      "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 6]}}, (1, 4, 7)),
]


@pytest.mark.parametrize("fields,entering", [c[1:] for c in CONVENTIONS], ids=[c[0] for c in CONVENTIONS])
def test_speclens_reads_aux_ids_by_the_convention_of_their_writer(fields, entering):
    assert speclens_aux(fields, TINY) == entering


def test_speclens_reads_each_engines_field_as_that_engine_does():
    config, weights = shipped("eagle3")
    for fields in (c[1] for c in CONVENTIONS[:2]):
        ours = speclens_aux({**config, **fields}, SMOLLM2)
        engine, version = ("vllm", "0.12.0") if "eagle_aux_hidden_state_layer_ids" in fields else ("sglang", "0.5.2")
        assert load_in(engine, version, {**config, **fields}, weights, "eagle3").aux == ours


def test_top_level_and_eagle_config_ids_naming_other_layers_warn():
    named = read_aux_layer_ids({"eagle_aux_hidden_state_layer_ids": [2, 4, 5],
                                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}})
    assert named.ids == (2, 4, 5) and len(named.warnings) == 1 and "SGLang" in named.warnings[0]


def test_a_config_saved_before_warns_that_sglang_reads_other_layers():
    config, _ = shipped("eagle3")
    before = {**config, "speclens": {**config["speclens"], "aux_layer_ids": [2, 15, 27]},
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}}
    named = read_aux_layer_ids(before)
    assert named.ids == (2, 15, 27) and len(named.warnings) == 1
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [2, 15, 27]" in named.warnings[0]


def test_saved_non_default_aux_ids_feed_the_same_layers_in_speclens_vllm_and_sglang(tmp_path):
    hf, target = tiny_target("llama")
    out = save_drafter(tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(1, 4, 7)), tmp_path / "d")
    config, weights = checkpoint(out)
    assert load_drafter(out, target).cfg.aux_layer_ids == (1, 4, 7)
    for engine, version in EAGLE3_VERSIONS:
        built = load_in(engine, version, config, weights, "eagle3", TINY)
        assert built.random == set()
        # vLLM before 0.11.1 reads no ids at all: explicit ones need 0.11.1+ (the README says so)
        assert built.aux == ((1, 4, 7) if engine == "sglang" or at_least(version, "0.11.1") else TINY.default_aux())


def test_ids_equal_to_the_target_default_are_saved_as_the_default(tmp_path):
    hf, target = tiny_target("llama")
    drafter = tiny_drafter("eagle3", target, aux_layer_ids=target.config.default_aux_layers())
    config, _ = checkpoint(save_drafter(drafter, tmp_path / "d", target_layers=target.config.num_layers))
    assert config["speclens"]["aux_layer_ids"] is None and "eagle_config" not in config
    assert "eagle_aux_hidden_state_layer_ids" not in config


# ------------------------------------------------------------------------------ the exporter
def test_each_eagle3_export_keeps_only_its_engines_aux_field(tmp_path):
    hf, target = tiny_target("llama")
    src = save_drafter(tiny_drafter("eagle3", target, own_lm_head=False, aux_layer_ids=(1, 4, 7)), tmp_path / "src")
    for engine, version in (("vllm", "0.11.1"), ("sglang", "0.5.2")):
        out = tmp_path / engine
        export_drafter(src, out, engine)
        config, weights = checkpoint(out)
        assert ("eagle_config" in config) == (engine == "sglang")
        assert ("eagle_aux_hidden_state_layer_ids" in config) == (engine == "vllm")
        assert load_in(engine, version, config, weights, "eagle3", TINY).aux == (1, 4, 7)
        assert load_drafter(out, target).cfg.to_dict() == load_drafter(src, target).cfg.to_dict()


def test_eagle_saved_with_a_zero_fc_bias_drafts_exactly_as_the_head_without(tmp_path):
    hf, target = tiny_target("llama")
    original = tiny_drafter("eagle", target)
    src = save_drafter(original, tmp_path / "src")
    saved = load_drafter(src, target)
    assert saved.cfg.fc_bias and not bool(saved.fc.bias.ne(0).any())
    assert tokens_and_drafts(target, saved) == tokens_and_drafts(target, original)
    assert export_drafter(src, tmp_path / "sglang", "sglang") == []  # already SGLang's form
    export_drafter(src, tmp_path / "vllm", "vllm")  # the zero bias is dropped
    assert own_state(load_drafter(tmp_path / "vllm", target)).keys() == own_state(original).keys()


def test_exports_an_engine_cannot_run_are_refused(tmp_path):
    hf, target = tiny_target("llama")
    biased = save_drafter(tiny_drafter("eagle", target, fc_bias=True), tmp_path / "biased")
    with pytest.raises(ExportError, match="fc.bias: nonzero"):
        export_drafter(biased, tmp_path / "v", "vllm")
    embedding = save_drafter(tiny_drafter("eagle3", target, aux_layer_ids=(0, 4, 7)), tmp_path / "zero")
    with pytest.raises(ExportError, match="layer 0"):
        export_drafter(embedding, tmp_path / "s", "sglang")
    variant = save_drafter(tiny_drafter("eagle3", target, norm_before_residual=True), tmp_path / "nbr")
    with pytest.raises(ExportError, match="norm_before_residual"):
        export_drafter(variant, tmp_path / "s2", "sglang")
    with pytest.raises(ExportError, match="is IN"):
        export_drafter(biased, biased, "sglang")


def test_export_command_line_says_what_changed_or_fails_in_one_line(tmp_path, capsys):
    assert main(["--engine", "vllm", str(bundled_drafter_dir("eagle")), str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "dropped fc.bias" in said and '"method": "eagle"' in said
    assert main(["--engine", "vllm", str(tmp_path / "missing"), str(tmp_path / "o2")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_read_drafter_gives_module_names_without_a_target():
    cfg, state = read_drafter(bundled_drafter_dir("eagle3"))
    assert cfg.method == "eagle3" and not cfg.own_lm_head and cfg.aux_layer_ids is None
    assert "midlayer.hidden_norm.weight" in state and not any(k.startswith("lm_head") for k in state)
    with pytest.raises(DrafterLoadError):
        read_drafter(Path("/nonexistent"))
