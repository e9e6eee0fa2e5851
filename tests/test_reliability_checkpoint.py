"""A checkpoint write that fails half-way (disk full, I/O error) leaves the previous checkpoint
loadable and unchanged and no temporary files behind (issue 8: "written atomically"). The
kill -9 cases are tests/test_train.py and tests/test_reliability_distributed.py."""

from __future__ import annotations

import errno

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
