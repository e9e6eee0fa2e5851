"""Real torchrun in the tests (gloo on 127.0.0.1, attnconv.train.distributed.torchrun_command:
its rendezvous store binds a free port itself, so the full run's two test processes may each
launch torchrun at once), and what the torchrun test files share: ``attnconv train`` under
torchrun with one thread a worker, and the weights of a run's latest checkpoint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnconv.train.checkpoint import LATEST
from attnconv.train.distributed import torchrun_command


def torchrun(*args: str, procs: int = 2) -> list[str]:
    """``torchrun --nproc-per-node procs`` on 127.0.0.1, then ``args``."""
    return [*torchrun_command(procs), *args]


def run_torchrun(*args: str, procs: int = 2, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of ``torchrun(*args)`` (text, output captured, ``kwargs`` passed)."""
    return subprocess.run(torchrun(*args, procs=procs), capture_output=True, text=True, **kwargs)


def worker_env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment with one thread a worker, ``ATTNCONV_CACHE`` when ``cache`` is
    given, and ``extra``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    if cache is not None:
        env["ATTNCONV_CACHE"] = str(cache)
    return env


def train_args(cfg: Path, out: Path, *extra: str) -> tuple[str, ...]:
    """``-m attnconv.cli train cfg --out out``, then ``extra``: what torchrun runs."""
    return ("-m", "attnconv.cli", "train", str(cfg), "--out", str(out), *extra)


def torchrun_train(
    cfg: Path, out: Path, *extra: str, cache: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``attnconv train`` under torchrun, 2 processes (``run_torchrun``, ``worker_env(cache)``)."""
    return run_torchrun(*train_args(cfg, out, *extra), env=worker_env(cache), timeout=timeout)


def latest_weights(run: Path) -> dict[str, torch.Tensor]:
    """The model weights of ``run``'s latest checkpoint."""
    ck = run / "checkpoints"
    return load_file(ck / (ck / LATEST).read_text().strip() / "model.safetensors")
