"""The C++ kernels' build cache, which never waits without bound and never loads a damaged build.

- Key: the sources' digest, torch's version, the Python ABI and the CPU's instruction set (the
  build targets ``-march=native``: a home folder shared by an AVX2 and an AVX-512 machine, or by
  two Pythons, keeps one build each), not the checkout's path (every clone of the same sources
  shares one build).
- Lock: ``fcntl.flock`` on the build folder's ``attnconv.lock``. The kernel releases it when its
  holder dies (a kill -9, an out-of-memory kill, a job timeout), so a killed build leaves nothing
  to wait on. A live build elsewhere is waited for ``LOCK_WAIT_S``, then this process runs the
  dense kernels with one line, and builds next time. torch's own lock file (``lock``, on which its
  loader waits forever) is removed while the flock is held: no live build of ours owns it.
- Validity: a build counts once its ``.sha256`` stamp (written after the module imported, by an
  atomic rename) matches the library's bytes. A half-written or damaged library is rebuilt, not
  loaded (loading one dies by SIGBUS or SIGILL). A valid build loads directly, without torch's
  loader or a lock: a read-only cache works.
- No orphans: the compiler runs in a child that ends with its whole tree (build_tree.py), holding
  the flock until its last compiler is gone; a compiler left by a build killed outright is killed
  by the next build before it cleans the folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from attnconv.catalog import file_digest
from attnconv.cpuinfo import cpu_flags
from attnconv.warn import warn

from . import build_tree

LOCK_WAIT_S = 20.0  # a live build elsewhere takes minutes: dense kernels this time instead
LOCK = "attnconv.lock"


@cache
def cpu_key() -> str:
    """A short digest of the CPU's instruction-set flags (what -march=native compiles for)."""
    flags = cpu_flags()
    if flags is None:
        return platform.machine() or "cpu"
    return hashlib.sha1(" ".join(sorted(flags)).encode()).hexdigest()[:8]


def python_abi() -> str:
    """The extension ABI of this Python (``cpython-311-x86_64-linux-gnu``): a library built for
    one Python does not load into another, and a cache folder may be shared by two."""
    return sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or "python"


def module_name(prefix: str, files: list[Path], flags: list[str] = ()) -> str:
    """``prefix``_<torch version>_<digest of the sources, the compiler flags, the CPU's
    instruction set and the Python ABI>."""
    key = " ".join(flags) + cpu_key() + python_abi()
    digest = hashlib.sha1(b"".join(f.read_bytes() for f in files) + key.encode())
    version = re.sub(r"\W", "_", torch.__version__)
    return f"{prefix}_{version}_{digest.hexdigest()[:10]}"


def compiler() -> str | None:
    """The C++ compiler torch's loader would use, or None."""
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def valid(library: Path) -> bool:
    """The library exists and its stamp matches its bytes."""
    stamp = library.with_suffix(".sha256")
    try:
        return stamp.read_text().strip() == file_digest(library)
    except OSError:
        return False


def stamp(library: Path) -> None:
    """Mark a library whose module imported as valid (an atomic rename of the stamp)."""
    tmp = library.with_suffix(f".sha256.{os.getpid()}")
    tmp.write_text(file_digest(library))
    os.replace(tmp, library.with_suffix(".sha256"))


def import_library(name: str, library: Path):
    """The extension module of a valid library, imported directly (no lock, nothing written)."""
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def locked_build(
    build_dir: Path, library: Path, build: Callable[[int], object], wait_s: float = LOCK_WAIT_S
) -> object | None:
    """Run ``build(lock_fd)`` (which writes ``library``; a child it starts keeps the lock by
    inheriting ``lock_fd``) under the build folder's flock and stamp what it made; returns its
    result, or None when another live process held the lock for ``wait_s`` (``library`` is then
    not touched). A valid library found once the lock is held is not rebuilt (returns True)."""
    with open(build_dir / LOCK, "a") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.2)
        try:
            if valid(library):  # another process built it while we waited
                return True
            build_tree.kill_strays(build_dir)  # compilers of a build killed outright
            for p in build_dir.iterdir():  # a killed or damaged build: start clean
                if p.name != LOCK:
                    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
            out = build(f.fileno())
            stamp(library)
            return out
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_said: set[str] = set()


def say_once(message: str) -> None:
    """One line per process: why the fused kernels are not used."""
    if message not in _said:
        _said.add(message)
        warn(message)


@dataclass(frozen=True)
class Extension:
    """A C++ extension: its sources (compiled) and headers (included), its compiler and linker
    flags, and the environment variable that turns it off. ``name`` is its cache key, one place:
    what ``load`` builds or imports, what ``attnconv build-kernels`` reports."""

    prefix: str
    sources: tuple[Path, ...]
    headers: tuple[Path, ...] = ()
    flags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    disable_var: str = "ATTNCONV_NO_FUSED"

    @property
    def name(self) -> str:
        return module_name(
            self.prefix, [*self.sources, *self.headers], [*self.flags, *self.ldflags]
        )


def load(ext: Extension):
    """The compiled module of ``ext``, or None (with one line saying why, once per process):
    a valid cached build is imported; otherwise built once per machine under the flock."""
    from torch.utils import cpp_extension

    name, disable_var = ext.name, ext.disable_var
    try:
        build_dir = Path(cpp_extension._get_build_directory(name, False))
    except OSError as e:
        say_once(f"attnconv: no folder for the fused CPU kernels ({e}); using the dense kernels")
        return None
    library = build_dir / f"{name}.so"
    if valid(library):
        return import_library(name, library)
    if compiler() is None:
        say_once(
            f"attnconv: no C++ compiler on PATH: the fused CPU kernels are not built, the "
            f"dense kernels run (set {disable_var}=1 to skip the attempt)"
        )
        return None

    def build(lock_fd: int):
        print(
            f"attnconv: building the fused CPU kernels into {build_dir} (once per machine and "
            "version; under a minute on 2 cores; other processes run the dense kernels "
            "meanwhile)",
            file=sys.stderr,
            flush=True,
        )
        t0 = time.monotonic()
        spec = {
            "name": name,
            "sources": [str(f) for f in ext.sources],
            "cflags": list(ext.flags),
            "ldflags": list(ext.ldflags),
            "build_dir": str(build_dir),
        }
        build_tree.build(spec, lock_fd)  # in a child that ends with its compilers
        print(f"attnconv: built in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        return True

    try:
        out = locked_build(build_dir, library, build)
    except Exception as e:  # no ninja, headers missing, a compile error, a read-only cache
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        say_once(
            f"attnconv: the fused CPU kernels did not build ({first}); using the dense "
            f"kernels (set {disable_var}=1 to skip the attempt)"
        )
        return None
    if out is None:
        say_once(
            f"attnconv: another process is building the fused CPU kernels ({build_dir}); "
            "using the dense kernels this time"
        )
        return None
    return import_library(name, library)
