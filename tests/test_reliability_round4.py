"""Reliability, round four (issue 46): a training step's memory refused before any work, an
interrupted final evaluation redone on --resume, position-only attention with dropout on the
same counter-hash mask as every other path."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

import attnconv
from attnconv.catalog import RECIPES
from attnconv.models.budget import training_bytes
from attnconv.train import loop
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Interrupted, Trainer
from train_helpers import small, use_cache, weights


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    use_cache(tmp_path_factory.mktemp("cache"))


def test_a_training_step_too_large_is_refused_before_work():
    """65,536 heads at hidden 64: 6 GiB of parameters passes a parameter count, not a training
    step (gradients, momentum, the (B, T, Nh, Dv) attention outputs)."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"needs at least .* GiB to train at batch 64") as e:
        training_bytes(
            "sa_quadratic",
            {"hidden_size": 64, "num_heads": 65536},
            64,
            1,
            12 << 30,
            "model 'sa_quadratic'",
        )
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 30
    small_cfg = {"hidden_size": 64, "num_layers": 6, "num_heads": 9, "ff_size": 128}
    need = training_bytes("sa_quadratic", small_cfg, 64, 1, 12 << 30, "x")
    params = sum(
        p.numel() * 4 for p in attnconv.create_model("sa_quadratic", **small_cfg).parameters()
    )
    acts = 6 * 64 * 256 * 9 * 64 * 4  # layers x B x T x Nh x Dv (identity values) x float32
    assert params * 3 + acts <= need <= params * 3 + acts + (1 << 20)


@pytest.mark.slow
def test_the_cli_refuses_it_in_seconds(tmp_path):
    t0 = time.perf_counter()
    cfg = str(RECIPES / "cpu" / "sa_quadratic.yaml")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnconv.cli",
            "train",
            cfg,
            "--set",
            "model.kwargs={num_heads: 65536, hidden_size: 64}",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "needs at least" in r.stderr.strip().splitlines()[-1]
    assert time.perf_counter() - t0 < 60 and not (tmp_path / "run" / "checkpoints").exists()


def test_an_interrupted_final_evaluation_is_redone_on_resume(cifar_zip, tmp_path, monkeypatch):
    """SIGTERM during the last evaluation, then --resume: the evaluation runs and is logged (not
    "already finished" with no final row); a second --resume has nothing left."""
    d = small(cifar_zip, tmp_path / "run", train={"epochs": 2, "checkpoint_every": 0})
    real, trainers = loop.evaluate, []

    def signalled(*args, **kw):  # the signal arrives as the final evaluation starts
        tr = trainers[-1]
        if tr.step == tr.total:
            tr.stop_signal = signal.SIGTERM
        return real(*args, **kw)

    monkeypatch.setattr(loop, "evaluate", signalled)
    trainers.append(Trainer(config_from_dict(d)))
    with pytest.raises(Interrupted):
        trainers[-1].fit()
    monkeypatch.setattr(loop, "evaluate", real)
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    total = trainers[-1].total
    assert not [r for r in rows if r["kind"] == "eval" and int(r["step"]) == total]
    again = Trainer(config_from_dict(d), resume=True)
    assert "final evaluation was interrupted" in again.resume_note
    last = again.fit()
    assert last["step"] == total and 0 <= last["eval_acc"] <= 1
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert [r for r in rows if r["kind"] == "eval" and int(r["step"]) == total]
    done = Trainer(config_from_dict(d), resume=True)
    assert "already finished" in done.resume_note
    assert done.fit() == {}


@pytest.mark.parametrize("positional", ["quadratic", "relative_learned"])
def test_position_only_dropout_draws_dropped_links(positional):
    """The shared kernel's per-image dropout equals the plain path's under one seed (it drew
    F.dropout's mask before: 0.45 off on outputs of about 0.6)."""
    lay = attnconv.MultiHeadSelfAttention2d(
        8, 8, num_heads=2, positional=positional, content=False, dropout=0.3
    )
    lay = lay.double().train()
    x = torch.randn(2, 8, 5, 6, dtype=torch.float64, requires_grad=True)
    outs = []
    for backend in (None, "reference"):
        lay.backend = backend
        assert (lay.kernel(x) == "shared") == (backend is None)
        torch.manual_seed(3)
        y = lay(x)
        outs.append((y, *torch.autograd.grad(y.square().sum(), [x, *lay.parameters()])))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_resume_accepts_the_dataset_moved_not_another(cifar_zip, tmp_path):
    from attnconv.train.resume import check_same_config

    d = small(cifar_zip, tmp_path / "run")
    meta = {"config": config_from_dict(d).to_dict()}
    moved = {**d, "data": {**d["data"], "dataset": str(tmp_path / "elsewhere" / cifar_zip.name)}}
    check_same_config(meta, config_from_dict(moved))
    other = {**d, "data": {**d["data"], "dataset": str(tmp_path / "other.zip")}}
    with pytest.raises(ValueError, match="differs from the checkpoint's in data.dataset"):
        check_same_config(meta, config_from_dict(other))


def test_resume_accepts_a_run_saved_before_a_key_existed_at_its_default(cifar_zip, tmp_path):
    """A config key added by a later version is missing from an older run's checkpoint: the run
    had the key's default, so a resume with the default continues it; another value does not."""
    from attnconv.train.resume import check_same_config

    d = small(cifar_zip, tmp_path / "run")
    meta = {"config": config_from_dict(d).to_dict()}
    del meta["config"]["train"]["label_smoothing"]  # (default 0.0) not a resume-free key
    check_same_config(meta, config_from_dict(d))
    smoothed = {**d, "train": {**d["train"], "label_smoothing": 0.1}}
    with pytest.raises(ValueError, match="differs from the checkpoint's in train.label_smoothing"):
        check_same_config(meta, config_from_dict(smoothed))


def test_a_checkpoint_with_nan_weights_is_not_evaluated(cifar_zip, tmp_path, capsys):
    from attnconv.cli import main
    from attnconv.train.checkpoint import save_checkpoint

    model = attnconv.create_model("tiny_cnn", width=8)
    with torch.no_grad():
        next(model.parameters())[0] = float("nan")
    save_checkpoint(tmp_path / "ck", model, "tiny_cnn", {"width": 8})
    assert main(["eval", str(tmp_path / "ck"), "--data", str(cifar_zip)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "non-finite weights" in err[-1]


def test_run_folders_follow_the_umask(cifar_zip, tmp_path):
    """Colleagues on a shared machine can read a run: checkpoints, config.yaml and their folders
    get the modes a plain open()/mkdir() gives under the umask (mkstemp/mkdtemp give 0600/0700)."""
    import os
    import stat

    d = small(cifar_zip, tmp_path / "run", train={"epochs": 1})
    old = os.umask(0o022)
    try:
        Trainer(config_from_dict(d)).fit()
    finally:
        os.umask(old)
    run = tmp_path / "run"
    files = [run / "config.yaml", run / "metrics.csv", *run.glob("checkpoints/step-*/*")]
    folders = [run / "checkpoints", *run.glob("checkpoints/step-*")]
    assert len(files) > 3 and len(folders) > 1
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, (f, oct(f.stat().st_mode))
    for f in folders:
        assert stat.S_IMODE(f.stat().st_mode) == 0o755, (f, oct(f.stat().st_mode))


SA_TINY = {"downsample": 2, "hidden_size": 16, "num_layers": 1, "num_heads": 4}


def test_an_interrupted_evaluation_mid_run_is_redone_on_resume(cifar_zip, tmp_path, monkeypatch):
    """SIGINT during an epoch's evaluation before the last, then --resume: that evaluation's
    row and centres line are written as an uninterrupted run writes them (the resumed run went
    straight on to the next epoch, and both were lost), and the weights end equal."""
    model = {"name": "sa_quadratic", "kwargs": SA_TINY}
    train = {"epochs": 3, "checkpoint_every": 0}
    full = small(cifar_zip, tmp_path / "full", model=model, train=train)
    Trainer(config_from_dict(full)).fit()
    d = small(cifar_zip, tmp_path / "run", model=model, train=train)
    real, trainers = loop.evaluate, []

    def signalled(*args, **kw):  # the signal arrives as the first epoch's evaluation starts
        tr = trainers[-1]
        if tr.step == len(tr.loader):
            tr.stop_signal = signal.SIGINT
        return real(*args, **kw)

    monkeypatch.setattr(loop, "evaluate", signalled)
    trainers.append(Trainer(config_from_dict(d)))
    with pytest.raises(Interrupted):
        trainers[-1].fit()
    monkeypatch.setattr(loop, "evaluate", real)
    again = Trainer(config_from_dict(d), resume=True)
    assert f"step {len(again.loader)}'s evaluation was interrupted" in again.resume_note
    again.fit()

    def logs(run):
        keys = ("kind", "epoch", "step", "lr", "loss", "acc")  # the redone row's lr too
        rows = [tuple(r[k] for k in keys) for r in csv.DictReader(open(run / "metrics.csv"))]
        centres = [json.loads(line)["epoch"] for line in open(run / "centers.jsonl")]
        return rows, centres

    assert logs(tmp_path / "run") == logs(tmp_path / "full")
    assert logs(tmp_path / "full")[1] == [0, 1, 2, 3]
    a, b = weights(tmp_path / "run"), weights(tmp_path / "full")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_failed_start_leaves_nothing_to_resume(cifar_zip, tmp_path):
    """--resume of a folder no training began in is refused before the folder is made (it left
    a lock behind, and a second --resume then started a new run from step 0); a model whose
    num_classes differs from the data's is one error before any log is written."""
    d = small(cifar_zip, tmp_path / "typo")
    for _ in range(2):
        with pytest.raises(FileNotFoundError, match="--resume: no checkpoint in"):
            Trainer(config_from_dict(d), resume=True)
    assert not (tmp_path / "typo").exists()
    d = small(cifar_zip, tmp_path / "five", model={"kwargs": {"width": 4, "num_classes": 5}})
    with pytest.raises(ValueError, match="num_classes is 5, the dataset has 10 classes"):
        Trainer(config_from_dict(d))
    assert not (tmp_path / "five" / "config.yaml").exists()
    with pytest.raises(FileNotFoundError, match="--resume: no checkpoint"):
        Trainer(config_from_dict(d), resume=True)


@pytest.mark.parametrize("eval_every", [1, 2])
def test_time_limit_reached_at_an_epoch_end_logs_no_phantom_epoch(
    cifar_zip, tmp_path, monkeypatch, eval_every
):
    """The limit passes during epoch 1's end (its evaluation, or its checkpoint): epoch 2 trains
    no step, so nothing is logged for it (a second evaluation, centres line and checkpoint
    labelled epoch 2 at the same step were); the evaluation epoch 1's end skipped, when not
    due, is done once, labelled epoch 1."""
    model = {"name": "sa_quadratic", "kwargs": SA_TINY}
    train = {"eval_every": eval_every, "time_limit": 3600}
    d = small(cifar_zip, tmp_path / "run", model=model, train=train)
    end_epoch = Trainer._end_epoch

    def then_out_of_time(self, epoch):
        end_epoch(self, epoch)
        self.t_start -= 2 * self.cfg.train.time_limit  # the limit passed during this end

    monkeypatch.setattr(Trainer, "_end_epoch", then_out_of_time)
    trainer = Trainer(config_from_dict(d))
    last = trainer.fit()
    steps = len(trainer.loader)
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    evals = [(r["epoch"], r["step"]) for r in rows if r["kind"] == "eval"]
    assert evals == [("1", str(steps))]
    centres = [json.loads(line)["epoch"] for line in open(tmp_path / "run" / "centers.jsonl")]
    assert centres == [0, 1]
    assert last["epoch"] == 1 and last["step"] == steps
