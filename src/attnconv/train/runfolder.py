"""A run folder belongs to one training at a time, and a finished or interrupted run is never
replaced by accident.

- ``RunLock``: an advisory ``fcntl`` lock on ``<run>/.lock`` held for the training's life (rank
  0); a second training on the same folder stops at once with the holder's PID.
- ``check_fresh``: a training without ``--resume`` into a folder that already holds a run
  (checkpoints or logged metrics) is refused, naming the last checkpoint, unless ``--overwrite``,
  which first takes every file of the old run away (``remove_old_run``: killed at any moment,
  the next start finishes it), so nothing of the old run can be resumed or evaluated.
- Nothing is written or read through a symlink: ``check_no_links`` refuses a run folder whose
  files are links (a ``config.yaml`` link to a file elsewhere would get that file overwritten),
  and ``open_nofollow`` opens every log file with O_NOFOLLOW (a link made mid-run is refused
  too). config.yaml and the checkpoints are written by temp file + rename, which replaces a link
  instead of following it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import IO

LOCK = ".lock"
RUN_FILES = (
    "config.yaml",
    "metrics.csv",
    "centers.jsonl",
    "machines.jsonl",
    "checkpoints",
    "tb",
    LOCK,
)
_MODES = {
    "r": os.O_RDONLY,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


def _link_error(path: Path) -> ValueError:
    return ValueError(
        f"{path} is a symlink; a run folder's files are never written or read through links "
        "(remove it)"
    )


def check_no_links(out: Path) -> None:
    """ValueError if a file or folder the training writes in ``out`` is a symlink."""
    for name in RUN_FILES:
        if (out / name).is_symlink():
            raise _link_error(out / name)


def open_nofollow(path: Path, mode: str, **kw) -> IO:
    """``open(path, mode)`` (mode r / w / a, text) that refuses a symlink (O_NOFOLLOW)."""
    try:
        fd = os.open(path, _MODES[mode] | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or path.is_symlink():
            raise _link_error(path) from None
        raise
    return os.fdopen(fd, mode, **kw)


class RunFolderBusy(ValueError):
    """Another training holds the run folder."""


class RunLock:
    fd: int | None = None

    def __init__(self, out: Path):
        import fcntl

        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LOCK
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderBusy(
                f"run folder {out} is in use by another training (PID {holder}); wait for it "
                "to finish or train into another folder (--out)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None

    def __del__(self) -> None:  # a Trainer dropped without fit() frees its folder
        self.release()


def clean_temps(out: Path) -> None:
    """Under the lock, at start: remove what a killed save leaves in the run folder and its
    checkpoints (temp files and folders ``.NAME.*.tmp`` of every atomic write); a ``.step-N.old``
    (killed between the two renames of a replacement) goes back to ``step-N`` if that is
    missing, else it is removed."""
    for d in (out, out / "checkpoints"):
        if not d.is_dir() or d.is_symlink():
            continue
        for p in d.glob(".*.tmp"):
            if p.name == OVERWRITE and d == out:
                continue  # an unfinished overwrite: finish_overwrite completes it
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        for old in d.glob(".step-*.old"):
            real = d / old.name[1:].removesuffix(".old")
            if real.exists() or real.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(old, real)


OVERWRITE = ".overwrite.tmp"  # the old run's files on their way out (see remove_old_run)
# what a run, its demo figures, its analyses, an `attnconv eval --json` / `convert --json` record
# and the experiments runner (benchmarks/experiments.py: its log, its clock, the step-0 control
# and its analysis, an archived run's final weights) write into the folder; weights first. A
# file no command writes there (the user's) is left alone: a run folder may be any folder.
OLD_RUN_FILES = (
    "checkpoints",
    "final",
    "init",
    "config.yaml",
    "metrics.csv",
    "centers.jsonl",
    "machines.jsonl",
    "tb",
    "figures",
    "analysis",
    "analysis_init",
    "eval.json",
    "convert.json",
    "wall.json",
    "wall_partial.json",
    "experiment.log",
)


def remove_old_run(out: Path) -> None:
    """Under the lock: take every file of the run in ``out`` away before anything new is
    written (``--overwrite``). Each is renamed into ``out/.overwrite.tmp`` (checkpoints first,
    so no old weights can be resumed or evaluated once a rename has happened), then that folder
    is deleted. Killed at any moment, the folder left behind marks the overwrite as unfinished:
    the next training in ``out`` (``finish_overwrite`` at start) moves what is left of the old
    run there too and deletes it, so nothing of the old run survives either way."""
    trash = out / OVERWRITE
    trash.mkdir(exist_ok=True)
    for name in OLD_RUN_FILES:
        p = out / name
        if p.exists() or p.is_symlink():
            os.replace(p, trash / name)  # atomic within the folder
    shutil.rmtree(trash, ignore_errors=True)


def finish_overwrite(out: Path) -> bool:
    """Complete an overwrite killed half-way (``remove_old_run``); True if there was one."""
    if not (out / OVERWRITE).is_dir() or (out / OVERWRITE).is_symlink():
        return False
    remove_old_run(out)
    return True


def check_fresh(out: Path, overwrite: bool) -> None:
    """ValueError if ``out`` already holds a run (unless ``overwrite``)."""
    ck = out / "checkpoints"
    steps = sorted(p.name for p in ck.glob("step-*") if p.is_dir()) if ck.is_dir() else []
    metrics = out / "metrics.csv"
    logged = (
        metrics.is_file()
        and metrics.stat().st_size > 0
        and len(metrics.read_text(errors="replace").splitlines()) > 1
    )
    if (steps or logged) and not overwrite:
        last = f"last checkpoint {ck / steps[-1]}" if steps else "metrics logged, no checkpoint"
        raise ValueError(
            f"run folder {out} already holds a run ({last}); continue it with --resume, train "
            "into another folder (--out), or replace it with --overwrite"
        )


def claim(out: Path, lock: RunLock, *, resume: bool, overwrite: bool) -> bool:
    """Ready the run folder whose ``lock`` rank 0 holds (released if this fails): links
    refused, temporary files of a killed save removed, a killed ``--overwrite`` finished, and
    without ``resume`` an existing run refused unless ``overwrite``, which removes it. True when
    it finished a killed ``--overwrite`` (the old run is gone)."""
    try:
        check_no_links(out)
        clean_temps(out)  # left by a save killed half-way
        finished = finish_overwrite(out)
        if not resume:
            check_fresh(out, overwrite)
            if overwrite:  # nothing of the old run stays: not its weights, logs or config
                remove_old_run(out)
        return finished
    except BaseException:
        lock.release()
        raise
