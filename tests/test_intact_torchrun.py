"""``--resume-from-intact`` under torchrun: rank 0 alone sets the damaged latest checkpoint aside
and points ``latest`` at the intact one, before it joins the process group; the other rank waits
for it there (the trainer's first barrier on a resume), so no rank reads the damaged checkpoint
or repairs a second time, and both ranks resume. Real torchrun, gloo on 127.0.0.1."""

from __future__ import annotations

import pytest

from attnconv.train import checkpoint as ck
from tiny_runs import tiny_config
from torchrun_helpers import torchrun_train


@pytest.mark.slow
def test_torchrun_resume_from_intact_repairs_once_and_every_rank_resumes(tmp_path):
    from conftest import CIFAR_ZIP

    cfg, run = tiny_config(tmp_path, CIFAR_ZIP, epochs=2, max_per_class=4), tmp_path / "run"
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
