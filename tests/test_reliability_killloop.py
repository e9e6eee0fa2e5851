"""Issue 15, must show: random kill -9s during short runs that checkpoint every step; every run
resumes and ends bit-identical to an uninterrupted one, with no temp file left.

Each kill lands at a random time after the training process reports its start (data loaded,
model built), so it falls anywhere in the steps, the checkpoint writes (temp folder, renames,
``latest``), the pruning of old checkpoints or the final evaluation. The run is then continued
with ``--resume`` (killed again at random, ...) until one process finishes.

CI runs ATTNCONV_KILLS=6 kills (about a minute); the full check (100 kills) is
``ATTNCONV_KILLS=100 python -m pytest -q tests/test_reliability_killloop.py``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from attnconv.train.checkpoint import follow_latest

KILLS = int(os.environ.get("ATTNCONV_KILLS", "6"))


def _config(tmp: Path, cifar_zip: Path) -> Path:
    """tiny_cnn on 10 real images, 5 steps per epoch, 3 epochs, a checkpoint every step."""
    d = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 4}},
        "data": {
            "dataset": str(cifar_zip),
            "max_per_class": 1,
            "eval_max_per_class": 1,
            "cache_dir": str(tmp / "cache"),
        },
        "optim": {"lr": 0.05},
        "train": {
            "epochs": 3,
            "batch_size": 2,
            "threads": 1,
            "progress": False,
            "checkpoint_every": 1,
            "keep_checkpoints": 2,
            "log_every": 1,
        },
    }
    f = tmp / "kill.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def _start(cfg: Path, run: Path) -> subprocess.Popen:
    args = ["train", str(cfg), "--out", str(run)] + (["--resume"] if run.exists() else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "attnconv.cli", *args]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _wait_started(p: subprocess.Popen) -> bool:
    """Until the process prints the last line of its start-up summary (data and model ready);
    False if it ended without one."""
    for line in p.stderr:
        if line.strip().startswith("run folder"):
            return True
    return False


def _weights(run: Path) -> dict:
    return load_file(follow_latest(run / "checkpoints") / "model.safetensors")


@pytest.mark.slow
def test_random_kill_9_loop_resumes_bit_identical(tmp_path, cifar_zip):
    cfg = _config(tmp_path, cifar_zip)
    t0 = time.perf_counter()
    base = _start(cfg, tmp_path / "base")  # uninterrupted (also fills the decoded-image cache)
    assert _wait_started(base), "the training printed no start-up summary"
    t_started = time.perf_counter()
    _, err = base.communicate(timeout=300)
    assert base.returncode == 0, err
    train_s = time.perf_counter() - t_started  # steps + checkpoints + eval after the start line
    assert time.perf_counter() - t0 < 120
    want = _weights(tmp_path / "base")

    rng = random.Random(15)
    runs, kills, resumed = 0, 0, 0
    while kills < KILLS:
        assert runs < 10 * KILLS + 10, f"only {kills} kills landed in {runs} runs"
        run = tmp_path / f"run{runs}"
        runs += 1
        while True:  # one run: kill it at random until a process completes it
            fresh = not run.exists()
            p = _start(cfg, run)
            started = _wait_started(p)
            t_start = time.perf_counter()
            time.sleep(rng.uniform(0, 1.1 * train_s))
            if started and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.communicate(timeout=60)
                kills += 1
                continue
            _, err = p.communicate(timeout=60)
            if fresh:  # the machine's speed now: keep the kill times inside the training
                train_s = time.perf_counter() - t_start
            assert p.returncode == 0, err
            if p.args[-1] == "--resume":
                resumed += 1
            break
        got = _weights(run)
        assert got.keys() == want.keys()
        assert all((got[k] == want[k]).all() for k in want), f"{run} differs after kills"
        left = [q for q in run.rglob("*") if q.name.endswith(".tmp") or q.name.endswith(".old")]
        assert not left, left
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    print(f"{kills} kill -9s over {runs} runs ({resumed} finished by a resumed process)")
