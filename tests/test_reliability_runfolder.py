"""Issue 15, items 3 and 5: nothing is written or read through a symlink in the run folder, and
a run killed during its very first checkpoint resumes (from step 0, bit-identical)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnconv.cli import main
from attnconv.train.checkpoint import LATEST, follow_latest
from attnconv.train.monitor import Monitor
from attnconv.train.runfolder import clean_temps, open_nofollow
from tiny_runs import tiny_config


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(follow_latest(run / "checkpoints") / "model.safetensors")


@pytest.mark.parametrize(
    "name", ["config.yaml", "metrics.csv", "centers.jsonl", "machines.jsonl", "checkpoints"]
)
def test_a_symlink_in_the_run_folder_is_never_written_through(tmp_path, cifar_zip, capsys, name):
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    target = outside / ("dir" if name == "checkpoints" else "file.txt")
    if name == "checkpoints":
        target.mkdir()
    else:
        target.write_text("precious\n")
    run.mkdir()
    (run / name).symlink_to(target)
    assert main(["train", tiny_config(tmp_path, cifar_zip, epochs=2), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{run / name} is a symlink; a run folder's files are never written" in err, err
    assert "\n" not in err
    if name == "checkpoints":
        assert list(target.iterdir()) == []
    else:
        assert target.read_text() == "precious\n"


@pytest.mark.slow
def test_metrics_symlink_on_resume_is_refused(tmp_path, cifar_zip, capsys):
    run, secret = tmp_path / "run", tmp_path / "secret.csv"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2)
    assert main(["train", cfg, "--out", str(run), "--stop-at-step", "1"]) == 0
    secret.write_text("kind,epoch,step\nnot,a,row\n")
    (run / "metrics.csv").unlink()
    (run / "metrics.csv").symlink_to(secret)
    capsys.readouterr()
    assert main(["train", cfg, "--out", str(run), "--resume"]) == 2
    assert "metrics.csv is a symlink" in capsys.readouterr().err
    assert secret.read_text() == "kind,epoch,step\nnot,a,row\n"


def test_a_link_made_mid_run_is_refused_by_every_open(tmp_path):
    """O_NOFOLLOW on each open: a link swapped in after the start check is never followed."""
    mon = Monitor(
        tmp_path, enabled=True, resume_step=None, progress=False, tensorboard=False, total_steps=1
    )
    target = tmp_path / "target.txt"
    target.write_text("keep")
    (tmp_path / "metrics.csv").unlink()
    (tmp_path / "metrics.csv").symlink_to(target)
    with pytest.raises(ValueError, match="metrics.csv is a symlink"):
        mon.row("train", 1, 1, 0.1, 1.0, 0.5, 10.0)
    for mode in "rwa":
        with pytest.raises(ValueError, match="is a symlink"):
            open_nofollow(tmp_path / "metrics.csv", mode)
    assert target.read_text() == "keep"


@pytest.mark.slow
def test_killed_during_the_first_checkpoint_resumes_from_step_0(tmp_path, cifar_zip, capsys):
    """A kill -9 while the first checkpoint is written leaves the run folder (lock, config,
    metrics) and only the save's temp folder: --resume starts again from step 0 and ends
    bit-identical to an uninterrupted run, the temp folder gone."""
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2)
    assert main(["train", cfg, "--out", str(tmp_path / "full")]) == 0
    run = tmp_path / "run"
    assert main(["train", cfg, "--out", str(run), "--stop-at-step", "1"]) == 0
    ck = run / "checkpoints"
    for p in ck.iterdir():  # back to the state the kill leaves: no step folder, no latest
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    tmp = ck / ".step-00000001.k9x2.tmp"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"half a file")
    capsys.readouterr()
    assert main(["train", cfg, "--out", str(run), "--resume"]) == 0
    assert "no checkpoint was complete, starting again from step 0" in capsys.readouterr().err
    a, b = _weights(run), _weights(tmp_path / "full")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list(ck.glob(".*")) and (ck / LATEST).is_file()


@pytest.mark.slow
def test_resume_in_a_folder_never_trained_in_is_still_an_error(tmp_path, cifar_zip, capsys):
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2)
    assert main(["train", cfg, "--out", str(tmp_path / "new"), "--resume"]) == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err


def test_clean_temps_removes_temps_and_puts_an_old_step_back(tmp_path):
    """What kills leave: temp files/folders of atomic writes, `.step-N.old` of a replacement."""
    ck = tmp_path / "checkpoints"
    (ck / ".step-00000003.x1.tmp").mkdir(parents=True)
    (ck / ".latest.x2.tmp").write_text("step-")
    (tmp_path / ".config.yaml.x3.tmp").write_text("half")
    (ck / ".step-00000002.old").mkdir()  # its replacement never arrived: put it back
    (ck / ".step-00000001.old").mkdir()  # its replacement is in place: remove
    (ck / "step-00000001").mkdir()
    clean_temps(tmp_path)
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000001", "step-00000002"]
    assert not list(tmp_path.glob(".*.tmp"))
