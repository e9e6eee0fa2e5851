"""Helpers of the training tests (test_train*.py): a small real-CIFAR config, the run folder's
weights and latest step, the CLI in a subprocess. Each test module sets the decoded-images cache
it shares (``use_cache``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnconv.train.checkpoint import LATEST

ROOT = Path(__file__).resolve().parents[1]
_CACHE: list[Path] = []  # decoded-images cache shared by one test module's runs


def use_cache(folder: Path) -> None:
    """The decoded-images cache of the runs that follow (one per test module)."""
    _CACHE[:] = [folder]


def small(cifar: Path, out: Path, **sections) -> dict:
    """A config dict: tiny_cnn on 40 real images per class, 8 steps per epoch, 5 epochs."""
    d = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 32}},
        "data": {
            "dataset": str(cifar),
            "max_per_class": 40,
            "eval_max_per_class": 2,
            "cache_dir": str(_CACHE[0]),
        },
        "optim": {"name": "sgd", "lr": 0.05},
        "train": {
            "epochs": 5,
            "batch_size": 50,
            "log_every": 4,
            "checkpoint_every": 3,
            "threads": 1,
            "progress": False,
        },
        "out_dir": str(out),
    }
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v} if isinstance(v, dict) else v
    return d


def weights(run: Path) -> dict[str, torch.Tensor]:
    ck = run / "checkpoints"
    return load_file(ck / (ck / LATEST).read_text().strip() / "model.safetensors")


def latest_step(run: Path) -> int:
    p = run / "checkpoints" / LATEST
    return int(p.read_text().strip().split("-")[1]) if p.is_file() else -1


def train_until_step(cfg_file: Path, run: Path, step: int) -> subprocess.Popen:
    """Start `attnconv train` into ``run``; return once it has checkpointed ``step`` (or died,
    or 120 s passed)."""
    p = cli("train", str(cfg_file), "--out", str(run))
    deadline = time.time() + 120
    while latest_step(run) < step and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    return p


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "ATTNCONV_CACHE": str(_CACHE[0]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "attnconv.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
