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


def check_attention_maps(
    shapes: list[tuple[int, ...]], element_size: int, what: str, limit: int | None = None
) -> int:
    """The bytes ``return_attention`` would hold: every layer's map (``shapes``, one per
    layer, e.g. (B, heads, T, T)) kept, plus one more layer's being computed; a one-line
    ValueError (as the training size check), before any of it is computed, past ``limit`` (half
    the machine's memory)."""
    import math

    per_layer = [math.prod(s) * element_size for s in shapes]
    need = sum(per_layer) + max(per_layer, default=0)
    bound = memory_bytes() // 2 if limit is None else limit
    if need > bound:
        first = "x".join(map(str, shapes[0]))
        raise ValueError(
            f"{what}: return_attention needs at least {_size(need)} for its attention maps "
            f"({len(shapes)} layers of {first}), more than half this machine's memory "
            f"({_size(bound)}); use smaller images or fewer at a time"
        )
    return need


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
