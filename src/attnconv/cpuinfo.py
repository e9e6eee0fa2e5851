"""What this machine's CPU says of itself (Linux's /proc/cpuinfo, read once a process): its
name and its instruction-set flags. One reader for the kernels' build cache, the bf16 choice
and the benchmarks' machine line."""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@cache
def _fields() -> dict[str, str]:
    """Each key's first value in /proc/cpuinfo (the first processor's); {} where unreadable."""
    fields: dict[str, str] = {}
    try:
        text = CPUINFO.read_text()
    except OSError:  # not Linux
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str] | None:
    """The CPU's instruction-set flags (x86's ``flags``, Arm's ``Features``); None where
    the system does not say."""
    line = _fields().get("flags", _fields().get("Features"))
    return None if line is None else frozenset(line.split())


def cpu_name() -> str:
    """The CPU's model name with x86's family and model numbers where the system gives them
    (a virtual machine may call a Zen 4 and a Zen 5 both "AMD EPYC": families 25 and 26), else
    the machine type."""
    f = _fields()
    name = f.get("model name") or platform.processor() or platform.machine()
    if "model name" in f and "cpu family" in f and "model" in f:
        name += f" (family {f['cpu family']}, model {f['model']})"
    return name
