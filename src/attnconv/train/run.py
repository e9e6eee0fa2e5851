"""One call trains a config: build the Trainer, fit, and leave the process group cleanly on every
rank (``attnconv train`` and ``attnconv demo`` call it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import distributed as D
from .config import Config
from .loop import Trainer
from .runfolder import LOCK, RunFolderBusy, check_fresh
from .stopping import Interrupted


def _rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def check_before_overwrite(cfg: Config) -> None:
    """``--overwrite`` takes the old run away before the trainer reads the data: where the
    folder holds a run, the data and the model's classes are read and checked first (one
    process; a torchrun start is not pre-checked), so a start refused on them loses nothing."""
    from .loaders import build_loaders, model_kwargs_for

    try:
        check_fresh(Path(cfg.out_dir or "runs/default"), overwrite=False)
        return  # no run there: nothing to lose
    except ValueError:
        pass
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return
    loader, _ = build_loaders(cfg, D.DistInfo())
    model_kwargs_for(cfg, loader.ds.num_classes)


def _remove_new(out: Path, before: set[str] | None, busy: bool) -> None:
    """A start refused before training leaves nothing: what it made in ``out`` (its lock, an
    empty log, the folder itself) is removed; what was there before stays. Another training's
    lock (``busy``) is never touched."""
    if not out.is_dir():
        return
    for name in set(os.listdir(out)) - (before or set()):
        if busy and name == LOCK:
            continue
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    if before is None:
        try:
            out.rmdir()  # made by this start, empty again
        except OSError:
            pass


def build_trainer(cfg: Config, **kwargs) -> Trainer:
    """``Trainer(cfg, **kwargs)``; a start refused before its first step (a dataset, a split,
    a batch larger than the data, a changed config on --resume) leaves the run folder as it
    found it (rank 0)."""
    out = Path(cfg.out_dir or "runs/default")
    before = set(os.listdir(out)) if out.is_dir() else None
    try:
        if kwargs.get("overwrite") and not kwargs.get("resume") and _rank0():
            check_before_overwrite(cfg)
        return Trainer(cfg, **kwargs)
    except Exception as e:
        if _rank0():
            _remove_new(out, before, isinstance(e, RunFolderBusy))
        raise


def train(
    cfg: Config,
    *,
    resume: bool = False,
    stop_at_step: int | None = None,
    overwrite: bool = False,
    device: str | None = None,
) -> dict:
    """Build everything from ``cfg`` and train; see :class:`Trainer`.

    Args:
        cfg: the run's configuration (``attnconv.train.config``).
        resume: continue from the run folder's newest checkpoint.
        stop_at_step: stop (resumably) once this step is reached.
        overwrite: replace a run already in the folder (refused otherwise, unless ``resume``).
        device: cpu, cuda, cuda:N, mps (default: CUDA if available).

    Returns:
        The last evaluation's metrics (``eval_loss``, ``eval_acc``, ``step``, ``epoch``,
        ``seconds``, and ``eval_images``: the images the accuracy was measured on).
    """
    tr = build_trainer(
        cfg, resume=resume, stop_at_step=stop_at_step, overwrite=overwrite, device=device
    )
    # every rank past its last collective before the group is unregistered (the group object
    # itself lives on: D.wrap says why freeing it hung or aborted a rank); on the success and
    # stop paths only, so that a failing rank never waits on a peer stuck elsewhere
    try:
        last = tr.fit()
    except Interrupted:  # a stop every rank agreed on (any_rank, stop_at_step): all are here
        D.barrier(tr.info)
        raise
    else:
        D.barrier(tr.info)
        if last:
            last = {**last, "eval_images": len(tr.eval_loader.ds)}
        return last
    finally:
        D.shutdown(tr.info)
