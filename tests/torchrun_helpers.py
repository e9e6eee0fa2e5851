"""Real torchrun in the tests (gloo on 127.0.0.1, attnconv.train.distributed.torchrun_command),
run again on a new port when another process took the free one first (the full run's two test
processes may each launch torchrun at once; the port is free when picked, bound only later)."""

from __future__ import annotations

import subprocess

from attnconv.train.distributed import PORT_TAKEN, torchrun_command

TRIES = 3


def torchrun(*args: str, procs: int = 2) -> list[str]:
    """``torchrun --nproc-per-node procs`` on 127.0.0.1 and a free port, then ``args``."""
    return [*torchrun_command(procs), *args]


def port_taken(r: subprocess.CompletedProcess) -> bool:
    return r.returncode != 0 and PORT_TAKEN in r.stderr + r.stdout


def run_torchrun(*args: str, procs: int = 2, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of ``torchrun(*args)`` (text, output captured, ``kwargs`` passed), again on
    a new port, up to TRIES times, while the rendezvous port was taken."""
    for _ in range(TRIES):
        r = subprocess.run(torchrun(*args, procs=procs), capture_output=True, text=True, **kwargs)
        if not port_taken(r):
            break
    return r
