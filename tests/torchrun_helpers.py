"""Real torchrun in the tests (gloo on 127.0.0.1): its command line, and a run that takes a new
port when another process took the free one first (the full run's two test processes may each
launch torchrun at once; the port is free when picked, bound only later)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

TRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, procs: int = 2) -> list[str]:
    """``torchrun --nproc-per-node procs`` on 127.0.0.1 and a free port, then ``args``."""
    found = shutil.which("torchrun")
    launcher = [found] if found else [sys.executable, "-m", "torch.distributed.run"]
    port = str(free_port())
    rendezvous = ["--master-addr", "127.0.0.1", "--master-port", port]
    return [*launcher, "--nproc-per-node", str(procs), *rendezvous, *args]


def port_taken(r: subprocess.CompletedProcess) -> bool:
    said = r.stderr + r.stdout
    return r.returncode != 0 and ("EADDRINUSE" in said or "address already in use" in said)


def run_torchrun(*args: str, procs: int = 2, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of ``torchrun(*args)`` (text, output captured, ``kwargs`` passed), again on
    a new port, up to TRIES times, while the rendezvous port was taken."""
    for _ in range(TRIES):
        r = subprocess.run(torchrun(*args, procs=procs), capture_output=True, text=True, **kwargs)
        if not port_taken(r):
            break
    return r
