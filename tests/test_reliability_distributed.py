"""kill -9 of a whole distributed run (torchrun agent and both workers, as a machine crash would),
then ``--resume`` under torchrun: exactly the weights of an uninterrupted single-process run
with the same global batch (issue 8, "kill -9 ... extended to mid-epoch and to the distributed
run"). Real torchrun, gloo on 127.0.0.1, real CIFAR-10 images. The kill comes as soon as the
first checkpoint at step >= 4 appears: normally step 4 of a 6-step epoch (mid-epoch); the test
only requires some checkpoint before the end, as a slow poll may see a later one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from attnconv.train.checkpoint import LATEST, load_model
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Trainer
from torchrun_helpers import latest_weights as _weights
from torchrun_helpers import torchrun, train_args, worker_env

STEPS_PER_EPOCH = 6  # 240 images, global batch 40


def _latest_step(run: Path) -> int:
    p = run / "checkpoints" / LATEST
    try:
        return int(p.read_text().strip().split("-")[1])
    except (FileNotFoundError, IndexError, ValueError):
        return -1


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc): torchrun starts its workers in their own
    process groups, so killing the agent's group alone would leave them running."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _torchrun(cfg: Path, out: Path, cache: Path, *extra: str) -> subprocess.Popen:
    cmd, env = torchrun(*train_args(cfg, out, *extra)), worker_env(cache)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_torchrun_kill_9_mid_epoch_then_resume_matches_one_process(tmp_path):
    from conftest import CIFAR_ZIP

    d = {
        # GroupNorm (per sample), no dropout: the 1-process run is the exact reference
        "model": {"name": "tiny_cnn", "kwargs": {"width": 16, "norm": "group"}},
        "data": {
            "dataset": str(CIFAR_ZIP),
            "max_per_class": 24,
            "eval_max_per_class": 2,
            "cache_dir": str(tmp_path / "cache"),
        },
        "optim": {"name": "sgd", "lr": 0.05},
        "train": {
            "epochs": 5,
            "batch_size": 40,
            "log_every": 2,
            "checkpoint_every": 4,
            "threads": 1,
            "progress": False,
        },
    }
    cfg = tmp_path / "kill.yaml"
    cfg.write_text(yaml.safe_dump(d))
    threads = torch.get_num_threads()
    try:
        Trainer(config_from_dict({**d, "out_dir": str(tmp_path / "single")})).fit()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
    single = _weights(tmp_path / "single")

    run = tmp_path / "ddp"
    p = _torchrun(cfg, run, tmp_path / "cache")
    deadline = time.time() + 300
    while _latest_step(run) < 4 and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    for pid in [*_descendants(p.pid), p.pid]:  # both workers and the agent: no handler runs
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, err = p.communicate(timeout=60)
    killed_at = _latest_step(run)
    total = 5 * STEPS_PER_EPOCH
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])
    assert 4 <= killed_at < total, killed_at  # the last checkpoint before the kill
    load_model(run)  # complete and loadable: no half-written checkpoint is ever "latest"

    r = _torchrun(cfg, run, tmp_path / "cache", "--resume")
    _, err = r.communicate(timeout=600)
    assert r.returncode == 0, err[-3000:]
    assert _latest_step(run) == total
    resumed = _weights(run)
    assert resumed.keys() == single.keys()
    for k in single:
        torch.testing.assert_close(resumed[k], single[k], rtol=0, atol=1e-5)
