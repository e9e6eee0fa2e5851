"""The run folders kept in the repository, so that a lost run root (a new machine) loses only
what was not committed.

The run root lives outside the repository (benchmarks/experiments.py); a machine that is not
kept takes it along, finished runs and a long run's hours alike. ``save`` copies each run folder
(paths under the repository's parent folder written relative to the repository)
into ``benchmarks/results/experiment_runs/<name>/`` without what can be rebuilt or is large: the
TensorBoard logs, the lock, the step-0 control checkpoint, the training log and the checkpoints.
Of the checkpoints it keeps one:

- a run not finished keeps its resume point (weights, optimizer and RNG state) in
  ``checkpoints/``: the one the run root's ``checkpoints/latest`` names, copied only when the
  archive has none yet or when the run is a quarter of its steps (REPLACE_EVERY) past the
  archived one; in between the logs are updated and the archived checkpoint stays as it is (a
  resume from it drops the metrics rows past it);
- a finished run (a complete wall.json, ``experiments_runs.finished``) keeps its final weights in
  ``final/``: the weight file of the checkpoint ``checkpoints/latest`` names (else the last step
  folder) byte for byte, with weights-only metadata (no optimizer nor training state, no machine's
  paths), a folder ``attnconv.loading.load_model`` loads. A run root with no checkpoint left keeps
  the archived ``final/``.

A finished run keeps too what the report reads (metrics, logged centres, analyses, wall time,
config). ``restore`` copies an archived run back into a run root that lacks it (never over one
it has: the run root is newer or equal), so `run` resumes the archived run from its saved step
and `report` regenerates from the archive alone. Both copy into a private temp folder and rename
it into place, so that many runners, `save` and `report` side by side never see a half-copied
run (tests/test_runner_concurrency.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from attnconv.catalog import CIFAR_ZIP, WEIGHT_FILE, file_digest
from experiments_runs import ROOT, finished

ARCHIVE = ROOT / "benchmarks" / "results" / "experiment_runs"
SKIP = {"tb", ".lock", "init", "experiment.log", "checkpoints", "final"}  # rebuilt, large or ours
CHECKPOINTS, LATEST, FINAL, META = "checkpoints", "latest", "final", "checkpoint.json"
BASE = ROOT.parent  # the folder holding the repository, the run root and the data
# An unfinished run's archived resume checkpoint is replaced once the run is this fraction of its
# steps past it: a 150,000-step run then commits at most 4 resume checkpoints + its final weights,
# under 30 MB of git history for the largest run (ResNet18 at quarter width: ~5.6 MB a checkpoint).
REPLACE_EVERY = 0.25


def weights_only(meta: dict) -> dict:
    """A training checkpoint's metadata as a shipped one: no optimizer nor training state, no
    machine's paths (the data as the recipes name it, no run folder)."""
    from attnconv.loading.checkpoint import META_HASH, STATE, meta_digest

    out = {k: v for k, v in meta.items() if k not in ("path", "optimizer", META_HASH)}
    out["state"] = {"step": meta["state"]["step"]}
    out["tensors"] = {WEIGHT_FILE: meta["tensors"][WEIGHT_FILE]}
    out["files"] = {WEIGHT_FILE: meta["files"][WEIGHT_FILE]}
    cfg = json.loads(json.dumps(meta.get("config") or {}))
    cfg.setdefault("data", {})["dataset"] = CIFAR_ZIP
    cfg["out_dir"] = None
    out["config"] = cfg
    assert STATE not in out["files"]
    out[META_HASH] = meta_digest(out)
    return out


def _relative(value, base: str):
    """``value`` (JSON-like) with every string path under ``base`` written relative to the
    repository ("../attnconv-runs/...", "../shared/data/..."): no machine's folders in the
    repository. Resuming is unaffected (out_dir and data.dataset may change on --resume)."""
    if isinstance(value, str):
        return value.replace(base, "../")
    if isinstance(value, dict):
        return {k: _relative(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, base) for v in value]
    return value


def _copy(src: Path, dest: Path, prefix: str) -> None:
    """Copy one file; a config or JSON record with its paths under folder ``prefix`` (ending in
    "/") made relative (a checkpoint's metadata gets its digest again, as the trainer computes
    it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix in (".yaml", ".json") and prefix in (text := src.read_text()):
        if src.suffix == ".yaml":
            dest.write_text(text.replace(prefix, "../"))
            return
        from attnconv.loading.checkpoint import META_HASH, meta_digest

        meta = _relative(json.loads(text), prefix)
        if isinstance(meta, dict) and META_HASH in meta:
            meta[META_HASH] = meta_digest(meta)
        dest.write_text(json.dumps(meta, indent=1))
        return
    shutil.copy2(src, dest)


def _files(src: Path, folder: Path) -> list[Path]:
    """The files under ``folder`` (dot files left out), relative to run folder ``src``."""
    return sorted(
        p.relative_to(src) for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
    )


def _state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / META).read_text())["state"]


def _replace(src: Path, dest: Path, step: str) -> bool:
    """Whether the run root's resume checkpoint ``step`` replaces the archived one: the archive
    has none (or none it can read), the run is REPLACE_EVERY of its steps past it, or behind it
    (it started over); always when the checkpoint does not say its total steps."""
    new = _state(src / CHECKPOINTS / step)  # FileNotFoundError: pruned meanwhile
    try:
        old = _state(dest / CHECKPOINTS / (dest / CHECKPOINTS / LATEST).read_text().strip())
        gap = new["step"] - old["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return True
    total = new.get("total_steps")
    return not isinstance(total, int) or gap < 0 or gap >= REPLACE_EVERY * total


def _resume(src: Path, dest: Path, tmp: Path, prefix: str) -> None:
    """An unfinished run's resume point into ``tmp``: the checkpoint the run root's ``latest``
    names where ``_replace`` says so, else the archived one as it is."""
    if not (src / CHECKPOINTS / LATEST).is_file():
        return
    step = (src / CHECKPOINTS / LATEST).read_text().strip()  # once: a training moves it
    if not _replace(src, dest, step):
        shutil.copytree(dest / CHECKPOINTS, tmp / CHECKPOINTS)
        return
    for f in _files(src, src / CHECKPOINTS / step):
        _copy(src / f, tmp / f, prefix)
    (tmp / CHECKPOINTS / LATEST).write_text(step + "\n")  # the one copied, not the live file


def _final(src: Path, dest: Path, tmp: Path, prefix: str) -> None:
    """A finished run's final weights into ``tmp/final`` (weights-only metadata); the archived
    ones where the run root has no checkpoint left (or none that reads back whole)."""
    from attnconv.loading.checkpoint import CheckpointError, read_meta

    try:
        checkpoint, meta = read_meta(src / CHECKPOINTS)
        (tmp / FINAL).mkdir(parents=True)
        shutil.copyfile(checkpoint / WEIGHT_FILE, tmp / FINAL / WEIGHT_FILE)
        if file_digest(tmp / FINAL / WEIGHT_FILE) != meta["files"][WEIGHT_FILE]["sha256"]:
            raise CheckpointError(f"{checkpoint / WEIGHT_FILE}: sha256 differs")
        meta = weights_only(_relative(meta, prefix))
        (tmp / FINAL / META).write_text(json.dumps(meta, indent=1))
    except (CheckpointError, FileNotFoundError):
        shutil.rmtree(tmp / FINAL, ignore_errors=True)
        if (dest / FINAL).is_dir():
            shutil.copytree(dest / FINAL, tmp / FINAL)


STALE = 3600.0  # seconds: a private temp folder this old was left by a killed restore or save


def clean_stale(folder: Path, name: str) -> None:
    """Remove what a restore or save of ``name`` killed half-way left in ``folder`` (its private
    temp folders ``.NAME.restore.*``, ``.NAME.save.*``, ``.NAME.old.*``) over STALE seconds ago;
    a younger one may be another process's at work."""
    pattern = re.compile(rf"\.{re.escape(name)}\.(restore|save|old)\.[A-Za-z0-9_]+")
    now = time.time()
    for p in folder.glob(f".{name}.*"):
        if not pattern.fullmatch(p.name) or p.is_symlink() or not p.is_dir():
            continue
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > STALE:
                shutil.rmtree(p, ignore_errors=True)


def _swap(tmp: Path, dest: Path) -> None:
    """``tmp`` in the place of ``dest``: the old copy renamed aside first (each rename atomic),
    so that ``dest`` is never a half-written folder; a copy another save put there meanwhile is
    replaced in turn (the last save wins)."""
    for _ in range(20):
        aside = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old."))
        try:
            with contextlib.suppress(FileNotFoundError):
                os.rename(dest, aside / "run")
            try:
                os.rename(tmp, dest)  # fails on a folder another save renamed in meanwhile
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    raise OSError(errno.EBUSY, f"{dest}: replaced by other saves 20 times in a row")


def save(
    runs: Path, archive: Path | None = None, names: list[str] | None = None, base: Path = BASE
) -> list[str]:
    """Archive every run folder of ``runs`` (one with a config.yaml; all, or ``names``) into
    ``archive`` (default ARCHIVE), replacing its earlier copy; returns the names saved. `run`
    calls it for the run it trains every few minutes, so the working tree holds it even if
    nobody saves. Each copy is made in a private temp folder and renamed into place."""
    archive = ARCHIVE if archive is None else archive
    saved, prefix = [], str(base.resolve()).rstrip("/") + "/"
    for src in sorted(p for p in runs.iterdir() if (p / "config.yaml").is_file()):
        if names and src.name not in names:
            continue
        archive.mkdir(parents=True, exist_ok=True)
        clean_stale(archive, src.name)
        dest = archive / src.name
        private = Path(tempfile.mkdtemp(dir=archive, prefix=f".{src.name}.save."))
        tmp = private / "run"
        try:
            for f in _files(src, src):
                if f.parts[0] not in SKIP:
                    _copy(src / f, tmp / f, prefix)
            (_final if finished(src) else _resume)(src, dest, tmp, prefix)
            tmp.mkdir(exist_ok=True)
            _swap(tmp, dest)
            saved.append(src.name)
        except FileNotFoundError:  # a training pruned that checkpoint meanwhile: keep the last
            continue
        finally:
            shutil.rmtree(private, ignore_errors=True)
    return saved


def restore(runs: Path, names: list[str] | None = None, archive: Path | None = None) -> list[str]:
    """Copy each archived run (all, or ``names``) that ``runs`` lacks into it (its ``final/``
    too); returns the names restored. A run folder already in ``runs`` is never touched: each
    copy is made in a private temp folder of ``runs`` (tempfile.mkdtemp) and renamed into place
    in one step, so a run folder is either absent or whole, whoever restores beside it; one
    that appeared meanwhile (a second restore got there first) is left as it is and the copy
    dropped. What a killed restore left is removed once stale (``clean_stale``)."""
    archive = ARCHIVE if archive is None else archive
    if not archive.is_dir():
        return []
    restored = []
    for src in sorted(p for p in archive.iterdir() if (p / "config.yaml").is_file()):
        if names and src.name not in names:
            continue
        if runs.is_dir():
            clean_stale(runs, src.name)
        if (runs / src.name).exists():
            continue
        runs.mkdir(parents=True, exist_ok=True)
        private = Path(tempfile.mkdtemp(dir=runs, prefix=f".{src.name}.restore."))
        try:
            shutil.copytree(src, private / src.name)
            try:
                os.rename(private / src.name, runs / src.name)  # fails on a non-empty folder
            except OSError:
                if not (runs / src.name).exists():
                    raise
                continue  # restored meanwhile: that copy stays
            restored.append(src.name)
        except (OSError, shutil.Error) as e:
            raise SystemExit(
                f"{src.name}: restoring it from {src} failed ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200] if str(e) else ''}); nothing was changed"
            ) from None
        finally:
            shutil.rmtree(private, ignore_errors=True)
    return restored
