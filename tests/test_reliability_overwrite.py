"""--overwrite leaves nothing of the old run: not its checkpoints (no resume, no eval of its
weights), not its logs or config, nor what other commands and the experiments runner wrote into
it, whatever moment the overwriting training is killed at; a start refused on its config
leaves nothing either (issue 79)."""

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


RUNNER_FILES = {
    "eval.json": "{}",  # attnconv eval --json written into the run
    "convert.json": "{}",
    "wall.json": '{"train_seconds": 1.0}',  # the experiments runner's clock and finish
    "wall_partial.json": '{"train_seconds": 1.0}',
    "experiment.log": "$ attnconv train\n",
    "init/checkpoint.json": "{}",  # the step-0 control and its analysis
    "analysis_init/report.json": "{}",
    "final/checkpoint.json": "{}",  # an archived run's final weights
}


def test_overwrite_leaves_nothing_the_commands_or_the_runner_wrote(tmp_path, cifar_zip):
    """Files the trainer does not write but attnconv eval/convert/analyze and the experiments
    runner do are the old run's too; a file of the user's (no command writes it) stays."""
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(run))
    assert main(["train", cfg]) == 0
    for name, text in RUNNER_FILES.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    (run / "notes.txt").write_text("mine")
    assert main(["train", cfg, "--overwrite"]) == 0
    left = {p.name for p in run.iterdir()}
    assert not left & {n.split("/")[0] for n in RUNNER_FILES}, left
    assert (run / "notes.txt").read_text() == "mine" and _steps(run)[-1] == "step-00000002"


@pytest.mark.slow
def test_a_start_refused_on_its_config_leaves_nothing(tmp_path, cifar_zip, capsys):
    """Refused after the run folder was locked (a split the data lacks, a batch larger than the
    data): no folder, no .lock, no empty metrics.csv; an existing folder as it was; a run that
    --overwrite would replace is kept when the new config is refused (checked first)."""
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(run))
    for bad in ("data.eval_split=nosuch", "train.batch_size=1000"):
        assert main(["train", cfg, "--set", bad]) == 2
        assert not run.exists()
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert main(["train", cfg, "--set", "data.eval_split=nosuch"]) == 2
    assert [p.name for p in run.iterdir()] == ["notes.txt"]
    assert main(["train", cfg]) == 0
    before = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    assert main(["train", cfg, "--overwrite", "--set", "data.eval_split=nosuch"]) == 2
    assert "no split 'nosuch'" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before and _steps(run)[-1] == "step-00000002"


def test_a_start_refused_as_busy_leaves_the_holders_lock(tmp_path, cifar_zip):
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(run))
    held = runfolder.RunLock(run)  # another training holds the folder
    try:
        assert main(["train", cfg]) == 2
        assert (run / runfolder.LOCK).is_file()
        with pytest.raises(runfolder.RunFolderBusy):
            runfolder.RunLock(run)  # still held
    finally:
        held.release()
