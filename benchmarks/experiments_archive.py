"""The run folders kept in the repository, so that a lost run root (a new machine) loses only
what was not committed.

The run root lives outside the repository (benchmarks/experiments.py); a machine that is not
kept takes it along, finished runs and a long run's hours alike. ``save`` copies each run folder
(paths under the repository's parent folder written relative to the repository)
into ``benchmarks/results/experiment_runs/<name>/`` without what can be rebuilt or is large: the
TensorBoard logs, the lock, the step-0 control checkpoint, the training log, and every
checkpoint except, for a run not finished, the one ``checkpoints/latest`` names (its resume
point: weights, optimizer and RNG state). A finished run keeps what the report reads (metrics,
logged centres, analyses, wall time, config). ``restore`` copies an archived run back into a
run root that lacks it (never over one it has: the run root is newer or equal), so `run`
resumes the archived run from its saved step and `report` regenerates from the archive alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from experiments_runs import ROOT

ARCHIVE = ROOT / "benchmarks" / "results" / "experiment_runs"
SKIP = {"tb", ".lock", "init", "experiment.log", "checkpoints"}  # rebuilt, large or transient
CHECKPOINTS, LATEST = "checkpoints", "latest"
BASE = ROOT.parent  # the folder holding the repository, the run root and the data


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


def _kept(src: Path) -> tuple[list[Path], str | None]:
    """The files of run folder ``src`` that the archive keeps (paths relative to ``src``), and
    the step checkpoint among them that ``latest`` names (None for a finished run)."""
    files = [p.relative_to(src) for p in src.rglob("*") if p.is_file()]
    files = [f for f in files if f.parts[0] not in SKIP and not f.parts[-1].startswith(".")]
    latest, step = src / CHECKPOINTS / LATEST, None
    if not (src / "wall.json").exists() and latest.is_file():  # unfinished: its resume point
        step = latest.read_text().strip()  # read once: a training may move it meanwhile
        files += [
            p.relative_to(src)
            for p in (src / CHECKPOINTS / step).rglob("*")
            if p.is_file() and not p.name.startswith(".")
        ]
    return sorted(files), step


def save(
    runs: Path, archive: Path = ARCHIVE, names: list[str] | None = None, base: Path = BASE
) -> list[str]:
    """Archive every run folder of ``runs`` (one with a config.yaml; all, or ``names``) into
    ``archive``, replacing its earlier copy; returns the names saved. `run` calls it for the
    run it trains every few minutes, so the working tree holds it even if nobody saves."""
    saved, prefix = [], str(base.resolve()).rstrip("/") + "/"
    for src in sorted(p for p in runs.iterdir() if (p / "config.yaml").is_file()):
        if names and src.name not in names:
            continue
        dest = archive / src.name
        tmp = archive / f".{src.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        files, step = _kept(src)
        try:
            for f in files:
                (tmp / f).parent.mkdir(parents=True, exist_ok=True)
                _copy(src / f, tmp / f, prefix)
        except FileNotFoundError:  # a training pruned that checkpoint meanwhile: keep the last
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        if step is not None:  # the pointer to the checkpoint copied, not the live file
            (tmp / CHECKPOINTS / LATEST).write_text(step + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        saved.append(src.name)
    return saved


def restore(runs: Path, names: list[str] | None = None, archive: Path = ARCHIVE) -> list[str]:
    """Copy each archived run (all, or ``names``) that ``runs`` lacks into it; returns the names
    restored. A run folder already in ``runs`` is never touched."""
    if not archive.is_dir():
        return []
    restored = []
    for src in sorted(p for p in archive.iterdir() if (p / "config.yaml").is_file()):
        if (names and src.name not in names) or (runs / src.name).exists():
            continue
        runs.mkdir(parents=True, exist_ok=True)
        tmp = runs / f".{src.name}.restore.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        tmp.rename(runs / src.name)
        restored.append(src.name)
    return restored
