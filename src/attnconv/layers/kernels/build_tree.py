"""A kernel build in a child process that takes its whole compiler tree with it when it ends.

ninja starts each compiler in a process group of its own, so killing a build's process group (a
kill -9, a Ctrl-C, a job timeout) used to leave its compilers running, writing into the folder the
next build had just cleaned. The build now runs in a child (this file, run as a script: the
standard library and torch's loader only) that

- is a subreaper (``PR_SET_CHILD_SUBREAPER``): a compiler whose ninja died stays its descendant;
- sits in a session of its own, so a signal to the caller's process group does not kill it before
  it has cleaned up, and gets SIGTERM when the caller dies (``PR_SET_PDEATHSIG``);
- on SIGTERM, SIGINT or SIGHUP, and after a failed build, kills every descendant it has (found in
  ``/proc``, again until none is left) and reaps them;
- holds the build folder's flock (inherited from the caller), so no next build starts cleaning
  before the last compiler is gone.

Linux (``/proc``, ``prctl``); elsewhere the child only builds.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FAILED = "attnconv-build-failed: "  # the child's one line on stdout when the build fails
TOOLS = frozenset(  # what a C++ extension's build runs in its folder (ninja's cwd)
    "ninja c++ g++ gcc cc cc1 cc1plus as ld ld.bfd ld.gold collect2 clang clang++".split()
)


def _parents() -> dict[int, int]:
    """Every live (not zombie) process's parent, from ``/proc/PID/stat``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z":
            out[int(entry)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid``, parents before children."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def kill_tree(timeout_s: float = 10.0) -> None:
    """SIGKILL every descendant of this process until none is left (a ninja may start one more
    compiler between a listing and its kill), reaping them (a subreaper inherits the orphans)."""
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + timeout_s
    while (below := descendants(os.getpid())) and time.monotonic() < deadline:
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
        _reap()
    _reap()


def kill_strays(build_dir: Path) -> list[int]:
    """SIGKILL the build tools (ninja, a compiler, an assembler, a linker) of this user working in
    ``build_dir``: left by a build whose child was killed outright too. Called under the flock,
    when no live build owns the folder; returns their ids."""
    killed = []
    if not os.path.isdir("/proc"):
        return killed
    here = os.path.realpath(build_dir)
    for pid in _parents():
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name in TOOLS and os.readlink(f"/proc/{pid}/cwd") == here:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            continue  # gone, or not ours
    return killed


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the build still runs, its tree is not tracked


def _on_signal(signum, frame) -> None:
    kill_tree()
    os._exit(128 + signum)


def _child(spec: dict) -> int:
    if sys.platform.startswith("linux"):
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    if os.getppid() != spec["parent"]:  # the caller died before the death signal was set
        return 1
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(
            name=spec["name"],
            sources=spec["sources"],
            extra_cflags=spec["cflags"],
            extra_ldflags=spec["ldflags"],
            build_directory=spec["build_dir"],
        )
    except Exception as e:  # a compile error, no ninja: one line back to the caller
        kill_tree()
        text = str(e).strip()
        print(FAILED + (text.splitlines()[0][:200] if text else type(e).__name__), flush=True)
        return 1
    return 0


def build(spec: dict, lock_fd: int | None = None) -> None:
    """Build ``spec`` (name, sources, cflags, ldflags, build_dir) in a child process that ends
    with its whole compiler tree; raises RuntimeError with one line when the build fails. A
    KeyboardInterrupt (or any exception) here stops the child and its compilers first."""
    spec = {**spec, "parent": os.getpid()}
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        pass_fds=() if lock_fd is None else (lock_fd,),
    )
    try:
        out, _ = child.communicate()
    except BaseException:
        child.terminate()  # the child kills its descendants, then exits
        child.wait()
        raise
    if child.returncode != 0:
        lines = [line for line in out.splitlines() if line.startswith(FAILED)]
        why = lines[-1][len(FAILED) :] if lines else f"the build exited with {child.returncode}"
        raise RuntimeError(why)


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
