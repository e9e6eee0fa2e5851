"""Running Python the way a GPU compile runs: in a subprocess without TRITON_INTERPRET, so that
triton.jit builds for Triton's compiler, not its interpreter (tests/conftest.py sets it here)."""

from __future__ import annotations

import os
import subprocess
import sys


def compiled_python(*args: str, timeout: int = 600) -> str:
    """stdout of ``python *args`` without TRITON_INTERPRET; a failure asserts with its tails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    return out.stdout
