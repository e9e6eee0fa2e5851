"""The C++ kernels' build cache (layers/kernels/build.py) as an adversarial user meets it: a build
killed while it holds the lock, a live build elsewhere, a damaged library, no compiler, a valid
build loaded without the lock. Real processes, real flocks, a real (tiny) extension library."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
import warnings
from pathlib import Path

from attnconv.layers.kernels import build

HOLD = textwrap.dedent("""
    import fcntl, sys, time
    from pathlib import Path
    d = Path(sys.argv[1])
    f = open(d / "attnconv.lock", "a")
    fcntl.flock(f, fcntl.LOCK_EX)
    (d / "lock").touch()                       # torch's own baton, as a build leaves it
    (d / "mod.so").write_bytes(b"half-writ")   # a library being linked
    print("holding", flush=True)
    time.sleep(120)
""")


def _holder(build_dir: Path) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(build_dir)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "holding"
    return p


def _writer(library: Path, payload: bytes = b"built library"):
    calls = []

    def run(lock_fd: int):
        assert lock_fd >= 0  # the lock's descriptor, for a child to keep the lock by
        calls.append(1)
        library.write_bytes(payload)
        return "module"

    return run, calls


def test_a_live_build_elsewhere_is_waited_a_bounded_time(tmp_path):
    library = tmp_path / "mod.so"
    holder = _holder(tmp_path)
    try:
        run, calls = _writer(library)
        t0 = time.monotonic()
        assert build.locked_build(tmp_path, library, run, wait_s=1.0) is None
        assert time.monotonic() - t0 < 10 and not calls
        assert library.read_bytes() == b"half-writ"  # the other build's file is not touched
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_a_build_killed_while_it_holds_the_lock_leaves_nothing_to_wait_on(tmp_path):
    """kill -9 during the build: the flock dies with it; the next process removes torch's stale
    baton and the half-written library, builds, and stamps the new library valid."""
    library = tmp_path / "mod.so"
    holder = _holder(tmp_path)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (tmp_path / "lock").exists() and not build.valid(library)
    run, calls = _writer(library)
    t0 = time.monotonic()
    assert build.locked_build(tmp_path, library, run, wait_s=30.0) == "module"
    assert time.monotonic() - t0 < 5 and calls == [1]
    assert build.valid(library) and not (tmp_path / "lock").exists()


def test_a_damaged_library_is_rebuilt_not_loaded(tmp_path):
    library = tmp_path / "mod.so"
    run, calls = _writer(library)
    build.locked_build(tmp_path, library, run)
    assert build.valid(library)
    assert build.locked_build(tmp_path, library, run) is True and calls == [1]  # valid: kept
    data = bytearray(library.read_bytes())
    data[3] ^= 0xFF  # flipped bits
    library.write_bytes(bytes(data))
    assert not build.valid(library)
    assert build.locked_build(tmp_path, library, run) == "module" and calls == [1, 1]
    assert build.valid(library)


def test_the_cache_key_names_the_cpu_not_the_checkout(tmp_path):
    a, b = tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"
    for f in (a, b):
        f.parent.mkdir()
        f.write_text("int f() { return 1; }")
    assert build.module_name("x", [a]) == build.module_name("x", [b])  # two clones share it
    assert build.cpu_key() in open("/proc/cpuinfo").read() or len(build.cpu_key()) == 8


def test_the_cache_key_has_the_python_abi(tmp_path, monkeypatch):
    """Two Pythons sharing a cache folder build one library each: a module built for one does
    not load into the other."""
    src = tmp_path / "k.cpp"
    src.write_text("int f() { return 1; }\n")
    here = build.module_name("x", [src])
    monkeypatch.setattr(build, "python_abi", lambda: "cpython-312-x86_64-linux-gnu")
    assert build.module_name("x", [src]) != here


def _tiny_extension(build_dir: Path, name: str) -> Path:
    """A real CPython extension library named ``name`` (compiled in well under a second)."""
    src = build_dir / "tiny.c"
    src.write_text(
        textwrap.dedent(f"""
        #include <Python.h>
        static struct PyModuleDef m = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};
        PyMODINIT_FUNC PyInit_{name}(void) {{
            PyObject *mod = PyModule_Create(&m);
            PyModule_AddIntConstant(mod, "answer", 42);
            return mod;
        }}
    """)
    )
    library = build_dir / f"{name}.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            str(src),
            "-o",
            str(library),
        ],
        check=True,
    )
    src.unlink()
    return library


def test_a_valid_build_loads_without_lock_or_writes(tmp_path, monkeypatch):
    """A valid cached build is imported directly: no lock taken, nothing written (a read-only
    cache works), and no compiler needed."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    source = tmp_path / "k.cpp"
    source.write_text("// sources")
    name = build.module_name("tiny", [source])
    build_dir = tmp_path / name
    build_dir.mkdir()
    build.stamp(_tiny_extension(build_dir, name))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in build_dir.iterdir())
    monkeypatch.setenv("PATH", "")  # no compiler
    module = build.load(build.Extension("tiny", (source,)))
    assert module.answer == 42
    assert sorted((p.name, p.stat().st_mtime_ns) for p in build_dir.iterdir()) == before


def test_no_compiler_is_one_line_naming_the_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(build, "_said", set())
    source = tmp_path / "k.cpp"
    source.write_text("// sources")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert build.load(build.Extension("nocc", (source,))) is None
        assert build.load(build.Extension("nocc", (source,))) is None
    lines = [str(w.message) for w in caught]
    assert len(lines) == 1 and "\n" not in lines[0] and "ATTNCONV_NO_FUSED=1" in lines[0]


def test_an_unbuildable_source_is_one_line(tmp_path, monkeypatch):
    """A compile error: one line (not the ninja log), the dense kernels, nothing stamped."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_said", set())
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert build.load(build.Extension("broken", (source,))) is None
    lines = [str(w.message) for w in caught]
    assert len(lines) == 1 and "\n" not in lines[0] and "did not build" in lines[0]
    assert not list(tmp_path.rglob("*.sha256"))


def test_build_kernels_command_says_ready_or_why_not(monkeypatch, capsys):
    from attnconv.cli import main
    from attnconv.layers.kernels import fused

    if fused.available():  # built (or loaded) by an earlier test: the command says where
        assert main(["build-kernels"]) == 0
        assert "ready" in capsys.readouterr().out
    monkeypatch.setenv(fused.DISABLE, "1")
    fused.extension.cache_clear()
    try:
        assert main(["build-kernels"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "ATTNCONV_NO_FUSED=1" in err[0]
    finally:
        monkeypatch.delenv(fused.DISABLE)
        fused.extension.cache_clear()
