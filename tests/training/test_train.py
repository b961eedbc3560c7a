"""The trainer (training/train.py), end to end on a tiny saved target: a run trains, saves a
drafter every loader reads, profiles, stops on its budget and resumes exactly; it refuses held-out
data; and a run can start from a saved drafter."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from demo.engine import Engine, GenerationConfig
from demo.target import Target
from training import head_loss_kernel
from training.data import SequenceSet, load_shards, split_holdout
from tests.training.helpers import VOCAB, cuda, records, tiny_run_inputs, train_cli


def test_training_refuses_held_out_records_and_mixed_splits_and_keeps_the_recorded_split_without_sharegpt(
        monkeypatch):
    from training import data as train_data
    from training.train import check_holdout

    ids = ["a_0", "b_0", "c_0", "d_0", "e_0"]
    split = split_holdout(records(ids, ["pa", "pb", "pc", "pd", "pe"]), n=2)  # train: records 0-2
    monkeypatch.setattr(train_data, "read_sharegpt", lambda: records(ids, ["pa", "pb", "pc", "pd", "pe"]))
    monkeypatch.setattr(train_data, "split_holdout", lambda records: split_holdout(records, n=2))

    def data(*sources):
        n = len(sources)
        return SequenceSet(tokens=np.zeros(2 * n, np.uint16), mask=np.ones(2 * n, bool),
                           offsets=np.arange(0, 2 * n + 1, 2), source=np.array(sources))

    mine = {"holdout_fingerprint": split.fingerprint()}
    assert check_holdout(data(0, 2, -1), [mine, {}]) == split.fingerprint()
    assert check_holdout(data(-1, -1), [{"holdout_fingerprint": "other"}]) is None  # nothing from ShareGPT
    with pytest.raises(SystemExit, match="held-out ShareGPT records"):
        check_holdout(data(0, 3), [mine])
    with pytest.raises(SystemExit, match="different hold-out splits"):
        check_holdout(data(0), [mine, {"holdout_fingerprint": "other"}])
    with pytest.raises(SystemExit, match="recorded hold-out split other"):
        check_holdout(data(0), [{"holdout_fingerprint": "other"}])

    def absent():
        raise FileNotFoundError("ShareGPT is not installed")

    monkeypatch.setattr(train_data, "read_sharegpt", absent)  # the GPU machine: the recorded split is kept
    assert check_holdout(data(0, 3), [mine]) == split.fingerprint()
    with pytest.raises(SystemExit, match="different hold-out splits"):
        check_holdout(data(0), [mine, {"holdout_fingerprint": "other"}])


@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle3-shared"])
def test_tiny_training_run_saves_a_loadable_drafter(tmp_path, method):
    from demo.checkpoints import load_drafter

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    shared = method == "eagle3-shared"
    method = "eagle3" if shared else method
    log = train_cli(target_dir, data_dir, tmp_path / "out", method, "--max-steps", "3",
                 *(["--share-lm-head", "--hot-tokens", "40", "--top1-weight", "1", "--chain-start-weight", "3"] * shared))
    assert log["steps"] == 3 and log["stop_reason"] == "max_steps" and log["head_loss"] == "torch"
    if method == "eagle3":  # the training-side estimate of acceptance at token 0, logged every window
        assert all(0 <= row["start_acc"] <= 1 for row in log["history"])
    assert set(log["times"]) >= {"load_target_s", "load_data_s", "train_s", "save_s"}
    assert json.loads((tmp_path / "out" / "train_log.json").read_text())["steps"] == 3
    target = Target(LlamaForCausalLM.from_pretrained(target_dir).eval())
    drafter = load_drafter(tmp_path / "out", target, method=method, hot_tokens="off")
    assert drafter.cfg.method == method
    if shared:  # the target's lm_head, nothing of it saved; the 40 most frequent answer tokens for a CPU
        assert not drafter.cfg.own_lm_head and drafter.cfg.draft_vocab_size == VOCAB
        assert drafter.lm_head is target.lm_head
        assert log["draft_vocab"] == {"size": VOCAB, "coverage": 1.0} and log["hot_tokens"]["size"] == 40
        hot = json.loads((tmp_path / "out" / "hot_tokens.json").read_text())
        answers = load_shards(data_dir).answer_tokens()
        assert hot["ids"] == sorted(hot["ids"]) and len(set(hot["ids"])) == 40
        assert hot["coverage"] == pytest.approx(float(np.isin(answers, hot["ids"]).mean()), abs=1e-6)
        assert load_drafter(tmp_path / "out", target).drafting_vocab == 40  # on this CPU
        assert "draft_vocab_size" not in json.loads((tmp_path / "out" / "config.json").read_text())
    elif method == "eagle3":
        assert drafter.cfg.draft_vocab_size == 64 and int(drafter.t2d.sum()) == 64
        assert drafter.cfg.aux_layer_ids is None  # saved as "the target default", read alike by every engine
    engine = Engine(target, drafter, max_context=128)  # and it drafts
    events = list(engine.generate([256, 1, 2, 3], GenerationConfig(max_new_tokens=6, num_spec_tokens=3)))
    assert sum(len(e.token_ids) for e in events) == 6


def test_profile_records_where_a_training_step_spends_its_time(tmp_path):
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    log = train_cli(target_dir, data_dir, tmp_path / "out", "eagle3", "--max-steps", "14", "--profile")
    assert log["steps"] == 14  # profiling leaves training as it is
    text = (tmp_path / "out" / "profile.txt").read_text()
    assert text.startswith("5 training steps after 7, eagle3")
    for stage in ("target_forward", "drafter_forward_and_loss", "backward", "optimizer"):
        assert stage in text


def test_resume_continues_from_the_saved_step(tmp_path):
    """3 steps, then --resume to 5, gives exactly the weights of 5 steps in one go (constant lr,
    EAGLE-1 with feature noise, so data order and RNG must both be restored)."""
    from safetensors.torch import load_file

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    flat = ("--min-lr-ratio", "1", "--warmup-steps", "1", "--save-dtype", "float32")
    straight = train_cli(target_dir, data_dir, tmp_path / "a", "eagle", "--max-steps", "5", *flat)
    first = train_cli(target_dir, data_dir, tmp_path / "b", "eagle", "--max-steps", "3", *flat)
    resumed = train_cli(target_dir, data_dir, tmp_path / "b", "eagle", "--max-steps", "5", "--resume", *flat)
    assert (straight["steps"], first["steps"], resumed["steps"]) == (5, 3, 5)
    assert [r["step"] for r in resumed["history"]] == [4, 5]
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_time_budget_stops_training_cleanly(tmp_path):
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    log = train_cli(target_dir, data_dir, tmp_path / "out", "eagle3", "--time-budget-min", "0.0001")
    assert log["stop_reason"] == "time_budget" and (tmp_path / "out" / "config.json").exists()


def test_resume_keeps_the_runs_feature_layers(tmp_path):
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    train_cli(target_dir, data_dir, tmp_path / "r", "eagle3", "--max-steps", "1", "--aux-layers", "1,3,5")
    resumed = train_cli(target_dir, data_dir, tmp_path / "r", "eagle3", "--max-steps", "2", "--resume")
    assert list(resumed["drafter"]["config"]["aux_layer_ids"]) == [1, 3, 5]
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    with pytest.raises(SystemExit, match="aux layers"):
        train_cli(target_dir, data_dir, tmp_path / "r", "eagle3", "--max-steps", "3", "--resume", "--aux-layers", "2,3,4")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_init_drafter_starts_from_the_saved_weights_and_draft_vocabulary(tmp_path, method):
    """A run started with --init-drafter and a zero learning rate saves back exactly the drafter it
    started from (weights, d2t and t2d), even when its data would pick another draft vocabulary."""
    from safetensors.torch import load_file

    from demo.checkpoints import load_drafter

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    f32 = ("--save-dtype", "float32")
    train_cli(target_dir, data_dir, tmp_path / "a", method, "--max-steps", "2", *f32)
    log = train_cli(target_dir, data_dir, tmp_path / "b", method, "--max-steps", "2", "--lr", "0", "--draft-vocab", "32",
                 "--init-drafter", str(tmp_path / "a"), *f32)
    assert log["steps"] == 2

    def tensors(d):
        files = sorted(d.glob("model*.safetensors"))
        return {k: v for f in files for k, v in load_file(f).items()}

    a, b = tensors(tmp_path / "a"), tensors(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    target = Target(LlamaForCausalLM.from_pretrained(target_dir).eval())
    assert load_drafter(tmp_path / "b", target).cfg.draft_vocab_size == (64 if method == "eagle3" else VOCAB)


def test_share_lm_head_starts_from_a_saved_head_without_its_lm_head(tmp_path):
    """--share-lm-head from a head with its own lm_head keeps every other weight (zero learning
    rate: saved back exactly); a shared head continues as one, and a run with a head of its own
    cannot switch on resume."""
    from safetensors.torch import load_file

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    f32 = ("--save-dtype", "float32", "--max-steps", "1")
    train_cli(target_dir, data_dir, tmp_path / "a", "eagle3", *f32)
    train_cli(target_dir, data_dir, tmp_path / "b", "eagle3", "--lr", "0", "--share-lm-head",
           "--init-drafter", str(tmp_path / "a"), *f32)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in "ab")
    assert set(a) - set(b) == {"lm_head.weight", "d2t", "t2d"} and set(b) < set(a)
    assert all(torch.equal(a[k], b[k]) for k in b)
    log = train_cli(target_dir, data_dir, tmp_path / "c", "eagle3", "--init-drafter", str(tmp_path / "b"), *f32)
    assert log["args"]["share_lm_head"] and log["draft_vocab"]["size"] == VOCAB
    log = train_cli(target_dir, data_dir, tmp_path / "c", "eagle3", "--resume", "--save-dtype", "float32",
                 "--max-steps", "2")
    assert log["steps"] == 2 and log["args"]["share_lm_head"]
    assert set(load_file(tmp_path / "c" / "model.safetensors")) == set(b)
    with pytest.raises(SystemExit, match="lm_head of its own"):
        train_cli(target_dir, data_dir, tmp_path / "a", "eagle3", "--resume", "--share-lm-head", "--max-steps", "2")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_widened_mlp_computes_what_the_narrow_one_did_and_its_new_units_learn(tmp_path, method):
    """--intermediate-size wider than the --init-drafter's: the saved units keep their weights, the
    new ones add nothing at first (zero down_proj columns), so the drafts are the narrow head's;
    training then moves them, and a resumed run keeps the width."""
    from safetensors.torch import load_file

    from demo.checkpoints import load_drafter

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    f32 = ("--save-dtype", "float32")
    train_cli(target_dir, data_dir, tmp_path / "a", method, "--max-steps", "1", *f32)
    train_cli(target_dir, data_dir, tmp_path / "b", method, "--max-steps", "1", "--lr", "0", "--intermediate-size", "160",
           "--init-drafter", str(tmp_path / "a"), *f32)
    target = Target(LlamaForCausalLM.from_pretrained(target_dir).eval())
    narrow, wide = (load_drafter(tmp_path / d, target) for d in "ab")
    assert (narrow.cfg.intermediate_size, wide.cfg.intermediate_size) == (96, 160)
    prompt = [256] + list(b"Say something")
    runs = [list(Engine(target, d, max_context=128).generate(prompt, GenerationConfig(max_new_tokens=24,
                                                                                       num_spec_tokens=3)))
            for d in (narrow, wide)]
    assert [e.draft_ids for e in runs[0]] == [e.draft_ids for e in runs[1]]  # the same drafts, step by step
    down = next(k for k in load_file(tmp_path / "b" / "model.safetensors") if k.endswith("mlp.down_proj.weight"))
    log = train_cli(target_dir, data_dir, tmp_path / "c", method, "--max-steps", "2", "--intermediate-size", "160",
                 "--init-drafter", str(tmp_path / "a"), *f32)
    assert load_file(tmp_path / "c" / "model.safetensors")[down][:, 96:].abs().sum() > 0  # the new units learn
    assert log["drafter"]["config"]["intermediate_size"] == 160
    resumed = train_cli(target_dir, data_dir, tmp_path / "c", method, "--max-steps", "3", "--resume", *f32)
    assert resumed["steps"] == 3 and resumed["drafter"]["config"]["intermediate_size"] == 160
    with pytest.raises(SystemExit, match="narrower"):
        train_cli(target_dir, data_dir, tmp_path / "d", method, "--max-steps", "1", "--intermediate-size", "64",
               "--init-drafter", str(tmp_path / "a"))


def test_rebuilt_draft_vocabulary_keeps_the_trained_rows_and_starts_new_ones_from_the_target(tmp_path):
    from safetensors.torch import load_file

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    f32 = ("--save-dtype", "float32")
    train_cli(target_dir, data_dir, tmp_path / "a", "eagle3", "--max-steps", "2", "--draft-vocab", "32", *f32)
    log = train_cli(target_dir, data_dir, tmp_path / "b", "eagle3", "--max-steps", "1", "--lr", "0", "--draft-vocab", "64",
                 "--init-drafter", str(tmp_path / "a"), "--rebuild-draft-vocab", *f32)

    def tensors(d):
        return {k: v for f in sorted(d.glob("model*.safetensors")) for k, v in load_file(f).items()}

    a, b = tensors(tmp_path / "a"), tensors(tmp_path / "b")
    ids_a = (torch.arange(32) + a["d2t"]).tolist()
    ids_b = (torch.arange(64) + b["d2t"]).tolist()
    assert log["draft_vocab"]["size"] == 64 and set(ids_a) <= set(ids_b)  # the top 32 are within the top 64
    assert int(b["t2d"].sum()) == 64 and b["t2d"][ids_b].all()
    target_head = LlamaForCausalLM.from_pretrained(target_dir).lm_head.weight.detach()
    for j, t in enumerate(ids_b):
        want = a["lm_head.weight"][ids_a.index(t)] if t in ids_a else target_head[t]
        assert torch.equal(b["lm_head.weight"][j], want), (j, t)
    assert all(torch.equal(a[k], b[k]) for k in a if k not in ("lm_head.weight", "d2t", "t2d"))
    with pytest.raises(SystemExit):
        train_cli(target_dir, data_dir, tmp_path / "c", "eagle3", "--max-steps", "1", "--rebuild-draft-vocab")


@cuda
@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle3-shared"])
def test_cuda_training_run_in_bf16(tmp_path, method):
    from demo.checkpoints import load_drafter

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    shared = method == "eagle3-shared"
    method = "eagle3" if shared else method
    train_cli(target_dir, data_dir, tmp_path / "out", method, "--max-steps", "3",
           *(["--share-lm-head", "--top1-weight", "1", "--chain-start-weight", "3"] * shared), device="cuda")
    log = json.loads((tmp_path / "out" / "train_log.json").read_text())
    assert log["steps"] == 3 and all(np.isfinite(r["loss"]) for r in log["history"])
    assert log["head_loss"] == ("triton" if head_loss_kernel.available() else "torch")  # fused on a GPU
    if method == "eagle3":
        assert all(0 <= r["start_acc"] <= 1 for r in log["history"])
    target = Target(LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to("cuda").eval())
    assert load_drafter(tmp_path / "out", target, method=method).cfg.method == method
