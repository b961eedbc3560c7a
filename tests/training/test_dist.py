"""Data-parallel training (training/dist.py) through torchrun, on two CPU ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

from demo.models.checkpoints import load_drafter
from demo.target import Target
from tests.training.helpers import tiny_hf, tiny_run_inputs
from training.data import length_batches, load_shards


def test_two_rank_data_parallel_run_stays_in_lockstep_and_saves_one_drafter(tmp_path):
    """torchrun with 2 CPU ranks (gloo): averaged gradients keep both ranks' weights identical,
    every rank takes half the epoch's batches, rank 0 alone writes the drafter and the log."""
    target_dir, data_dir = tiny_run_inputs(tmp_path)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
           "-m", "training.train", "--method", "eagle3", "--target", str(target_dir), "--data", f"regen:{data_dir}",
           "--out", str(tmp_path / "ddp"), "--device", "cpu", "--batch-tokens", "512", "--max-len", "128",
           "--draft-vocab", "64", "--ttt-steps", "3", "--log-every", "1", "--no-progress", "--epochs", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    log = json.loads((tmp_path / "ddp" / "train_log.json").read_text())
    assert log["world_size"] == 2 and log["ranks_in_sync"] is True
    lengths = load_shards(data_dir).lengths
    batches = len(length_batches(np.minimum(lengths, 128), 512, np.random.default_rng([0, 0])))
    assert log["steps"] == batches // 2  # each global step is one batch per rank
    assert done.stdout.count("drafter saved to") == 1  # one voice
    target = Target(tiny_hf(seed=5))
    assert load_drafter(str(tmp_path / "ddp"), target).cfg.method == "eagle3"
    # a batch per epoch for two ranks: refused, not an endless loop over empty epochs
    cmd[cmd.index("--batch-tokens") + 1] = "100000"
    done = subprocess.run(cmd[:-2] + ["--max-steps", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0 and "fewer batches per epoch than the 2 ranks" in done.stderr
