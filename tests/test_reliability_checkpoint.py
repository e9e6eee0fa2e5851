"""A checkpoint write that fails half-way (disk full, I/O error) leaves the previous checkpoint
loadable and unchanged and no temporary files behind (issue 8: "written atomically"); a kill
between the two renames of a folder replacement is named at load time, never silent. The
kill -9 training cases are tests/test_train.py and tests/test_reliability_distributed.py."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from attnconv.models import create_model
from attnconv.train import checkpoint as ck

KW = {"num_classes": 10, "width": 8}


@pytest.mark.parametrize("fail_at", [ck.WEIGHTS, ck.META])
def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch, fail_at):
    torch.manual_seed(0)
    old = create_model("tiny_cnn", **KW)
    path = ck.save_checkpoint(tmp_path / "ckpt", old, "tiny_cnn", KW)
    new = create_model("tiny_cnn", **KW)
    real_write = ck.atomic_write

    def failing_write(p, data):
        if p.name == fail_at:  # half the bytes reach the disk, then the disk is full
            p.write_bytes(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", str(p))
        real_write(p, data)

    monkeypatch.setattr(ck, "atomic_write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        ck.save_checkpoint(path, new, "tiny_cnn", KW)
    monkeypatch.setattr(ck, "atomic_write", real_write)

    loaded, info = ck.load_model(path)  # the previous checkpoint, whole and verified
    for k, v in old.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert not list(tmp_path.glob(".*")), list(tmp_path.glob(".*"))  # no temp folders left


def test_failed_final_rename_puts_previous_checkpoint_back(tmp_path, monkeypatch):
    """Replacing a checkpoint folder is two renames (old aside, new in): if the second fails,
    the previous checkpoint is moved back."""
    torch.manual_seed(0)
    old = create_model("tiny_cnn", **KW)
    path = ck.save_checkpoint(tmp_path / "ckpt", old, "tiny_cnn", KW)
    real_replace = ck.os.replace

    def failing_replace(src, dst):
        if Path(src).name.endswith(".tmp") and Path(dst) == path:
            raise OSError(errno.EIO, "Input/output error", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output error"):
        ck.save_checkpoint(path, create_model("tiny_cnn", **KW), "tiny_cnn", KW)
    monkeypatch.setattr(ck.os, "replace", real_replace)
    loaded, _ = ck.load_model(path)
    assert torch.equal(loaded.conv1.weight, old.conv1.weight)
    assert not list(tmp_path.glob(".*"))


def test_kill_between_renames_is_named_not_silent(tmp_path):
    """A process killed between the two renames leaves only `.NAME.old`: loading says so."""
    path = ck.save_checkpoint(tmp_path / "ckpt", create_model("tiny_cnn", **KW), "tiny_cnn", KW)
    path.rename(tmp_path / ".ckpt.old")  # the state such a kill leaves behind
    with pytest.raises(ck.CheckpointError, match=r"interrupted save left the previous one at"):
        ck.load_model(path)


def test_a_full_disk_names_the_file_it_failed_to_write(tmp_path, monkeypatch):
    """os.fsync / write errors carry no file name ("[Errno 28] No space left on device"): the
    atomic write adds the path it was writing, and leaves no temp file."""

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.os, "fsync", full)
    with pytest.raises(OSError, match=r"No space left on device: '.*metrics.json'") as e:
        ck.atomic_write(tmp_path / "metrics.json", b"{}")
    assert e.value.errno == errno.ENOSPC
    assert not list(tmp_path.iterdir())


def test_a_damaged_latest_checkpoint_names_the_last_intact_one_and_resumes_from_it(
    tmp_path, cifar_zip, capsys
):
    """--resume on a damaged latest checkpoint says which one is intact and the flag that
    resumes from it; --resume-from-intact does (the damaged one kept aside), to the weights
    of an uninterrupted run; the closing line says how many images the accuracy is of."""
    from safetensors.torch import load_file

    from attnconv.cli import main
    from tiny_runs import tiny_config

    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(run))
    assert main(["train", cfg, "--stop-at-step", "3"]) == 0
    weights = run / "checkpoints" / "step-00000003" / ck.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])  # truncated (a disk that filled up)
    capsys.readouterr()
    assert main(["train", cfg, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    intact = run / "checkpoints" / "step-00000002"
    assert "truncated checkpoint" in err and f"the last intact checkpoint is {intact}" in err
    assert "--resume-from-intact" in err
    assert main(["train", cfg, "--resume-from-intact"]) == 0
    out = capsys.readouterr().out
    assert f"resuming from the last intact checkpoint {intact}" in out
    assert "kept aside: damaged-step-00000003" in out
    assert "eval accuracy" in out and "on 10 test images" in out.strip().splitlines()[-1]
    assert (run / "checkpoints" / "damaged-step-00000003" / ck.WEIGHTS).stat().st_size == 100
    whole = tmp_path / "whole"
    assert main(["train", tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(whole))]) == 0
    a = load_file(ck.follow_latest(run / "checkpoints") / ck.WEIGHTS)
    b = load_file(ck.follow_latest(whole / "checkpoints") / ck.WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
