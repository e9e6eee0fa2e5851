"""--overwrite leaves nothing of the old run: not its checkpoints (no resume, no eval of its
weights), not its logs or config, whatever moment the overwriting training is killed at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from attnconv.cli import main
from attnconv.train import runfolder
from attnconv.train.config import load_config
from attnconv.train.loop import Trainer
from tiny_runs import tiny_config


def _steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step-*"))


def _two_configs(tmp_path: Path, cifar_zip: Path, run: Path) -> tuple[str, str]:
    """Run A: 3 epochs (6 steps), run B: another model width, 1 epoch (2 steps)."""
    a = tiny_config(tmp_path, cifar_zip, epochs=3, out_dir=str(run))
    d = yaml.safe_load(Path(a).read_text())
    d["model"]["kwargs"]["width"] = 8
    d["train"]["epochs"] = 1
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(d))
    return a, str(b)


def _nothing_of_a(run: Path) -> None:
    assert not any(
        s in ("step-00000003", "step-00000004", "step-00000005", "step-00000006")
        for s in _steps(run)
    )
    metrics = run / "metrics.csv"
    if metrics.exists():  # B's rows only: B has 2 steps
        steps = [int(r.split(",")[2]) for r in metrics.read_text().splitlines()[1:] if r]
        assert all(s <= 2 for s in steps), steps
    cfg = run / "config.yaml"
    if cfg.exists():
        assert yaml.safe_load(cfg.read_text())["model"]["kwargs"]["width"] == 8


@pytest.mark.slow
def test_overwrite_killed_before_its_first_checkpoint(tmp_path, cifar_zip, capsys):
    run = tmp_path / "run"
    a, b = _two_configs(tmp_path, cifar_zip, run)
    assert main(["train", a]) == 0 and _steps(run)
    Trainer(load_config(b), overwrite=True)  # built, then gone before its first step (a kill)
    assert not (run / "checkpoints").exists() or not _steps(run)
    _nothing_of_a(run)
    assert main(["eval", str(run)]) != 0  # no weights of A to evaluate
    capsys.readouterr()
    assert main(["train", b, "--resume"]) == 0  # B from step 0, never A's weights
    _nothing_of_a(run)
    assert _steps(run)[-1] == "step-00000002"


@pytest.mark.slow
@pytest.mark.parametrize("moved", [0, 1, 2])
def test_overwrite_killed_between_its_renames(tmp_path, cifar_zip, monkeypatch, moved):
    """A kill after ``moved`` of the old run's files were taken away: the next training in the
    folder, with or without --overwrite, finishes the removal before anything else."""
    run = tmp_path / "run"
    a, b = _two_configs(tmp_path, cifar_zip, run)
    assert main(["train", a]) == 0
    real, calls = os.replace, []

    def dying_replace(src, dst):
        if len(calls) == moved:
            raise KeyboardInterrupt  # the process dies here
        calls.append(src)
        real(src, dst)

    monkeypatch.setattr(runfolder.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        Trainer(load_config(b), overwrite=True)
    monkeypatch.setattr(runfolder.os, "replace", real)
    assert (run / runfolder.OVERWRITE).is_dir()  # marks the unfinished overwrite
    if moved:
        assert not (run / "checkpoints").exists()  # weights go first: nothing to resume
    assert main(["train", b]) == 0  # no --overwrite needed: the old run is gone first
    assert not (run / runfolder.OVERWRITE).exists()
    _nothing_of_a(run)
    assert _steps(run)[-1] == "step-00000002"
