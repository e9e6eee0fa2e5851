"""The machine's memory: the bound every declared size (a dataset split, a model, a checkpoint
file) is checked against before it is allocated."""

from __future__ import annotations

import os


def memory_bytes() -> int:
    """Bytes of physical memory (1 TiB if the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40
