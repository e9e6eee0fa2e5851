"""attnconv.cpuinfo, the one reader of /proc/cpuinfo: x86 and Arm layouts, and a system that
has no such file."""

from __future__ import annotations

import platform

import pytest

from attnconv import cpuinfo

X86 = """processor\t: 0
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx512f avx512_bf16

processor\t: 1
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx512f avx512_bf16
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd sve bf16
CPU part\t: 0xd40
"""


@pytest.fixture
def fake(monkeypatch, tmp_path):
    def use(text: str | None):
        path = tmp_path / "cpuinfo"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(cpuinfo, "CPUINFO", path)
        cpuinfo._fields.cache_clear()

    yield use
    cpuinfo._fields.cache_clear()


def test_x86_flags_and_name(fake):
    fake(X86)
    assert cpuinfo.cpu_flags() == {"fpu", "sse2", "avx512f", "avx512_bf16"}
    assert cpuinfo.cpu_name() == "AMD EPYC (family 26, model 2)"  # a Zen 5, not a Zen 4 (25)


def test_a_name_without_family_numbers_is_the_name_alone(fake):
    fake("processor\t: 0\nmodel name\t: Some Xeon(R) CPU\nflags\t\t: fpu\n")
    assert cpuinfo.cpu_name() == "Some Xeon(R) CPU"


def test_arm_features_and_the_machine_type_for_a_name(fake):
    fake(ARM)
    assert cpuinfo.cpu_flags() == {"fp", "asimd", "sve", "bf16"}
    assert cpuinfo.cpu_name() == (platform.processor() or platform.machine())


def test_no_cpuinfo_says_nothing_of_flags(fake):
    fake(None)
    assert cpuinfo.cpu_flags() is None
    assert cpuinfo.cpu_name() == (platform.processor() or platform.machine())


def test_this_machine_digest_unchanged_by_the_shared_reader():
    """The kernels' build cache keys on the flags: the reader must give the digest the old
    line-splitting code gave, or every installed kernel would rebuild."""
    import hashlib
    from pathlib import Path

    from attnconv.layers.kernels import build

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    line = next(ln for ln in text.splitlines() if ln.startswith(("flags", "Features")))
    old = hashlib.sha1(" ".join(sorted(line.split(":", 1)[1].split())).encode()).hexdigest()[:8]
    assert build.cpu_key() == old
