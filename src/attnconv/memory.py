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
    shapes: list[tuple[int, ...]],
    element_size: int,
    what: str,
    limit: int | None = None,
    computing: list[tuple[int, ...]] | None = None,
    hint: str = "use smaller images or fewer at a time",
) -> int:
    """The bytes ``return_attention`` would hold: every layer's map (``shapes``, one per
    layer, e.g. (B, heads, T, T)) kept, plus one more layer's being computed (the largest of
    ``computing``, default ``shapes``: a converted layer computes its map over the padded
    input, then keeps it cropped); a one-line ValueError (as the training size check), before
    any of it is computed, past ``limit`` (half the machine's memory)."""
    import math

    per_layer = [math.prod(s) * element_size for s in shapes]
    working = [math.prod(s) * element_size for s in (computing or shapes)]
    need = sum(per_layer) + max(working, default=0)
    bound = memory_bytes() // 2 if limit is None else limit
    if need > bound:
        largest = "x".join(map(str, max(shapes, key=math.prod)))
        layers = f"{len(shapes)} layer{'s' if len(shapes) != 1 else ''}"
        layers += " of " if len(set(shapes)) == 1 else ", the largest "
        raise ValueError(
            f"{what}: return_attention needs at least {_size(need)} for its attention maps "
            f"({layers}{largest}), more than half this machine's memory "
            f"({_size(bound)}); {hint}"
        )
    return need


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
