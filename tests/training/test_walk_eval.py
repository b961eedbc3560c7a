"""The walk (training/walk_eval.py): the engine's T = 0 acceptance measured on greedy text without
decoding, and the hold-out answers it reads, which no run may train on."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from demo.config import GenerationConfig
from demo.engine import Engine
from tests.training.helpers import cuda, tiny_pair, tiny_run_inputs, train_cli
from training.data import SequenceSet, ShardWriter, load_shards
from training.losses import eagle3_chain_walk, run_target
from training.walk_eval import WalkResult, walk_eval


@pytest.mark.parametrize("method", ["eagle3", "eagle3-shared"])
def test_walk_accepts_what_the_engine_accepted_chain_for_chain(method):
    """On the engine's own greedy output, every chain the walk roots accepts as many drafts as the
    engine's step did (the engine's last step may draft past the text's end), and walk_eval's
    counts over all texts are those chains'."""
    _walk_is_the_engines_run(method, "cpu", "eager")


@cuda
def test_cuda_walk_accepts_what_the_graphed_engine_accepted():
    _walk_is_the_engines_run("eagle3-shared", "cuda", "cudagraph")


def _walk_is_the_engines_run(method: str, device: str, mode: str):
    k = 3
    target, drafter, prompts = tiny_pair(method, 8, device)  # 8 tokens: chains of every length occur
    engine = Engine(target, drafter, mode=mode, max_context=128)
    runs = [list(engine.generate(p, GenerationConfig(max_new_tokens=60, num_spec_tokens=k, stop_token_ids=())))
            for p in prompts]
    aux = tuple(drafter.cfg.aux_layer_ids or target.config.default_aux_layers())
    walked_all, tokens, masks = [], [], []
    for prompt, events in zip(prompts, runs):
        answer = [t for e in events for t in e.token_ids]
        engine_accepted = [e.num_accepted for e in events if e.draft_ids]
        seq, mask = prompt + answer, [False] * len(prompt) + [True] * len(answer)
        tb = run_target(target, torch.tensor([seq], device=device), torch.tensor([mask], device=device), aux)
        walked = eagle3_chain_walk(drafter, tb, k)["accepted"].tolist()
        assert walked == engine_accepted[: len(walked)] and len(engine_accepted) - len(walked) <= 1
        walked_all += walked
        tokens.append(seq)
        masks.append(mask)
    assert set(walked_all) == set(range(k + 1))  # rejections at the first draft, full chains, partial ones
    lengths = [len(t) for t in tokens]
    data = SequenceSet(np.concatenate(tokens).astype(np.uint16), np.concatenate(masks),
                       np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.full(len(tokens), -1, np.int32))
    r = walk_eval(target, drafter, data, k, batch_tokens=256)  # several texts per batch, right-padded
    assert r.accepted_counts == np.bincount(walked_all, minlength=k + 1).tolist()
    assert r.mean_acceptance_length == pytest.approx(1 + np.mean(walked_all))
    assert r.acceptance_per_position == pytest.approx([np.mean(np.array(walked_all) > i) for i in range(k)])


def test_walk_result_reads_like_acceptance_stats():
    r = WalkResult(k=3, chains=4, accepted_counts=[1, 1, 0, 2], teacher_forced_acc=[0.9, 0.8, 0.7], sequences=1,
                   seconds=0.0)
    assert r.mean_acceptance_length == 1 + (0 + 1 + 3 + 3) / 4
    assert r.acceptance_per_position == [0.75, 0.5, 0.5]


def _holdout_prompts_dir(tmp_path):
    return tmp_path / "holdout"


def _holdout_prompts(tmp_path):
    writer = ShardWriter(_holdout_prompts_dir(tmp_path))
    for i in range(5):
        ids = [256] + list(range(1 + i, 6 + i))
        writer.add(ids, [0] * len(ids), 900 + i)
    writer.flush()
    (tmp_path / "holdout" / "meta.json").write_text(json.dumps({"recipe": "prompts-holdout", "sequences": 5}))
    return tmp_path / "holdout"


def test_answers_to_the_holdout_prompts_measure_a_run_and_never_train_one(tmp_path):
    from training.data import main as data_main
    from training.walk_eval import main as eval_main

    target_dir, data_dir = tiny_run_inputs(tmp_path)
    regen = ["regen", "--prompts", str(_holdout_prompts(tmp_path)), "--target", str(target_dir), "--out",
             str(tmp_path / "held-greedy"), "--device", "cpu", "--batch-size", "4", "--max-new-tokens", "12"]
    assert data_main(regen) == 0
    assert json.loads((tmp_path / "held-greedy" / "meta.json").read_text())["split"] == "holdout"
    writer = ShardWriter(tmp_path / "train-prompts")  # training prompts: their answers are training data
    writer.add([256, 7, 8, 9], [0] * 4, 3)
    writer.flush()
    train_regen = [a if a != str(_holdout_prompts_dir(tmp_path)) else str(tmp_path / "train-prompts") for a in regen]
    with pytest.raises(SystemExit, match="holdout"):  # no directory mixes the two
        data_main(train_regen)
    train_regen[train_regen.index("--out") + 1] = str(tmp_path / "train-greedy")
    assert data_main(train_regen) == 0
    assert json.loads((tmp_path / "train-greedy" / "meta.json").read_text())["split"] == "train"
    with pytest.raises(SystemExit, match="hold-out"):
        train_cli(target_dir, tmp_path / "held-greedy", tmp_path / "bad", "eagle3", "--max-steps", "1")
    log = train_cli(target_dir, data_dir, tmp_path / "out", "eagle3", "--max-steps", "3",
                 "--eval-data", f"regen:{tmp_path / 'held-greedy'}", "--eval-every-min", "1e-9",
                 "--save-dtype", "float32")
    evals = log["evals"]
    assert [e["step"] for e in evals] == [1, 2, 3, 3]  # after every step (a tiny period), and at the end
    assert all(e["eval"]["chains"] >= 5 and e["eval"]["sequences"] == 5 for e in evals)
    out = eval_main(["--drafter", str(tmp_path / "out"), "--data", f"regen:{tmp_path / 'held-greedy'}",
                     "--target", str(target_dir), "--device", "cpu", "-k", "3"])
    saved = out["runs"][str(tmp_path / "out")]  # the saved head walks its chains as the run's last walk did
    assert saved["accepted_counts"] == evals[-1]["eval"]["accepted_counts"]
    assert len(load_shards(tmp_path / "held-greedy")) == 5


def test_eval_flags_are_eagle3s_and_need_their_data():
    from training.train import parse_args

    base = ["--data", "regen:x", "--out", "y", "--max-steps", "1"]
    with pytest.raises(SystemExit):
        parse_args(["--method", "eagle", *base, "--eval-data", "regen:z"])
    with pytest.raises(SystemExit):
        parse_args(["--method", "eagle3", *base, "--eval-every-min", "1"])
    assert parse_args(["--method", "eagle3", *base, "--eval-data", "regen:z"]).eval_data == "regen:z"
