"""Real torchrun in the tests (gloo on 127.0.0.1, attnconv.train.distributed.torchrun_command:
its rendezvous store binds a free port itself, so the full run's two test processes may each
launch torchrun at once)."""

from __future__ import annotations

import subprocess

from attnconv.train.distributed import torchrun_command


def torchrun(*args: str, procs: int = 2) -> list[str]:
    """``torchrun --nproc-per-node procs`` on 127.0.0.1, then ``args``."""
    return [*torchrun_command(procs), *args]


def run_torchrun(*args: str, procs: int = 2, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of ``torchrun(*args)`` (text, output captured, ``kwargs`` passed)."""
    return subprocess.run(torchrun(*args, procs=procs), capture_output=True, text=True, **kwargs)
