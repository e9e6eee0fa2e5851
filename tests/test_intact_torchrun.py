"""``--resume-from-intact`` under torchrun: rank 0 alone sets the damaged latest checkpoint aside
and points ``latest`` at the intact one, before it joins the process group; the other rank waits
for it there (the trainer's first barrier on a resume), so no rank reads the damaged checkpoint
or repairs a second time, and both ranks resume. Real torchrun, gloo on 127.0.0.1."""

from __future__ import annotations

import pytest
import yaml

from attnconv.train import checkpoint as ck
from torchrun_helpers import torchrun_train


@pytest.mark.slow
def test_torchrun_resume_from_intact_repairs_once_and_every_rank_resumes(tmp_path):
    from conftest import CIFAR_ZIP

    d = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 4}},
        "data": {
            "dataset": str(CIFAR_ZIP),
            "max_per_class": 4,
            "eval_max_per_class": 1,
            "cache_dir": str(tmp_path / "cache"),
        },
        "train": {
            "epochs": 2,
            "batch_size": 10,
            "threads": 1,
            "progress": False,
            "checkpoint_every": 1,
        },
    }
    cfg, run = tmp_path / "c.yaml", tmp_path / "run"
    cfg.write_text(yaml.safe_dump(d))
    first = torchrun_train(cfg, run, "--stop-at-step", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    weights = run / "checkpoints" / "step-00000003" / ck.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])  # truncated (a disk that filled up)
    again = torchrun_train(cfg, run, "--resume-from-intact")
    assert again.returncode == 0, again.stderr[-3000:]
    intact = run / "checkpoints" / "step-00000002"
    said = [line for line in again.stdout.splitlines() if "last intact checkpoint" in line]
    assert len(said) == 1 and str(intact) in said[0], again.stdout[-2000:]  # one repair
    aside = sorted(p.name for p in (run / "checkpoints").glob("damaged-*"))
    assert aside == ["damaged-step-00000003"]
    assert int(ck.follow_latest(run / "checkpoints").name[5:]) > 3  # trained on past the repair
