"""A kernel build ends with its whole compiler tree (layers/kernels/build_tree.py): the real fused
kernels built in a subprocess with a fresh cache folder, killed mid-compile (kill -9 of its
process group, as a job timeout does, or Ctrl-C); no ninja or compiler of it survives, and the
folder's lock is free again. A compiler left by a build killed outright is killed by the next."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnconv.layers.kernels import build

BUILD = "from attnconv.layers.kernels import fused; print(fused.extension() is not None)"


def _marked(marker: bytes) -> dict[int, str]:
    """Live processes whose environment holds ``marker`` (every descendant of the build inherits
    it, whichever process group or parent it ends up in), by id: their command names."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
        except (OSError, IndexError):
            continue
        if marker in env and state != "Z":
            out[int(entry)] = name
    return out


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tree is tracked on Linux")
@pytest.mark.parametrize("kill", ["kill -9 the group", "Ctrl-C"])
def test_a_build_killed_mid_compile_leaves_no_compiler(tmp_path, kill):
    if build.compiler() is None:
        pytest.skip("no C++ compiler")
    marker = f"TORCH_EXTENSIONS_DIR={tmp_path}".encode()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    env.pop("ATTNCONV_NO_FUSED", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD], env=env, start_new_session=True, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600  # the import of torch, on a loaded machine
        while "cc1plus" not in _marked(marker).values():
            assert proc.poll() is None and time.monotonic() < deadline, "no compiler started"
            time.sleep(0.05)
        if kill == "Ctrl-C":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=600)  # minutes only on a loaded machine
        deadline = time.monotonic() + 120
        while (left := _marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"survived the build: {sorted(left.values())}"
        (folder,) = [p for p in tmp_path.iterdir() if (p / build.LOCK).exists()]
        with open(folder / build.LOCK, "a") as f:  # the child held it to its exit: free then
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:  # a process may be past its memory, not its files
                    assert time.monotonic() < deadline, "the build's lock is still held"
                    time.sleep(0.1)
    finally:
        for pid in _marked(marker):  # whatever the test found alive, so none outlives it
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_compiler_left_in_the_folder_is_killed_by_the_next_build(tmp_path):
    """A build whose child was killed too (kill -9 of every process by name) leaves its compilers:
    the next build kills those working in its folder before cleaning it, and no other."""
    tool = tmp_path / "bin" / "cc1plus"  # a stand-in compiler: sleep under a compiler's name
    tool.parent.mkdir()
    tool.symlink_to(Path(subprocess.check_output(["which", "sleep"], text=True).strip()))
    folder, elsewhere = tmp_path / "build", tmp_path / "other"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "half.o").write_bytes(b"half-written object")
    stray = subprocess.Popen([str(tool), "60"], cwd=folder)
    bystander = subprocess.Popen([str(tool), "60"], cwd=elsewhere)
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{stray.pid}/comm").read_text().strip() != "cc1plus":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        library = folder / "mod.so"

        def run(lock_fd: int):
            library.write_bytes(b"built")
            return "module"

        assert build.locked_build(folder, library, run) == "module"
        assert stray.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
        assert not (folder / "half.o").exists() and build.valid(library)
    finally:
        for p in (stray, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()
