"""Hub ids look before they download: a drafter's config.json comes first and is checked, the
weights its layout needs are sized against a limit, and only those files are fetched; a target too
large for the device is refused before any download. The hub is a local directory served through
monkeypatched huggingface_hub functions (no network)."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import huggingface_hub
import pytest
import torch

from demo.models.checkpoints import DRAFTER_MAX_HUB_BYTES, DrafterLoadError, load_drafter
from demo.models.loading import TARGET_MAX_HUB_BYTES, LoadError, load_target
from tests.models.test_checkpoints import eagle3_ckpt, own_state, published_eagle3, specforge, write
from tests.tiny import tiny_drafter, tiny_target
from tests.tiny_chat import byte_tokenizer

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """huggingface_hub.model_info and hf_hub_download over a local directory: the listing gives
    every file's size (or the size given in `sizes`); downloads land in a snapshot folder and are
    recorded in `fetched`, in order."""

    def __init__(self, monkeypatch, repo: Path, cache: Path, sizes: dict[str, int] | None = None):
        self.repo, self.snapshot, self.sizes = repo, cache / "snapshots" / SHA, sizes or {}
        self.fetched: list[str] = []
        self.snapshot.mkdir(parents=True)
        monkeypatch.setattr(huggingface_hub, "model_info", self.model_info)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.download)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", self.everything)

    def model_info(self, repo_id, *, files_metadata=False, **kwargs):
        assert files_metadata, "sizes are only listed with files_metadata=True"
        siblings = [types.SimpleNamespace(rfilename=p.name, size=self.sizes.get(p.name, p.stat().st_size))
                    for p in sorted(self.repo.iterdir())]
        return types.SimpleNamespace(id=repo_id, sha=SHA, siblings=siblings)

    def download(self, repo_id, filename, *, revision=None, **kwargs):
        assert revision == SHA, "every file comes from the commit that was listed"
        self.fetched.append(filename)
        shutil.copy(self.repo / filename, self.snapshot / filename)
        return str(self.snapshot / filename)

    def everything(self, repo_id, *, local_files_only=False, **kwargs):
        assert local_files_only, "snapshot_download fetches a whole repository"
        if not (self.snapshot / "config.json").is_file():
            raise FileNotFoundError(f"{repo_id} is not in the cache")
        return str(self.snapshot)  # the cache only: what earlier fetches left there


@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


def sharded_with_extras(path: Path, target):
    """A SpecForge checkpoint in 3 shards, next to files a loader must not fetch: a .bin copy of
    the weights, an optimizer state, and a safetensors file no index names."""
    ref = tiny_drafter("eagle3", target, draft_vocab_size=64, aux_layer_ids=(2, 4, 5))
    write(path, *specforge(ref, target), shards=3)
    torch.save(own_state(ref), path / "pytorch_model.bin")
    (path / "optimizer.bin").write_bytes(b"\0" * 1000)
    (path / "stray.safetensors").write_bytes(b"\0" * 1000)
    shards = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    return ref, ["config.json", "model.safetensors.index.json", *shards]


def single_bin_with_extras(path: Path, target):
    """A published EAGLE-3 .bin, next to training leftovers in safetensors and .bin."""
    ref = tiny_drafter("eagle3", target, draft_vocab_size=64)
    write(path, *published_eagle3(ref, target), fmt="bin")
    (path / "training_args.bin").write_bytes(b"\0" * 1000)
    (path / "ema.safetensors").write_bytes(b"\0" * 1000)
    return ref, ["config.json", "pytorch_model.bin"]


@pytest.mark.parametrize("layout", [sharded_with_extras, single_bin_with_extras])
def test_a_hub_drafter_fetches_its_config_first_then_only_the_weights_its_layout_needs(tmp_path, llama, monkeypatch,
                                                                                       layout):
    hf, target = llama
    ref, needed = layout(tmp_path / "repo", target)
    hub = FakeHub(monkeypatch, tmp_path / "repo", tmp_path / "cache")
    loaded = load_drafter("owner/head", target)
    assert hub.fetched == needed
    got, want = own_state(loaded), own_state(ref)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_offline_a_hub_drafter_fetched_before_loads_from_the_cache_and_one_never_fetched_is_refused(
        tmp_path, llama, monkeypatch):
    hf, target = llama
    ref, needed = sharded_with_extras(tmp_path / "repo", target)
    hub = FakeHub(monkeypatch, tmp_path / "repo", tmp_path / "cache")

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    with monkeypatch.context() as m:
        m.setattr(huggingface_hub, "model_info", offline)
        with pytest.raises(DrafterLoadError, match=r"^drafter: 'owner/head' could not be listed"):
            load_drafter("owner/head", target)
    load_drafter("owner/head", target)  # online: fetched into the cache
    monkeypatch.setattr(huggingface_hub, "model_info", offline)
    got, want = own_state(load_drafter("owner/head", target)), own_state(ref)
    assert all(torch.equal(got[k], want[k]) for k in want) and hub.fetched == needed  # nothing fetched offline


def test_a_hub_drafter_over_the_size_limit_is_refused_before_any_weight_is_fetched(tmp_path, llama, monkeypatch):
    hf, target = llama
    sharded_with_extras(tmp_path / "repo", target)
    shard = DRAFTER_MAX_HUB_BYTES["cpu"] // 2  # three of them pass the limit of a CPU target
    hub = FakeHub(monkeypatch, tmp_path / "repo", tmp_path / "cache",
                  sizes={f"model-{i:05d}-of-00003.safetensors": shard for i in (1, 2, 3)})
    with pytest.raises(DrafterLoadError, match=r"^drafter: 'owner/big' has 0\.75 GB of weights .* over the 0\.50 GB"):
        load_drafter("owner/big", target)
    assert hub.fetched == ["config.json", "model.safetensors.index.json"]


def test_a_hub_drafter_with_a_bad_config_is_refused_before_any_weight_is_fetched(tmp_path, llama, monkeypatch):
    hf, target = llama
    config, tensors = eagle3_ckpt(target)
    write(tmp_path / "repo", {**config, "num_attention_heads": 0}, tensors)
    hub = FakeHub(monkeypatch, tmp_path / "repo", tmp_path / "cache")
    with pytest.raises(DrafterLoadError, match=r"^num_attention_heads: config.json has 0"):
        load_drafter("owner/bad", target)
    assert hub.fetched == ["config.json"]


def test_a_huge_hub_config_is_refused_before_it_is_fetched(tmp_path, llama, monkeypatch):
    hf, target = llama
    write(tmp_path / "repo", *eagle3_ckpt(target))
    hub = FakeHub(monkeypatch, tmp_path / "repo", tmp_path / "cache", sizes={"config.json": 10 ** 10})
    with pytest.raises(DrafterLoadError, match=r"^config.json: 10000000000 bytes in 'owner/huge'"):
        load_drafter("owner/huge", target)
    assert hub.fetched == []


def test_errors_about_a_hub_drafter_name_the_hub_id_never_the_servers_cache(tmp_path, llama, monkeypatch):
    hf, target = llama
    sharded_with_extras(tmp_path / "repo", target)
    (tmp_path / "repo" / "model-00002-of-00003.safetensors").unlink()  # the index names a shard the repo lacks
    FakeHub(monkeypatch, tmp_path / "repo", tmp_path / "cache")
    with pytest.raises(DrafterLoadError) as e:
        load_drafter("owner/head", target)
    assert str(e.value).startswith("model.safetensors.index.json: names shard model-00002-of-00003.safetensors")
    assert "'owner/head'" in str(e.value) and str(tmp_path) not in str(e.value)


def test_a_hub_target_too_large_for_the_device_is_refused_before_downloading(tmp_path, monkeypatch):
    import transformers

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text("{}")
    (repo / "model.safetensors").write_bytes(b"\0" * 100)
    loads = []

    def from_pretrained(path, **kwargs):
        loads.append((path, kwargs.get("revision")))
        return byte_tokenizer() if len(loads) == 1 else tiny_target("llama")[0]

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    limit = TARGET_MAX_HUB_BYTES["cpu"]
    hub = FakeHub(monkeypatch, repo, tmp_path / "cache", sizes={"model.safetensors": limit * 3 // 2})
    with pytest.raises(LoadError, match=r"^target 'owner/big': its weights are 3\.00 GB, over the 2\.00 GB .* cpu"):
        load_target("owner/big", device="cpu")
    assert hub.fetched == [] and loads == []
    hub.sizes["model.safetensors"] = limit  # at the limit it loads, from the commit that was sized
    load_target("owner/fits", device="cpu")
    assert loads == [("owner/fits", SHA), ("owner/fits", SHA)] and hub.fetched == []


def test_a_local_target_path_that_does_not_exist_is_never_looked_up_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: pytest.fail("looked up on the hub"))
    missing = str(tmp_path / "no" / "such-model")
    with pytest.raises(LoadError, match=r"is neither 'default', a local directory, nor a hub id") as e:
        load_target(missing, device="cpu")
    assert str(e.value).startswith(f"target {missing!r}")
