"""Averaging drafters (training.average): the result is the weighted mean of the inputs, saved
in the layout every loader reads; heads that cannot be averaged are refused."""

from __future__ import annotations

import json

import pytest
import torch

from demo.models.checkpoints import DrafterLoadError, load_drafter, read_checkpoint, save_drafter, write_hot_tokens
from tests.tiny import tiny_drafter, tiny_target
from training.average import average_drafters, main


def saved(tmp_path, name, target, seed, **kw):
    return save_drafter(tiny_drafter("eagle3", target, seed=seed, **kw), tmp_path / name)


def test_average_is_the_weighted_mean_of_every_tensor_and_loads_as_a_drafter(tmp_path):
    _, target = tiny_target("llama")
    a, b = saved(tmp_path, "a", target, 1), saved(tmp_path, "b", target, 2)
    (a / "train_log.json").write_text(json.dumps({"steps": 7}))
    out = average_drafters([a, b], tmp_path / "avg", [0.25, 0.75])
    (_, sa), (_, sb), (config, avg) = read_checkpoint(a), read_checkpoint(b), read_checkpoint(out)
    assert config == json.loads((a / "config.json").read_text())
    assert avg.keys() == sa.keys()
    for name, t in avg.items():
        assert t.dtype == sa[name].dtype
        torch.testing.assert_close(t, 0.25 * sa[name] + 0.75 * sb[name], rtol=0, atol=1e-6)
    assert not torch.equal(avg["fc.weight"], sa["fc.weight"])  # the inputs really differ
    loaded = load_drafter(out, target)
    assert torch.equal(loaded.fc.weight, avg["fc.weight"])
    log = json.loads((out / "average_log.json").read_text())
    assert log["weights"] == [0.25, 0.75] and log["inputs"][0]["train_log"] == {"steps": 7}
    assert log["inputs"][1]["train_log"] is None
    assert log["relative_distance_from_input_0"][0] == 0 and log["relative_distance_from_input_0"][1] > 0


def test_a_mean_of_means_keeps_the_lineage_of_every_run_below_it(tmp_path):
    """An input that is itself an average carries its average_log.json into the new one."""
    _, target = tiny_target("llama")
    a, b, c = (saved(tmp_path, n, target, s) for n, s in (("a", 1), ("b", 2), ("c", 3)))
    (a / "train_log.json").write_text(json.dumps({"arm": "a"}))
    (b / "train_log.json").write_text(json.dumps({"arm": "b"}))
    (c / "train_log.json").write_text(json.dumps({"arm": "c"}))
    ab = average_drafters([a, b], tmp_path / "ab")
    log = json.loads((average_drafters([ab, c], tmp_path / "abc") / "average_log.json").read_text())
    first, second = log["inputs"]
    assert first["train_log"] is None
    assert [i["train_log"] for i in first["average_log"]["inputs"]] == [{"arm": "a"}, {"arm": "b"}]
    assert second["train_log"] == {"arm": "c"} and "average_log" not in second


def test_average_of_copies_is_the_head_itself_bit_for_bit_in_bfloat16(tmp_path):
    """Equal weights of equal bf16 tensors: the float32 mean rounds back to the same bits."""
    _, target = tiny_target("llama")
    ref = tiny_drafter("eagle3", target, own_lm_head=False).to(torch.bfloat16)
    a = save_drafter(ref, tmp_path / "a")
    write_hot_tokens(a, [1, 5, 9], 0.5, "test")
    out = main([str(a), str(save_drafter(ref, tmp_path / "b")), "--out", str(tmp_path / "avg")])
    (_, sa), (_, avg) = read_checkpoint(a), read_checkpoint(out)
    assert all(avg[k].dtype == torch.bfloat16 and torch.equal(avg[k], sa[k]) for k in sa)
    assert json.loads((out / "hot_tokens.json").read_text())["ids"] == [1, 5, 9]  # the first input's


def test_average_shards_like_save_drafter(tmp_path):
    _, target = tiny_target("llama")
    a, b = saved(tmp_path, "a", target, 1), saved(tmp_path, "b", target, 2)
    out = average_drafters([a, b], tmp_path / "avg", max_shard_bytes=100_000)
    files = sorted(p.name for p in out.glob("model*.safetensors"))
    assert len(files) > 1 and (out / "model.safetensors.index.json").exists()
    assert all((out / f).stat().st_size <= 100_000 for f in files)
    assert read_checkpoint(out)[1].keys() == read_checkpoint(a)[1].keys()


def test_average_refuses_heads_of_another_shape_or_draft_vocabulary(tmp_path):
    _, target = tiny_target("llama")
    a = saved(tmp_path, "a", target, 1)
    wide = saved(tmp_path, "wide", target, 2, intermediate_size=256)
    with pytest.raises(DrafterLoadError, match=r"differs from .* in \['intermediate_size'\]"):
        average_drafters([a, wide], tmp_path / "x")
    v1 = saved(tmp_path, "v1", target, 1, draft_vocab_size=64)
    v2 = saved(tmp_path, "v2", target, 2, draft_vocab_size=64)  # another random draft vocabulary
    with pytest.raises(DrafterLoadError, match="d2t: an integer tensor that differs"):
        average_drafters([v1, v2], tmp_path / "y")
    with pytest.raises(ValueError, match="summing to 1"):
        average_drafters([a, a], tmp_path / "z", [0.5, 0.6])
    with pytest.raises(ValueError, match="must not be one of the inputs"):
        average_drafters([a, saved(tmp_path, "b", target, 2)], a)
