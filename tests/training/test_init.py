"""Where a run's drafter starts (training/init.py): a saved drafter's weights and layout come back
exactly, a resumed run keeps its layout, and a widened MLP computes what the narrow one did."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from demo.config import GenerationConfig
from demo.engine import Engine
from demo.models.checkpoints import load_drafter
from demo.target import Target
from tests.training.helpers import VOCAB, tiny_run_inputs, train_cli

F32 = ("--save-dtype", "float32")


def tensors(d) -> dict[str, torch.Tensor]:
    """Every tensor a saved drafter's shards hold."""
    return {k: v for f in sorted(d.glob("model*.safetensors")) for k, v in load_file(f).items()}


def test_resume_keeps_the_runs_feature_layers(tmp_path):
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    train_cli(target_dir, data_dir, tmp_path / "r", "eagle3", "--max-steps", "1", "--aux-layers", "1,3,5")
    resumed = train_cli(target_dir, data_dir, tmp_path / "r", "eagle3", "--max-steps", "2", "--resume")
    assert list(resumed["drafter"]["config"]["aux_layer_ids"]) == [1, 3, 5]
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]  # vLLM's field; SGLang's eagle_config holds [0, 2, 4]
    with pytest.raises(SystemExit, match="aux layers"):
        train_cli(target_dir, data_dir, tmp_path / "r", "eagle3", "--max-steps", "3", "--resume",
                  "--aux-layers", "2,3,4")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_init_drafter_starts_from_the_saved_weights_and_draft_vocabulary(tmp_path, method):
    """A run started with --init-drafter and a zero learning rate saves back exactly the drafter it
    started from (weights, d2t and t2d of an lm_head of its own), even when its flags would pick
    another draft vocabulary."""
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    train_cli(target_dir, data_dir, tmp_path / "a", method, "--max-steps", "2", "--draft-vocab", "64", *F32)
    log = train_cli(target_dir, data_dir, tmp_path / "b", method, "--max-steps", "2", "--lr", "0",
                    "--draft-vocab", "32", "--init-drafter", str(tmp_path / "a"), *F32)
    assert log["steps"] == 2
    a, b = tensors(tmp_path / "a"), tensors(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    target = Target(LlamaForCausalLM.from_pretrained(target_dir).eval())
    assert load_drafter(tmp_path / "b", target).cfg.draft_vocab_size == (64 if method == "eagle3" else VOCAB)


def test_a_head_through_the_targets_lm_head_stays_one_from_a_saved_drafter_and_on_resume(tmp_path):
    """A fresh EAGLE-3 drafts through the target's lm_head (nothing of it saved); a run from it, or
    resumed, keeps doing so whatever --draft-vocab says, and saves back exactly what it started
    from at a zero learning rate."""
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    one_step = ("--max-steps", "1", *F32)
    log = train_cli(target_dir, data_dir, tmp_path / "a", "eagle3", *one_step)
    a = tensors(tmp_path / "a")
    assert not {"lm_head.weight", "d2t", "t2d"} & set(a) and log["draft_vocab"] == {"size": VOCAB, "coverage": 1.0}
    assert not log["drafter"]["config"]["own_lm_head"] and (tmp_path / "a" / "hot_tokens.json").exists()
    log = train_cli(target_dir, data_dir, tmp_path / "b", "eagle3", "--lr", "0", "--draft-vocab", "64",
                    "--init-drafter", str(tmp_path / "a"), *one_step)
    b = tensors(tmp_path / "b")
    assert not log["drafter"]["config"]["own_lm_head"] and log["draft_vocab"]["size"] == VOCAB
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log = train_cli(target_dir, data_dir, tmp_path / "b", "eagle3", "--resume", "--draft-vocab", "64",
                    "--max-steps", "2", *F32)
    assert log["steps"] == 2 and not log["drafter"]["config"]["own_lm_head"]
    assert set(tensors(tmp_path / "b")) == set(a)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_widened_mlp_computes_what_the_narrow_one_did_and_its_new_units_learn(tmp_path, method):
    """--intermediate-size wider than the --init-drafter's: the saved units keep their weights, the
    new ones add nothing at first (zero down_proj columns), so the drafts are the narrow head's;
    training then moves them, and a resumed run keeps the width."""
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    train_cli(target_dir, data_dir, tmp_path / "a", method, "--max-steps", "1", *F32)
    train_cli(target_dir, data_dir, tmp_path / "b", method, "--max-steps", "1", "--lr", "0",
              "--intermediate-size", "160", "--init-drafter", str(tmp_path / "a"), *F32)
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
                    "--init-drafter", str(tmp_path / "a"), *F32)
    assert load_file(tmp_path / "c" / "model.safetensors")[down][:, 96:].abs().sum() > 0  # the new units learn
    assert log["drafter"]["config"]["intermediate_size"] == 160
    resumed = train_cli(target_dir, data_dir, tmp_path / "c", method, "--max-steps", "3", "--resume", *F32)
    assert resumed["steps"] == 3 and resumed["drafter"]["config"]["intermediate_size"] == 160
    with pytest.raises(SystemExit, match="narrower"):
        train_cli(target_dir, data_dir, tmp_path / "d", method, "--max-steps", "1", "--intermediate-size", "64",
                  "--init-drafter", str(tmp_path / "a"))
