"""Drafter checkpoints: every published layout loads into a drafter that proposes exactly what the
original proposes and stays lossless; our own layout round-trips exactly in small files; every
checkpoint that does not fit the target is refused with a message naming the field and both values."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from demo.config import GenerationConfig
from demo.engine import Engine
from demo.models.checkpoints import DrafterLoadError, load_drafter, read_drafter_config, save_drafter, write_hot_tokens
from demo.models.presets import DEFAULT_PRESET, PRESETS, Preset, bundled_drafter_dir, get_preset
from tests.tiny import tiny_drafter, tiny_target

PROMPT = [3, 17, 99, 4, 250, 31, 8, 77]
NEW_TOKENS = 24
STORAGE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ------------------------------------------------------------------------------ writing layouts
def own_state(drafter) -> dict[str, torch.Tensor]:
    return {k: v for k, v in drafter.state_dict().items() if not k.startswith("_target")}


def round_through(drafter, dtype):
    """Round the reference drafter's floats through the storage dtype, so loading must be exact."""
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(p.to(dtype).to(p.dtype))
    return drafter


def llama_fields(cfg, **extra) -> dict:
    return dict(model_type="llama", hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                num_hidden_layers=1, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps,
                max_position_embeddings=2048, torch_dtype="float16", **extra)


def published_eagle(drafter, target):
    """yuhuili/EAGLE-LLaMA3.1-Instruct-8B: LlamaForCausalLM, bias, layers.0.*, a copy of embed_tokens."""
    cfg = drafter.cfg
    config = {"architectures": ["LlamaForCausalLM"], **llama_fields(cfg, rope_theta=cfg.rope_theta),
              "bias": cfg.fc_bias}
    tensors = {**own_state(drafter), "embed_tokens.weight": target.embed.weight.detach().clone()}
    return config, tensors


def published_eagle3(drafter, target):
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: LlamaForCausalLM + draft_vocab_size, no rope_theta, midlayer.*."""
    cfg = drafter.cfg
    config = {"architectures": ["LlamaForCausalLM"], **llama_fields(cfg), "draft_vocab_size": cfg.draft_vocab_size}
    return config, own_state(drafter)


def specforge(drafter, target):
    """SpecForge / vLLM: LlamaForCausalLMEagle3, eagle_config ids, target_hidden_size, `model.` prefix.
    SpecForge writes ids as SGLang reads them, outputs of layers: the stream entering layer i is id i - 1
    (SpecForge specforge/algorithms/model_providers.py default [1, L//2 - 1, L - 4])."""
    cfg = drafter.cfg
    config = {"architectures": ["LlamaForCausalLMEagle3"], **llama_fields(cfg, rope_theta=cfg.rope_theta),
              "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids]}}
    tensors = {(k if k.startswith(("lm_head", "d2t", "t2d")) else "model." + k): v
               for k, v in own_state(drafter).items()}
    return config, tensors


def speculators(drafter, target):
    """speculators Eagle3Speculator: transformer_layer_config, top-level extras, layers.0.* names."""
    cfg = drafter.cfg
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "transformer_layer_config": llama_fields(cfg, rope_theta=cfg.rope_theta),
              "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": None,
              "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
              "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny"}}}
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in own_state(drafter).items()}
    tensors["embed_tokens.weight"] = target.embed.weight.detach().clone()  # speculators saves the verifier's copy
    return config, tensors


def write(path, config, tensors, fmt="safetensors", dtype=torch.float32, shards=1):
    """A checkpoint directory as published: floats stored in `dtype`, as .bin, safetensors or shards."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    if fmt == "bin":
        torch.save(tensors, path / "pytorch_model.bin")
    elif shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
    else:
        names = sorted(tensors)
        weight_map = {}
        for i in range(shards):
            part = {k: tensors[k] for k in names[i::shards]}
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(path / file))
            weight_map.update(dict.fromkeys(part, file))
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


# ------------------------------------------------------------------------------ running
def tokens_and_drafts(target, drafter, k=3):
    engine = Engine(target, drafter, max_context=128)
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, num_spec_tokens=k if drafter is not None else 0,
                           stop_token_ids=())
    events = list(engine.generate(PROMPT, gen))
    return [t for e in events for t in e.token_ids], [e.draft_ids for e in events]


def hf_greedy(hf):
    out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(PROMPT):].tolist()


def assert_same_drafter_and_lossless(loaded, reference, hf, target):
    """Identical tensors, identical drafts step by step, and output equal to greedy decoding."""
    got, want = own_state(loaded), own_state(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    tokens, drafts = tokens_and_drafts(target, loaded)
    _, ref_drafts = tokens_and_drafts(target, reference)
    assert drafts == ref_drafts
    assert tokens == tokens_and_drafts(target, None)[0] == hf_greedy(hf)


# ------------------------------------------------------------------------------ layouts that load
@pytest.mark.parametrize("fmt,storage", [("bin", "fp16"), ("safetensors", "bf16")])
def test_published_eagle_loads_and_is_lossless(tmp_path, fmt, storage):
    hf, target = tiny_target("llama")
    ref = round_through(tiny_drafter("eagle", target, fc_bias=True), STORAGE[storage])
    path = write(tmp_path / "eagle", *published_eagle(ref, target), fmt=fmt, dtype=STORAGE[storage])
    loaded = load_drafter(path, target)
    assert loaded.cfg.method == "eagle" and loaded.cfg.fc_bias and not loaded.cfg.own_embedding
    assert loaded.cfg.warnings == []  # the embed_tokens copy equals the target's: silently skipped
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


def test_published_eagle_with_qkv_bias_loads_for_a_qwen2_target(tmp_path):
    hf, target = tiny_target("qwen2", seed=3)
    ref = tiny_drafter("eagle", target, attention_bias=True)
    path = write(tmp_path / "eagle", *published_eagle(ref, target))
    loaded = load_drafter(path, target)
    assert loaded.cfg.attention_bias
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


def test_published_eagle3_bin_loads_and_is_lossless(tmp_path):
    # the target uses rope_theta 500000; the head's config has none, so the drafter must use 10000
    hf, target = tiny_target("llama", rope_theta=500000.0)
    ref = round_through(tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(2, 4, 5)), torch.float16)
    assert ref.cfg.rope_theta == 10000.0
    path = write(tmp_path / "eagle3", *published_eagle3(ref, target), fmt="bin", dtype=torch.float16)
    loaded = load_drafter(path, target)
    assert loaded.cfg.rope_theta == 10000.0 and loaded.cfg.draft_vocab_size == 64
    assert loaded.cfg.aux_layer_ids == target.config.default_aux_layers() == (2, 4, 5)
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


def test_published_eagle3_full_vocabulary_with_zero_d2t_has_no_mapping(tmp_path):
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target)
    config, tensors = published_eagle3(ref, target)
    tensors.update(d2t=torch.zeros(256, dtype=torch.int64), t2d=torch.ones(256, dtype=torch.bool))
    loaded = load_drafter(write(tmp_path / "eagle3", config, tensors), target)
    assert loaded.d2t is None and loaded.cfg.draft_vocab_size == loaded.cfg.vocab_size == 256
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


def test_shared_head_eagle3_without_lm_head_drafts_through_the_targets(tmp_path):
    """nvidia/gpt-oss-120b-Eagle3's layout: no lm_head, no d2t, no draft_vocab_size. The head drafts
    over the full vocabulary through the target's own lm_head (borrowed, never copied or saved)."""
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target, own_lm_head=False, aux_layer_ids=(2, 4, 5))
    ref.share_target(target)
    config, tensors = specforge(ref, target)
    del config["draft_vocab_size"]
    assert not any(k.startswith(("lm_head", "d2t", "t2d")) for k in tensors)
    loaded = load_drafter(write(tmp_path / "shared", config, tensors), target)
    assert not loaded.cfg.own_lm_head and loaded.d2t is None and loaded.cfg.draft_vocab_size == 256
    assert loaded.lm_head is target.lm_head
    assert_same_drafter_and_lossless(loaded, ref, hf, target)
    # saved back as it came: no lm_head, and draft_vocab_size null (SGLang then takes the target's head)
    out = save_drafter(loaded, tmp_path / "saved")
    saved = json.loads((out / "config.json").read_text())
    assert "draft_vocab_size" in saved and saved["draft_vocab_size"] is None
    assert load_drafter(out, target).cfg.to_dict() == loaded.cfg.to_dict()
    with pytest.raises(ValueError, match="full vocabulary"):  # a reduced vocabulary needs a head of its own
        tiny_drafter("eagle3", target, draft_vocab_size=64, own_lm_head=False)


def test_hot_tokens_limit_a_shared_head_on_a_cpu_and_it_stays_lossless(tmp_path):
    """hot_tokens.json (FR-Spec): on a CPU a shared head drafts over those target ids only, each
    draft the best of them under the full head's logits; "off" keeps the full vocabulary."""
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target, own_lm_head=False, aux_layer_ids=(2, 4, 5))
    out = save_drafter(ref, tmp_path / "d")
    hot = torch.randperm(256, generator=torch.Generator().manual_seed(0))[:40].sort().values
    write_hot_tokens(out, hot.tolist(), 0.9, "test")
    full = load_drafter(out, target, hot_tokens="off")
    assert full.drafting_vocab == 256 and full.lm_head is target.lm_head
    limited = load_drafter(out, target)  # the target is on the CPU: "auto" limits
    assert limited.drafting_vocab == 40 and torch.equal(limited.hot_ids, hot)
    assert torch.equal(limited.d2t + torch.arange(40), hot) and torch.equal(limited.t2d.nonzero()[:, 0], hot)
    tokens, drafts = tokens_and_drafts(target, limited)  # the engine re-shares the target: the limit holds
    assert limited.lm_head.weight.shape == (40, 64)
    assert tokens == hf_greedy(hf) and all(d in set(hot.tolist()) for step in drafts for d in step)
    h = torch.randn(1, 5, 64)
    with torch.no_grad():
        want = hot[target.lm_head(full.norm(h))[..., hot].argmax(-1)]
        assert torch.equal(limited.select(limited.lm_head(limited.norm(h))), want)
    again = save_drafter(limited, tmp_path / "again")  # saved as the shared head it is, limit or not
    assert load_drafter(again, target, hot_tokens="off").cfg.to_dict() == full.cfg.to_dict()
    assert not any(k.startswith(("lm_head", "d2t")) for k in load_file(str(again / "model.safetensors")))


def test_hot_tokens_are_refused_where_they_cannot_apply(tmp_path, llama):
    hf, target = llama
    own = save_drafter(tiny_drafter("eagle3", target, draft_vocab_size=64), tmp_path / "own")
    write_hot_tokens(own, [1, 2, 3], 1.0, "test")
    assert load_drafter(own, target).drafting_vocab == 64  # "auto": a head of its own keeps its vocabulary
    with pytest.raises(DrafterLoadError, match="hot_tokens.json: only an EAGLE-3 head drafting through the target's"):
        load_drafter(own, target, hot_tokens="on")
    shared = save_drafter(tiny_drafter("eagle3", target, own_lm_head=False), tmp_path / "shared")
    with pytest.raises(DrafterLoadError, match="hot_tokens.json: missing"):
        load_drafter(shared, target, hot_tokens="on")
    (shared / "hot_tokens.json").write_text('{"ids": [1, 999]}')
    with pytest.raises(DrafterLoadError, match=r"hot_tokens.json: 'ids' must be .* \[0, 256\)"):
        load_drafter(shared, target)


def test_specforge_sharded_bf16_with_model_prefix_loads_and_is_lossless(tmp_path):
    hf, target = tiny_target("qwen3", seed=2)
    ref = round_through(tiny_drafter("eagle3", target, draft_vocab_size=100, aux_layer_ids=(1, 3, 8),
                                     rope_theta=1e6), torch.bfloat16)
    path = write(tmp_path / "sf", *specforge(ref, target), dtype=torch.bfloat16, shards=3)
    loaded = load_drafter(path, target)
    assert loaded.cfg.aux_layer_ids == (1, 3, 8) and loaded.cfg.rope_theta == 1e6 and loaded.cfg.warnings == []
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


def test_specforge_narrower_drafter_with_target_hidden_size_uses_its_own_embedding(tmp_path):
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(2, 4, 5), hidden_size=32,
                       intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16, target_hidden_size=64,
                       own_embedding=True)
    assert tuple(ref.fc.weight.shape) == (32, 192)
    path = write(tmp_path / "sf", *specforge(ref, target))
    loaded = load_drafter(path, target)
    assert loaded.cfg.own_embedding and loaded.cfg.target_hidden_size == 64 and loaded.cfg.hidden_size == 32
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


@pytest.mark.parametrize("write_norm_flag", [True, False])
def test_speculators_layout_loads_and_is_lossless(tmp_path, write_norm_flag):
    hf, target = tiny_target("llama", seed=4)
    # vLLM reads a speculators config without norm_before_residual as true
    ref = tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(2, 3, 6), norm_before_residual=True)
    config, tensors = speculators(ref, target)
    if write_norm_flag:
        config["norm_before_residual"] = True
    loaded = load_drafter(write(tmp_path / "spec", config, tensors, dtype=torch.float32), target)
    assert loaded.cfg.norm_before_residual and loaded.cfg.aux_layer_ids == (2, 3, 6)
    assert_same_drafter_and_lossless(loaded, ref, hf, target)


def test_read_drafter_config_needs_only_config_and_shapes():
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1, "vocab_size": 128256,
              "draft_vocab_size": 32000, "rms_norm_eps": 1e-5}
    H, kv, I = 4096, 1024, 14336
    shapes = {"fc.weight": [H, 3 * H], "midlayer.self_attn.q_proj.weight": [H, 2 * H],
              "midlayer.self_attn.k_proj.weight": [kv, 2 * H], "midlayer.self_attn.v_proj.weight": [kv, 2 * H],
              "midlayer.self_attn.o_proj.weight": [H, H], "midlayer.mlp.gate_proj.weight": [I, H],
              "midlayer.mlp.up_proj.weight": [I, H], "midlayer.mlp.down_proj.weight": [H, I],
              "midlayer.input_layernorm.weight": [H], "midlayer.hidden_norm.weight": [H],
              "midlayer.post_attention_layernorm.weight": [H], "norm.weight": [H], "lm_head.weight": [32000, H],
              "d2t": [32000], "t2d": [128256]}
    cfg = read_drafter_config(config, shapes)  # the published EAGLE3-LLaMA3.1-Instruct-8B, without its 1 GB
    assert (cfg.method, cfg.head_dim, cfg.draft_vocab_size, cfg.rope_theta) == ("eagle3", 128, 32000, 10000.0)
    assert cfg.aux_layer_ids is None  # load_drafter resolves it against the target, with a warning


def test_llama3_rope_scaling_is_read_and_yarn_is_refused(tmp_path):
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle", target)
    config, tensors = published_eagle(ref, target)
    llama3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=64)
    loaded = load_drafter(write(tmp_path / "a", {**config, "rope_scaling": llama3}, tensors), target)
    assert loaded.cfg.rope_scaling == llama3
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)
    with pytest.raises(DrafterLoadError, match=r"^rope_scaling: .*'yarn'.*llama3"):
        load_drafter(write(tmp_path / "b", {**config, "rope_scaling": yarn}, tensors), target)


# ------------------------------------------------------------------------------ our own layout
@pytest.mark.parametrize("method,aux", [("eagle3", (2, 4, 5)), ("eagle3", None), ("eagle", None)])
def test_saved_drafter_round_trips_exactly_in_small_shards(tmp_path, method, aux):
    hf, target = tiny_target("llama")
    extra = dict(draft_vocab_size=96, aux_layer_ids=aux) if method == "eagle3" else {}
    ref = tiny_drafter(method, target, **extra).to(torch.bfloat16)
    max_bytes = 40_000  # forces several shards for this tiny drafter
    out = save_drafter(ref, tmp_path / "d", max_shard_bytes=max_bytes)
    files = list(out.glob("*.safetensors"))
    assert len(files) > 1 and (out / "model.safetensors.index.json").exists()
    assert all(f.stat().st_size <= max_bytes for f in files)
    loaded = load_drafter(out, target)  # the target is fp32: the loaded drafter is cast to it
    want = own_state(ref)
    if method == "eagle":  # saved with a zero fc.bias, which SGLang needs (checkpoints.zero_fc_bias)
        want["fc.bias"] = torch.zeros(64, dtype=torch.bfloat16)
        ref.cfg.fc_bias = True
    assert loaded.cfg.to_dict() == ref.cfg.to_dict() and loaded.cfg.warnings == []
    got = own_state(loaded)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k].to(want[k].dtype), want[k]) for k in want)


def test_saved_eagle3_config_is_the_layout_vllm_and_sglang_read(tmp_path):
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(1, 4, 7))
    config = json.loads((save_drafter(ref, tmp_path / "d") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 64 and config["vocab_size"] == 256
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]  # vLLM's field: the streams entering layers
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]  # SGLang's: it adds 1
    assert "target_hidden_size" not in config and config["torch_dtype"] == "float32"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "midlayer.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert not any(n.startswith(("_target", "embed_tokens")) for n in names)


def test_saving_a_tensor_larger_than_a_shard_is_refused(tmp_path):
    hf, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target)  # lm_head [256, 64] fp32 = 65536 bytes
    with pytest.raises(ValueError, match=r"lm_head.weight: 65536 bytes .* max_shard_bytes 50000"):
        save_drafter(ref, tmp_path / "d", max_shard_bytes=50_000)


# ------------------------------------------------------------------------------ refusals
@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


def refused(tmp_path, target, config, tensors, fmt="safetensors", **kw):
    with pytest.raises(DrafterLoadError) as e:
        load_drafter(write(tmp_path / "bad", config, tensors, fmt=fmt), target, **kw)
    message = str(e.value)
    assert "\n" not in message
    return message


def eagle3_ckpt(target, **kw):
    return published_eagle3(tiny_drafter("eagle3", target, draft_vocab_size=64, **kw), target)


def _narrow_eagle(target):
    narrow = tiny_drafter("eagle", target, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16)
    config, tensors = published_eagle(narrow, target)
    tensors.pop("embed_tokens.weight")
    return config, tensors


def _edited(make, edit):
    """A checkpoint from make(target), changed in place by edit(config, tensors)."""
    def build(target):
        config, tensors = make(target)
        edit(config, tensors)
        return config, tensors
    return build


def _eagle3(target):
    return eagle3_ckpt(target)


def _specforge(target):
    return specforge(tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(2, 4, 5)), target)


def _eagle(target):
    return published_eagle(tiny_drafter("eagle", target), target)


def _d2t_out_of_range(config, tensors):
    tensors["d2t"] = tensors["d2t"].clone()
    tensors["d2t"][10] = 300 - 10  # draft id 10 -> target id 300


# (what is wrong, checkpoint builder, load_drafter options, the message's start, words it must name);
# the target is a tiny Llama: hidden 64, vocabulary 256, layers 0..8
REFUSALS = [
    ("hidden size", _narrow_eagle, {}, "hidden_size:", ["32", "64"]),
    ("target hidden size", _edited(_specforge, lambda c, t: c.update(target_hidden_size=48)), {},
     "target_hidden_size:", ["48", "64"]),
    ("vocabulary size", _edited(_eagle, lambda c, t: c.update(vocab_size=320)), {}, "vocab_size:", ["320", "256"]),
    ("t2d longer than the vocabulary",
     _edited(_eagle3, lambda c, t: t.update(t2d=torch.cat((t["t2d"], torch.zeros(44, dtype=torch.bool))))), {},
     "t2d:", ["300", "256"]),
    ("d2t outside the vocabulary", _edited(_eagle3, _d2t_out_of_range), {}, "d2t:", ["300", "[0, 256)"]),
    ("aux layer outside the target",
     _edited(_eagle3, lambda c, t: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, 9])), {},
     "eagle_aux_hidden_state_layer_ids:", ["[2, 4, 9]", "has 9", "0..8"]),
    ("SpecForge aux layer past the target's last (output of layer 8 of 0..7)",
     _edited(_eagle3, lambda c, t: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 8]})), {},
     "eagle_config.eagle_aux_hidden_state_layer_ids:", ["[2, 4, 8]", "[3, 5, 9]", "has 9", "0..8"]),
    ("missing weight", _edited(_eagle3, lambda c, t: t.pop("midlayer.hidden_norm.weight")), {},
     "missing weights: midlayer.hidden_norm.weight", []),
    ("reduced vocabulary without lm_head", _edited(_eagle3, lambda c, t: t.pop("lm_head.weight")), {},
     "lm_head.weight: missing; draft_vocab_size 64", ["256"]),
    ("unexpected weight", _edited(_eagle3, lambda c, t: t.update({"midlayer.self_attn.q_norm.weight": torch.ones(8)})),
     {}, "unexpected weights: midlayer.self_attn.q_norm.weight", []),
    ("weight shape against the config", _edited(_eagle3, lambda c, t: c.update(intermediate_size=96)), {},
     "midlayer.mlp.", ["[128, 64]", "[96, 64]"]),
    ("unknown architecture", _edited(_eagle3, lambda c, t: c.update(architectures=["MedusaModel"])), {},
     "architectures:", ["MedusaModel", "LlamaForCausalLMEagle3"]),
    ("method mismatch", _eagle3, {"method": "eagle"}, "method:", ["'eagle'", "'eagle3'"]),
]


@pytest.mark.parametrize("build, options, start, words", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_drafter_that_does_not_fit_is_refused_in_one_line_naming_the_field_and_values(tmp_path, llama, build,
                                                                                         options, start, words):
    hf, target = llama
    msg = refused(tmp_path, target, *build(target), **options)
    assert msg.startswith(start) and all(w in msg for w in words), msg


def _config(edit):
    """A published EAGLE-3 checkpoint whose config.json is edit(config) (in place, or returned)."""
    def build(target):
        config, tensors = _eagle3(target)
        return edit(config) or config, tensors
    return build


def _set(**fields):
    return _config(lambda c: c.update(fields))


def _without_head_dim(**fields):
    return _config(lambda c: c.pop("head_dim") and c.update(fields))


# (what is wrong, checkpoint builder, the message's start, words it must name): every config.json
# field the loader reads is type-checked before use; the tiny target has hidden 64, 4 heads, 2 KV heads
BAD_CONFIGS = [
    ("config is a list", _config(lambda c: [c]), "config.json:", ["list"]),
    ("zero heads without head_dim", _without_head_dim(num_attention_heads=0), "num_attention_heads:", ["0"]),
    ("heads do not divide hidden_size", _without_head_dim(num_attention_heads=3), "num_attention_heads:",
     ["3", "64"]),
    ("KV heads do not divide heads", _set(num_key_value_heads=3), "num_key_value_heads:", ["3", "4"]),
    ("negative draft_vocab_size", _set(draft_vocab_size=-1), "draft_vocab_size:", ["-1"]),
    ("rms_norm_eps a string", _set(rms_norm_eps="NaN"), "rms_norm_eps:", ["'NaN'"]),
    ("rms_norm_eps not finite", _set(rms_norm_eps=float("inf")), "rms_norm_eps:", ["inf"]),
    ("fractional hidden_size", _set(hidden_size=64.5), "hidden_size:", ["64.5"]),
    ("boolean intermediate_size", _set(intermediate_size=True), "intermediate_size:", ["True"]),
    ("vocab_size a string", _set(vocab_size="256"), "vocab_size:", ["'256'"]),
    ("num_hidden_layers a string", _set(num_hidden_layers="1"), "num_hidden_layers:", ["'1'"]),
    ("negative rope_theta", _set(rope_theta=-1), "rope_theta:", ["-1"]),
    ("rope_scaling factor a string", _set(rope_scaling={"rope_type": "linear", "factor": "x"}),
     "rope_scaling.factor:", ["'x'"]),
    ("architectures a string", _set(architectures="LlamaForCausalLM"), "architectures:", ["'LlamaForCausalLM'"]),
    ("attention_bias a string", _set(attention_bias="false"), "attention_bias:", ["'false'"]),
    ("hidden_act a number", _set(hidden_act=5), "hidden_act:", ["5"]),
    ("eagle_config a list", _set(eagle_config=[2, 4, 5]), "eagle_config:", ["[2, 4, 5]"]),
    ("aux layer ids as strings", _set(eagle_config={"eagle_aux_hidden_state_layer_ids": ["2", 4, 5]}),
     "eagle_config.eagle_aux_hidden_state_layer_ids:", ["'2'"]),
    ("aux layer ids a number", _set(eagle_aux_hidden_state_layer_ids=5), "eagle_aux_hidden_state_layer_ids:", ["5"]),
    ("target_hidden_size zero", _set(target_hidden_size=0), "target_hidden_size:", ["0"]),
    ("norm_before_residual a string", _set(norm_before_residual="yes"), "norm_before_residual:", ["'yes'"]),
    ("speclens a list", _set(speclens=[]), "speclens:", ["[]"]),
    ("speculators layer config with a bad size",
     _config(lambda c: {"architectures": ["Eagle3Speculator"], "draft_vocab_size": 64,
                        "transformer_layer_config": {**c, "architectures": None, "hidden_size": "64"}}),
     "transformer_layer_config.hidden_size:", ["'64'"]),
]


@pytest.mark.parametrize("build, start, words", [r[1:] for r in BAD_CONFIGS], ids=[r[0] for r in BAD_CONFIGS])
def test_every_config_field_is_type_checked_in_one_line_naming_the_field_and_value(tmp_path, llama, build, start,
                                                                                 words):
    hf, target = llama
    msg = refused(tmp_path, target, *build(target))
    assert msg.startswith(start) and all(w in msg for w in words), msg


@pytest.mark.parametrize("damage", ["truncated safetensors", "truncated bin", "bad json", "bad header"])
def test_corrupted_files_are_refused_naming_the_file(tmp_path, llama, damage):
    hf, target = llama
    fmt = "bin" if "bin" in damage else "safetensors"
    path = write(tmp_path / "c", *eagle3_ckpt(target), fmt=fmt)
    if damage == "bad json":
        victim = path / "config.json"
    else:
        victim = path / ("pytorch_model.bin" if fmt == "bin" else "model.safetensors")
    data = victim.read_bytes()
    if damage == "bad header":
        victim.write_bytes((10 ** 9).to_bytes(8, "little") + data[8:])
    else:
        victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(DrafterLoadError, match=rf"^{victim.name}: .*(corrupted|truncated)"):
        load_drafter(path, target)


class _RunsCode:
    """Pickles as a call of print: what torch.load(weights_only=True) refuses to unpickle."""

    def __reduce__(self):
        return print, ("this ran on load",)


def test_a_pickle_that_would_run_code_is_refused_as_such_with_what_to_do(tmp_path, llama):
    hf, target = llama
    config, tensors = eagle3_ckpt(target)
    path = write(tmp_path / "p", config, tensors, fmt="bin")
    torch.save({**tensors, "extra": _RunsCode()}, path / "pytorch_model.bin")
    with pytest.raises(DrafterLoadError) as e:
        load_drafter(path, target)
    msg = str(e.value)
    assert msg.startswith("pytorch_model.bin: refused") and "\n" not in msg
    assert "run code" in msg and "print" in msg and "safetensors" in msg
    assert "corrupted" not in msg and "download it again" not in msg


def test_missing_aux_ids_fall_back_to_the_target_default_with_a_warning(tmp_path, llama):
    hf, target = llama
    drafter = load_drafter(write(tmp_path / "d", *eagle3_ckpt(target)), target)
    assert drafter.cfg.aux_layer_ids == (2, 4, 5)
    assert len(drafter.cfg.warnings) == 1 and "[2, 4, 5]" in drafter.cfg.warnings[0]
    assert "eagle_aux_hidden_state_layer_ids" in drafter.cfg.warnings[0]


def test_embedding_of_another_target_is_replaced_with_a_warning(tmp_path, llama):
    hf, target = llama
    config, tensors = published_eagle(tiny_drafter("eagle", target), target)
    tensors["embed_tokens.weight"] = torch.randn(256, 64)
    drafter = load_drafter(write(tmp_path / "d", config, tensors), target)
    assert drafter.embed_tokens is None and "embed_tokens.weight" in drafter.cfg.warnings[0]


def test_a_hub_id_that_cannot_be_fetched_is_refused_with_what_to_do(tmp_path, llama, monkeypatch):
    import huggingface_hub

    def offline(**kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("outgoing traffic has been disabled")

    monkeypatch.setattr(huggingface_hub, "model_info", offline)
    hf, target = llama
    with pytest.raises(DrafterLoadError, match=r"^drafter: 'nobody/no-such-head' .*huggingface-cli login"):
        load_drafter("nobody/no-such-head", target)


def test_a_local_path_that_is_no_drafter_directory_is_refused_telling_nothing_beyond_the_path(tmp_path, llama):
    hf, target = llama
    (tmp_path / "a-file").write_text("not a directory")
    messages = []
    for spec in (tmp_path / "a-file", tmp_path / "missing" / "dir"):
        with pytest.raises(DrafterLoadError) as e:
            load_drafter(str(spec), target)
        messages.append(str(e.value).replace(str(spec), "PATH"))
    assert messages[0] == messages[1] == "drafter: 'PATH' is neither a local directory nor a hub id (owner/name)"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DrafterLoadError, match=r"^config.json: missing from '.*empty'$"):
        load_drafter(str(empty), target)


# ------------------------------------------------------------------------------ presets
def test_presets_name_a_target_and_drafters_for_each_method():
    assert DEFAULT_PRESET in PRESETS
    for preset in PRESETS.values():
        assert isinstance(preset, Preset) and preset.target and preset.methods
        for method in preset.methods:
            spec = getattr(preset, method)
            assert not isinstance(spec, str) or spec.count("/") == 1  # hub ids are owner/name
    assert get_preset("Qwen3-8B").drafter("eagle3") == "AngelSlim/Qwen3-8B_eagle3"
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        get_preset("nope")


def test_a_bundled_drafter_that_was_not_built_is_refused_clearly(tmp_path, monkeypatch):
    import demo.models.presets as presets

    monkeypatch.setattr(presets, "REPO_ROOT", tmp_path)
    with pytest.raises(DrafterLoadError, match=r"bundled eagle3 drafter: .* no config\.json yet.*--drafter PATH"):
        bundled_drafter_dir("eagle3")
