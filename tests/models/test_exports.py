"""Each library loads SpecLens' drafters with its own code, uses every tensor and computes what
SpecLens' drafter computes (logits within 1e-4 on the same features).

Where a library installs on a CPU without another torch (`pip install --no-deps --target`, as
.ci/run does under $SPECLENS_INTEROP_SITE, default /tmp/interop-site), its own loader runs in a
subprocess (tests/models/loaders/run_*.py says what runs and what stands in for a GPU):

- vLLM 0.33.0 and 0.34.0: SpeculativeConfig, get_model, load_eagle_model, the drafter's forward.
- SpecForge 0.2.0: its EAGLE-3 recipe's draft construction and warm start, then one forward.
- speculators 0.9.0: its EAGLE-3 converter; what it writes is then loaded by vLLM 0.34.0's loader.

SGLang 0.5.23 does not import on a CPU (its package imports IPython, and torchvision's compiled
ops, which need a torchvision built for this torch): tests/models/test_interop.py replays its
loader's rules instead, and here those rules (which parameters get a tensor) fill SGLang's module
shape before the logits are compared.

A library that is not installed skips its tests, saying so. Every parameter is filled with NaN
before the library loads into it, so whatever it leaves at initialisation shows; every checkpoint
tensor must appear in the loaded module (tests/models/loaders/accounting.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from demo.models.checkpoints import load_drafter, read_checkpoint, save_drafter
from demo.models.export_drafter import ExportError, export_drafter
from demo.models.presets import bundled_drafter_dir
from demo.target import Target
from tests.models.loaders.accounting import left_at_init, poison
from tests.models.test_interop import SMOLLM2, sglang_load, stacked
from tests.tiny import tiny_drafter, tiny_hf

SITE = Path(os.environ.get("SPECLENS_INTEROP_SITE", "/tmp/interop-site"))
LOADERS = Path(__file__).parent / "loaders"
VLLM = ("0.33.0", "0.34.0")
TOL = 1e-4
T = 8  # tokens per feature sequence


def installed(package: str) -> Path:
    d = SITE / package
    if not d.is_dir():
        pytest.skip(f"{package} is not installed under {SITE} (.ci/run installs it with pip --no-deps --target)")
    return d


def run_loader(script: str, package: str, cases: list[dict], out: Path) -> dict[str, dict]:
    """Run loaders/`script` over `cases` with `package` (and the shared deps) importable; each
    case's report, with its logits under "logits" where it has them."""
    site = installed(package)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SITE / "deps")]), "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, str(LOADERS / script), str(out / "cases.json"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = {}
    for case in cases:
        report = json.loads((out / f"{case['name']}.json").read_text())
        if (out / f"{case['name']}.pt").exists():
            report["logits"] = torch.load(out / f"{case['name']}.pt")
        reports[case["name"]] = report
    return reports


# ------------------------------------------------------------------------------ drafters and features
class Setup:
    """Targets saved as HF directories, drafters (shipped, exported, tiny), each with its features
    and SpecLens' logits on them."""

    def __init__(self, root: Path):
        self.root = root
        self.dirs, self.features, self.ours, self.targets, self.maps = {}, {}, {}, {}, {}
        # the shipped heads' target shape (SmolLM2-135M-Instruct), two random layers: the drafters
        # read only its embedding and lm_head here, and the features are given
        hf = tiny_hf("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                     num_key_value_heads=3, num_hidden_layers=2, head_dim=64, tie_word_embeddings=True,
                     initializer_range=0.02)
        self.add_target("smollm2", hf)
        self.add_target("tiny", tiny_hf("llama"))

    def add_target(self, name: str, hf) -> None:
        hf.save_pretrained(self.root / name)
        self.targets[name] = Target(hf)

    def head(self, target: str):
        return lambda: self.targets[target].lm_head.weight

    def add(self, name: str, directory: Path, target: str) -> str:
        """A drafter directory, features for it and SpecLens' logits [T, Vd] on them."""
        tgt = self.targets[target]
        drafter = load_drafter(directory, tgt, hot_tokens="off")
        g = torch.Generator().manual_seed(len(self.dirs))
        width = tgt.config.hidden_size * (3 if drafter.cfg.method == "eagle3" else 1)
        f = dict(tokens=torch.randint(0, tgt.config.vocab_size, (T,), generator=g), positions=torch.arange(T),
                 hidden=torch.randn(T, width, generator=g))
        torch.save(f, self.root / f"{name}.pt")
        drafter.setup_cache(T)
        with torch.no_grad():
            hidden = f["hidden"][None]
            if drafter.cfg.method == "eagle3":
                hidden = drafter.project(hidden)
            logits, _ = drafter(f["tokens"][None], f["positions"][None], hidden)
        self.dirs[name], self.ours[name] = str(directory), logits[0]
        d2t = getattr(drafter, "d2t", None)
        self.maps[name] = None if d2t is None else torch.arange(len(d2t)) + d2t  # [Vd] target ids
        return name

    def case(self, name: str, target: str, **extra) -> dict:
        return dict(name=name, target=str(self.root / target), drafter=self.dirs[name],
                    features=str(self.root / f"{name}.pt"), **extra)

    def close(self, name: str, logits: torch.Tensor) -> float:
        """Max |difference| between a library's logits and SpecLens' (a library that maps a draft
        vocabulary into the target's, as vLLM does, is read at the mapped ids)."""
        ours = self.ours[name]
        if logits.shape != ours.shape:
            logits = logits[:, self.maps[name]]
        return float((logits - ours).abs().max())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    s = Setup(root)
    shipped3, shipped1 = bundled_drafter_dir("eagle3"), bundled_drafter_dir("eagle")
    s.add("shipped-eagle3", shipped3, "smollm2")
    s.add("shipped-eagle", shipped1, "smollm2")
    for engine in ("specforge", "speculators"):  # the vLLM export of this head is the shipped form
        export_drafter(shipped3, root / f"eagle3-{engine}", engine, target_head=s.head("smollm2"))
        s.add(f"eagle3-{engine}", root / f"eagle3-{engine}", "smollm2")
    export_drafter(shipped1, root / "eagle-vllm", "vllm")
    s.add("eagle-vllm", root / "eagle-vllm", "smollm2")
    # a head of its own over a draft vocabulary, fed by other layers than the default
    own = save_drafter(tiny_drafter("eagle3", s.targets["tiny"], draft_vocab_size=64, aux_layer_ids=(1, 4, 7)),
                       root / "own")
    for engine in ("vllm", "specforge", "speculators"):
        export_drafter(own, root / f"own-{engine}", engine)
        s.add(f"own-{engine}", root / f"own-{engine}", "tiny")
    return s


# ------------------------------------------------------------------------------ speculators 0.9.0
SPECULATORS_CASES = {"eagle3-speculators": ("smollm2", {}),
                     "own-speculators": ("tiny", {"eagle_aux_hidden_state_layer_ids": [1, 4, 7]})}


@pytest.fixture(scope="module")
def speculators(setup):
    cases = [dict(name=n, target=str(setup.root / t), drafter=setup.dirs[n], kwargs=kw)
             for n, (t, kw) in SPECULATORS_CASES.items()]
    cases.append(dict(name="shipped-eagle3", target=str(setup.root / "smollm2"), drafter=setup.dirs["shipped-eagle3"]))
    out = setup.root / "speculators-0.9.0"
    return out, run_loader("run_speculators.py", "speculators-0.9.0", cases, out)


def test_speculators_converts_the_export_with_nothing_dropped_or_made_up(speculators):
    _, reports = speculators
    for name in SPECULATORS_CASES:
        assert reports[name].get("error") is None, reports[name]
        assert reports[name]["dropped"] == [] and reports[name]["made_up"] == []  # a random lm_head would be made up
    assert reports["own-speculators"]["config"]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]


def test_speculators_refuses_the_shipped_sharded_eagle3_which_the_export_makes_one_file(speculators):
    _, reports = speculators
    assert "Sharded checkpoint" in reports["shipped-eagle3"]["error"]


# ------------------------------------------------------------------------------ vLLM 0.33.0, 0.34.0
@pytest.fixture(scope="module", params=VLLM)
def vllm(request, setup):
    version = request.param
    installed(f"vllm-{version}")
    s = setup
    cases = [s.case("shipped-eagle3", "smollm2", method=None),  # detected: "eagle3" in its path
             s.case("shipped-eagle", "smollm2", method="eagle"),
             {**s.case("shipped-eagle", "smollm2", method=None), "name": "shipped-eagle-unnamed"},
             s.case("eagle-vllm", "smollm2", method="eagle"),
             s.case("own-vllm", "tiny", method="eagle3")]
    if version == "0.34.0" and (SITE / "speculators-0.9.0").is_dir():  # what speculators wrote, served
        converted, _ = request.getfixturevalue("speculators")
        for name, (target, _) in SPECULATORS_CASES.items():
            cases.append({**s.case(name, target, method="eagle3"), "drafter": str(converted / name)})
    return version, run_loader("run_vllm.py", f"vllm-{version}", cases, s.root / f"vllm-{version}")


def loaded_whole(report: dict) -> bool:
    return report.get("error") is None and report["left_at_init"] == [] and report["unfound"] == []


def test_vllm_loads_the_shipped_eagle3_whole_and_computes_speclens_logits(vllm, setup):
    version, reports = vllm
    r = reports["shipped-eagle3"]
    assert r["method"] == "eagle3" and r["cls"] == "Eagle3LlamaForCausalLM" and loaded_whole(r), r
    assert setup.close("shipped-eagle3", r["logits"]) < TOL


def test_vllm_drops_the_shipped_eagle_zero_fc_bias_unread_and_computes_speclens_logits(vllm, setup):
    """AutoWeightsLoader ignores an unexpected `.bias` without a word: harmless for this zero one."""
    version, reports = vllm
    r = reports["shipped-eagle"]
    assert r["cls"] == "EagleLlamaForCausalLM" and r["left_at_init"] == [] and r["unfound"] == ["fc.bias"], r
    assert not bool(read_checkpoint(bundled_drafter_dir("eagle"))[1]["fc.bias"].ne(0).any())
    assert setup.close("shipped-eagle", r["logits"]) < TOL


def test_vllm_takes_the_shipped_eagle_for_a_plain_draft_model_unless_told_method_eagle(vllm):
    version, reports = vllm
    assert reports["shipped-eagle-unnamed"]["method"] == "draft_model"


@pytest.mark.parametrize("name", ["eagle-vllm", "own-vllm"])
def test_vllm_export_loads_whole_in_vllm_and_computes_speclens_logits(vllm, setup, name):
    version, reports = vllm
    r = reports[name]
    assert loaded_whole(r), r
    assert setup.close(name, r["logits"]) < TOL


@pytest.mark.parametrize("name", list(SPECULATORS_CASES))
def test_speculators_conversion_of_the_export_serves_in_vllm_with_speclens_logits(vllm, setup, name):
    version, reports = vllm
    if name not in reports:
        pytest.skip(f"run with vLLM 0.34.0 and speculators 0.9.0 installed (this is vLLM {version})")
    r = reports[name]
    assert r["cls"] == "Eagle3LlamaForCausalLM" and r["left_at_init"] == [], r
    assert r["unfound"] in ([], ["t2d"])  # speculators keeps t2d, which vLLM never reads (d2t says the same)
    assert setup.close(name, r["logits"]) < TOL


# ------------------------------------------------------------------------------ SpecForge 0.2.0
@pytest.fixture(scope="module")
def specforge(setup):
    s = setup
    cases = [s.case("eagle3-specforge", "smollm2"), s.case("own-specforge", "tiny"), s.case("shipped-eagle3", "smollm2")]
    return run_loader("run_specforge.py", "specforge-0.2.0", cases, s.root / "specforge-0.2.0")


@pytest.mark.parametrize("name", ["eagle3-specforge", "own-specforge"])
def test_specforge_warm_starts_the_export_whole_and_computes_speclens_logits(specforge, setup, name):
    r = specforge[name]
    assert r.get("error") is None and r["missing_keys"] == ["embed_tokens.weight"], r  # the target's, loaded after
    assert r["left_at_init"] == [] and r["unfound"] == []
    assert setup.close(name, r["logits"]) < TOL


def test_specforge_refuses_the_shipped_eagle3_without_an_explicit_draft_vocabulary(specforge):
    assert specforge["shipped-eagle3"]["error"] is not None


# ------------------------------------------------------------------------------ SGLang 0.5.23 (replayed)
@pytest.fixture(scope="module")
def smollm2_shape():
    """A target of the shipped heads' shape (two random layers: a drafter reads its embedding and head)."""
    return Target(tiny_hf("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                          num_key_value_heads=3, num_hidden_layers=2, head_dim=64, tie_word_embeddings=True,
                          initializer_range=0.02))


def sglang_module(directory: Path, target, method: str):
    """SGLang's module shape for this checkpoint (an EAGLE-1 fc always has a bias), filled as its
    loader's rules fill it (test_interop.sglang_load) and sharing the target's embedding and head."""
    config, tensors = read_checkpoint(directory)
    built = sglang_load(config, {k: tuple(v.shape) for k, v in tensors.items()}, "0.5.23",
                        {"eagle": "EAGLE", "eagle3": "EAGLE3"}[method], SMOLLM2)
    reference = load_drafter(directory, target, hot_tokens="off")
    cfg = type(reference.cfg)(**{**reference.cfg.to_dict(), "fc_bias": method == "eagle", "warnings": []})
    module = type(reference)(cfg)
    poison(module)
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            ours = name.replace("layers.0.", "midlayer.") if method == "eagle3" else name
            sglang_name = stacked(("model." + name).replace("layers.0.", "midlayer.") if method == "eagle3"
                                  else "model." + name)
            if sglang_name in built.loaded and ours in params:
                params[ours].copy_(t)
    module.share_target(target)
    return module.eval(), reference


@pytest.mark.parametrize("shipped_before", [False, True], ids=["as shipped", "without fc.bias, as shipped before"])
def test_sglang_rules_fill_the_shipped_eagle_whole_only_with_its_zero_fc_bias(tmp_path, shipped_before, smollm2_shape):
    target = smollm2_shape
    directory = bundled_drafter_dir("eagle")
    if shipped_before:
        config, tensors = read_checkpoint(directory)
        tensors.pop("fc.bias")
        from safetensors.torch import save_file
        directory = tmp_path / "before"
        directory.mkdir()
        save_file(tensors, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps(config))
    module, reference = sglang_module(directory, target, "eagle")
    assert left_at_init(module) == (["fc.bias"] if shipped_before else [])
    if not shipped_before:
        g = torch.Generator().manual_seed(0)
        tokens, hidden = torch.randint(0, 49152, (1, T), generator=g), torch.randn(1, T, 576, generator=g)
        assert sglang_logits_gap(module, reference, tokens, hidden) < TOL


def test_sglang_rules_fill_the_shipped_eagle3_whole_and_its_logits_are_speclens(smollm2_shape):
    # SGLang 0.5.23's EAGLE-3: fc without a bias, the layer as midlayer, the target's embedding and
    # (draft_vocab_size null) its head shared; the fused features go through fc as SpecLens' project
    module, reference = sglang_module(bundled_drafter_dir("eagle3"), smollm2_shape, "eagle3")
    assert left_at_init(module) == []
    g = torch.Generator().manual_seed(1)
    tokens, features = torch.randint(0, 49152, (1, T), generator=g), torch.randn(1, T, 3 * 576, generator=g)
    with torch.no_grad():
        hidden = [m.project(features) for m in (module, reference)]
    assert sglang_logits_gap(module, reference, tokens, hidden[0], hidden[1]) < TOL


def sglang_logits_gap(module, reference, tokens, hidden, reference_hidden=None) -> float:
    """Largest |logit difference| of the SGLang-filled module and SpecLens' drafter on the same features."""
    outs = []
    for m, h in ((module, hidden), (reference, hidden if reference_hidden is None else reference_hidden)):
        m.setup_cache(T)
        with torch.no_grad():
            outs.append(m(tokens, torch.arange(T)[None], h)[0])
    return float((outs[0] - outs[1]).abs().max())


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("engine", ["specforge", "speculators"])
def test_eagle1_exports_for_libraries_without_eagle1_are_refused_with_a_reason(tmp_path, engine):
    with pytest.raises(ExportError, match="EAGLE-1"):
        export_drafter(bundled_drafter_dir("eagle"), tmp_path / "out", engine)


@pytest.mark.parametrize("engine", ["specforge", "speculators"])
def test_a_shared_head_export_without_the_target_is_refused_naming_the_head(tmp_path, engine):
    with pytest.raises(ExportError, match="lm_head.weight"):
        export_drafter(bundled_drafter_dir("eagle3"), tmp_path / "out", engine)


def test_a_shared_head_export_differs_from_its_head_by_the_heads_bf16_rounding_alone(setup):
    """The SpecForge and speculators exports of a head drafting through the target's lm_head carry
    that head in the checkpoint's dtype, bf16, the one those libraries compute the drafter in. Read back,
    an export's logits move from the shipped head's by that rounding alone: well under 0.1 here, the
    same argmax almost everywhere (docs/DRAFTERS.md says which comparison the 1e-4 checks make)."""
    target = setup.targets["smollm2"]
    g = torch.Generator().manual_seed(7)
    tokens, features = torch.randint(0, 49152, (1, T), generator=g), torch.randn(1, T, 3 * 576, generator=g)
    logits = {}
    for name in ("shipped-eagle3", "eagle3-specforge", "eagle3-speculators"):
        drafter = load_drafter(setup.dirs[name], target, hot_tokens="off")
        drafter.setup_cache(T)
        with torch.no_grad():
            logits[name] = drafter(tokens, torch.arange(T)[None], drafter.project(features))[0]
    shipped = logits["shipped-eagle3"]
    for name in ("eagle3-specforge", "eagle3-speculators"):
        gap = float((logits[name] - shipped).abs().max())
        same = float((logits[name].argmax(-1) == shipped.argmax(-1)).float().mean())
        print(f"{name}: largest logit gap {gap:.4f}, argmax agreement {same:.3f}")
        assert 0 < gap < 0.1 and same >= 0.9, (name, gap, same)
