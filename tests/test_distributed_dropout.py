"""Dropout under real torchrun (2 processes, gloo on 127.0.0.1): every rank draws its own masks
(rank 0 the one-process run's, the others per step from (seed, step, rank)), and a run stopped
and resumed draws and ends as an uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from torchrun_helpers import latest_weights as _weights
from torchrun_helpers import run_torchrun, worker_env

PROBE = Path(__file__).with_name("dropout_probe.py")


def _train(cfg: Path, out: Path, *extra: str, procs: int = 2) -> list[list[int]]:
    """The probe's run on ``procs`` processes; the seeds each rank drew."""
    env = worker_env(PYTHONPATH=str(PROBE.parent))
    args = (str(PROBE), "train", str(cfg), "--out", str(out), *extra)
    if procs > 1:
        r = run_torchrun(*args, procs=procs, env=env, timeout=300)
    else:
        r = subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300
        )
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads((out / f"seeds-rank{i}.json").read_text()) for i in range(procs)]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    from conftest import CIFAR_ZIP

    tmp = tmp_path_factory.mktemp("dist_dropout")
    d = {  # the paper's attention model, small: hidden dropout 0.1 in every layer
        "model": {
            "name": "sa_quadratic",
            "kwargs": {
                "hidden_size": 16,
                "num_layers": 1,
                "num_heads": 4,
                "ff_size": 16,
                "downsample": 4,
            },
        },
        "data": {
            "dataset": str(CIFAR_ZIP),
            "max_per_class": 4,
            "eval_max_per_class": 1,
            "cache_dir": str(tmp / "cache"),
        },
        "optim": {"name": "sgd", "lr": 0.05},
        "train": {
            "epochs": 1,
            "batch_size": 8,
            "log_every": 1,
            "checkpoint_every": 2,
            "threads": 1,
            "progress": False,
        },
    }
    path = tmp / "dropout.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.mark.slow
def test_ranks_draw_their_own_dropout_and_resume_draws_the_same(cfg):
    tmp = cfg.parent
    one = _train(cfg, tmp / "one", procs=1)[0]
    rank0, rank1 = _train(cfg, tmp / "two")
    steps = 5  # 40 images, global batch 8
    assert len(one) == len(rank0) == len(rank1) and len(one) % steps == 0 and one
    assert rank0 == one  # rank 0: the one-process run's stream
    per = len(one) // steps
    for s in range(steps):  # no mask of rank 1 is rank 0's
        assert not set(rank0[s * per : (s + 1) * per]) & set(rank1[s * per : (s + 1) * per])
    # stopped after step 3 and resumed: the same seeds on every rank, the same weights
    first = _train(cfg, tmp / "resumed", "--stop-at-step", "3")
    rest = _train(cfg, tmp / "resumed", "--resume")
    assert [a + b for a, b in zip(first, rest)] == [rank0, rank1]
    resumed, whole = _weights(tmp / "resumed"), _weights(tmp / "two")
    for k in whole:
        torch.testing.assert_close(resumed[k], whole[k], rtol=0, atol=0)
