"""``attnconv train --resume`` when the latest checkpoint is damaged: the last intact one is
named, and ``--resume-from-intact`` resumes from it (the damaged ones newer than it are kept
aside, never deleted)."""

from __future__ import annotations

from pathlib import Path

import torch

from attnconv.loading.checkpoint import LATEST, CheckpointError, read_checkpoint

from .checkpoint import atomic_write

DAMAGED = "damaged-"  # prefix of a step folder set aside (not a step-* folder: never resumed)


def _steps(ckdir: Path) -> list[Path]:
    steps = [
        d
        for d in ckdir.glob("step-*")
        if d.is_dir() and not d.is_symlink() and d.name[5:].isdigit()
    ]
    return sorted(steps, key=lambda d: int(d.name[5:]))


def intact(step: Path) -> bool:
    """The step folder reads back whole (metadata, digests, training state) with finite
    weights and a resumable state."""
    try:
        meta, weights, state = read_checkpoint(step, with_state=True)
    except CheckpointError:
        return False
    if not isinstance(meta.get("state", {}).get("step"), int) or "rng.torch" not in state:
        return False
    return all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point())


def last_intact(ckdir: Path) -> tuple[Path | None, list[Path]]:
    """(the newest intact step folder of ``ckdir`` or None, the damaged ones newer than it)."""
    damaged = []
    for step in reversed(_steps(ckdir)):
        if intact(step):
            return step, damaged
        damaged.append(step)
    return None, damaged


def hint(ckdir: Path) -> str:
    """What to add to a --resume refused on a damaged checkpoint: the last intact one and the
    flag that resumes from it ("" if there is none, or it is the one refused)."""
    good, damaged = last_intact(ckdir)
    if good is None or not damaged:
        return ""
    return f"; the last intact checkpoint is {good}: resume from it with --resume-from-intact"


def resume_from_intact(ckdir: Path) -> str:
    """Point ``latest`` at the newest intact checkpoint, the damaged newer ones renamed aside
    (``damaged-step-N``); returns the line that says so ("" when the latest is intact). The
    caller holds the run folder's lock."""
    good, damaged = last_intact(ckdir)
    if good is None:
        raise CheckpointError(
            f"--resume-from-intact: no intact checkpoint in {ckdir} "
            f"({len(damaged)} damaged); start over with --overwrite"
        )
    kept = []
    for d in damaged:
        aside = ckdir / f"{DAMAGED}{d.name}"
        n = 1
        while aside.exists():
            aside, n = ckdir / f"{DAMAGED}{d.name}.{n}", n + 1
        d.rename(aside)
        kept.append(aside.name)
    pointer = ckdir / LATEST
    if pointer.is_file() and pointer.read_text().strip() == good.name and not kept:
        return ""
    atomic_write(pointer, good.name.encode())
    aside = f" (kept aside: {', '.join(kept)})" if kept else ""
    return f"resuming from the last intact checkpoint {good}{aside}"
