"""The trainer (training/train.py), end to end on a tiny saved target: a run trains, saves a
drafter every loader reads, profiles, stops on its budget and resumes exactly; it refuses held-out
data; and a run can start from a saved drafter."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from demo.config import GenerationConfig
from demo.engine import Engine
from demo.target import Target
from tests.training.helpers import VOCAB, cuda, records, tiny_run_inputs, train_cli
from training import head_loss_kernel
from training.data import SequenceSet, load_shards, split_holdout


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


@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle3-own-lm-head"])
def test_tiny_training_run_saves_a_loadable_drafter(tmp_path, method):
    from demo.models.checkpoints import load_drafter

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    own = method == "eagle3-own-lm-head"
    shared = method == "eagle3"
    method = "eagle3" if own else method
    log = train_cli(target_dir, data_dir, tmp_path / "out", method, "--max-steps", "3",
                    *(["--hot-tokens", "40", "--align-mask"] * shared),
                    *(["--draft-vocab", "64", "--top1-weight", "1"] * own))
    assert log["steps"] == 3 and log["stop_reason"] == "max_steps" and log["head_loss"] == "torch"
    if method == "eagle3":  # the training-side estimate of acceptance at token 0, logged every window
        assert all(0 <= row["start_acc"] <= 1 for row in log["history"])
    assert set(log["times"]) >= {"load_target_s", "load_data_s", "train_s", "save_s"}
    assert json.loads((tmp_path / "out" / "train_log.json").read_text())["steps"] == 3
    target = Target(LlamaForCausalLM.from_pretrained(target_dir).eval())
    drafter = load_drafter(tmp_path / "out", target, method=method, hot_tokens="off")
    assert drafter.cfg.method == method
    if shared:  # by default the target's lm_head, nothing of it saved; the 40 most frequent answer tokens for a CPU
        assert not drafter.cfg.own_lm_head and drafter.cfg.draft_vocab_size == VOCAB
        assert drafter.lm_head is target.lm_head
        assert log["draft_vocab"] == {"size": VOCAB, "coverage": 1.0} and log["hot_tokens"]["size"] == 40
        hot = json.loads((tmp_path / "out" / "hot_tokens.json").read_text())
        answers = load_shards(data_dir).answer_tokens()
        assert hot["ids"] == sorted(hot["ids"]) and len(set(hot["ids"])) == 40
        assert hot["coverage"] == pytest.approx(float(np.isin(answers, hot["ids"]).mean()), abs=1e-6)
        assert load_drafter(tmp_path / "out", target).drafting_vocab == 40  # on this CPU
        saved = json.loads((tmp_path / "out" / "config.json").read_text())
        assert "draft_vocab_size" in saved and saved["draft_vocab_size"] is None  # SGLang: the target's lm_head
    elif own:
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


def test_the_defaults_are_the_shipped_eagle3_recipe_and_its_loss_flags_stay_eagle3s():
    from training.train import parse_args

    base = ["--data", "regen:x", "--out", "y", "--max-steps", "1"]
    args = parse_args(["--method", "eagle3", *base])
    assert (args.top1_weight, args.ttt_decay, args.chain_start_weight, args.draft_vocab) == (2.0, 0.6, 3.0, None)
    assert not args.align_mask  # the shipped arms trained every step at every slot
    parse_args(["--method", "eagle", *base])  # the EAGLE-3 defaults do not stop an EAGLE-1 run
    for flag in (["--chain-start-weight", "1"], ["--ttt-decay", "0.8"], ["--align-mask"]):
        with pytest.raises(SystemExit):
            parse_args(["--method", "eagle", *base, *flag])


def test_time_budget_stops_training_cleanly(tmp_path):
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    log = train_cli(target_dir, data_dir, tmp_path / "out", "eagle3", "--time-budget-min", "0.0001")
    assert log["stop_reason"] == "time_budget" and (tmp_path / "out" / "config.json").exists()


@cuda
@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle3-own-lm-head"])
def test_cuda_training_run_in_bf16(tmp_path, method):
    from demo.models.checkpoints import load_drafter

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    own = method == "eagle3-own-lm-head"
    method = "eagle3" if own else method
    train_cli(target_dir, data_dir, tmp_path / "out", method, "--max-steps", "3",
              *(["--draft-vocab", "64", "--top1-weight", "1", "--chain-start-weight", "1"] * own), device="cuda")
    log = json.loads((tmp_path / "out" / "train_log.json").read_text())
    assert log["steps"] == 3 and all(np.isfinite(r["loss"]) for r in log["history"])
    assert log["head_loss"] == ("triton" if head_loss_kernel.available() else "torch")  # fused on a GPU
    if method == "eagle3":
        assert all(0 <= r["start_acc"] <= 1 for r in log["history"])
    target = Target(LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to("cuda").eval())
    assert load_drafter(tmp_path / "out", target, method=method).cfg.method == method
