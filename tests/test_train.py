"""Training on real CIFAR-10: loss falls, exact resume (mid-epoch, after kill -9, after SIGTERM /
SIGINT), the non-finite guard, one bf16 step with clipping and label smoothing. Configs and
schedules: test_train_config.py; the run folder, centre log and other runs: test_train_runs.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import yaml

from attnconv.cli import main
from attnconv.train.checkpoint import load_model
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Interrupted, Trainer
from train_helpers import (
    assert_identical,
    cli,
    latest_step,
    small,
    train_until_step,
    use_cache,
    weights,
)


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    use_cache(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """An uninterrupted run (in-process) of ``small``; its config file and final weights."""
    from conftest import CIFAR_ZIP

    tmp = tmp_path_factory.mktemp("baseline")
    d = small(CIFAR_ZIP, tmp / "run")
    cfg_file = tmp / "small.yaml"
    cfg_file.write_text(yaml.safe_dump({k: v for k, v in d.items() if k != "out_dir"}))
    threads = torch.get_num_threads()
    Trainer(config_from_dict(d)).fit()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)
    return cfg_file, weights(tmp / "run"), tmp / "run"


@pytest.mark.slow
def test_loss_falls_on_real_cifar(baseline):
    import csv

    _, _, run = baseline
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    train = [r for r in rows if r["kind"] == "train"]
    first = sum(float(r["loss"]) for r in train if r["epoch"] == "1") / 2
    last = sum(float(r["loss"]) for r in train if r["epoch"] == "5") / 2
    assert last < first - 0.15, (first, last)
    assert {r["kind"] for r in rows} == {"train", "eval"} and float(train[-1]["images_per_s"]) > 0


@pytest.mark.slow
def test_resume_mid_epoch_is_exact(baseline, cifar_zip, tmp_path):
    _, final, _ = baseline
    d = small(cifar_zip, tmp_path / "run")
    with pytest.raises(Interrupted):
        Trainer(config_from_dict(d), stop_at_step=13).fit()  # epoch 2, batch 5 of 8
    assert latest_step(tmp_path / "run") == 13
    Trainer(config_from_dict(d), resume=True).fit()
    assert_identical(weights(tmp_path / "run"), final)
    # the metrics rows after step 13 were dropped and written again: same steps as uninterrupted
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    base = (baseline[2] / "metrics.csv").read_text().splitlines()
    assert [ln.split(",")[:6] for ln in lines] == [ln.split(",")[:6] for ln in base]


@pytest.mark.slow
def test_milestone_checkpoints_are_kept_and_the_key_may_change_on_resume(
    baseline, cifar_zip, tmp_path
):
    """train.keep_every: the checkpoints of its multiples survive the pruning (keep_checkpoints
    1); set only on --resume (a free key), the run stays exact."""
    _, final, _ = baseline
    d = small(cifar_zip, tmp_path / "run", train={"keep_checkpoints": 1})
    with pytest.raises(Interrupted):
        Trainer(config_from_dict(d), stop_at_step=13).fit()  # step 12 pruned: no milestones yet
    d["train"]["keep_every"] = 12
    Trainer(config_from_dict(d), resume=True).fit()
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert kept == ["step-00000024", "step-00000036", "step-00000040"]
    assert_identical(weights(tmp_path / "run"), final)


@pytest.mark.slow
def test_resume_refuses_changed_config(baseline, cifar_zip, tmp_path, monkeypatch):
    d = small(cifar_zip, tmp_path / "run")
    with pytest.raises(Interrupted):
        Trainer(config_from_dict(d), stop_at_step=2).fit()
    d["optim"]["lr"] = 0.5

    def no_data(*a, **k):
        raise AssertionError("the data was read before the changed config was refused")

    monkeypatch.setattr("attnconv.train.loaders.load_dataset", no_data)  # refused from the metadata
    with pytest.raises(ValueError, match="config differs from the checkpoint's in optim.lr"):
        Trainer(config_from_dict(d), resume=True)


@pytest.mark.slow
def test_kill_9_then_resume_is_exact(baseline, tmp_path):
    cfg_file, final, _ = baseline
    run = tmp_path / "run"
    p = train_until_step(cfg_file, run, 3)
    p.kill()  # SIGKILL: no handler runs
    p.communicate()
    killed_at = latest_step(run)
    assert p.returncode == -signal.SIGKILL and 3 <= killed_at < 40, (p.returncode, killed_at)
    r = cli("train", str(cfg_file), "--out", str(run), "--resume")
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    assert_identical(weights(run), final)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_resumable_checkpoint_and_exits(baseline, tmp_path, sig):
    cfg_file, final, _ = baseline
    run = tmp_path / "run"
    p = train_until_step(cfg_file, run, 3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name} at step" in err and "Traceback" not in err
    stopped = latest_step(run)
    assert 3 <= stopped < 40
    load_model(run)  # a complete, loadable checkpoint
    if sig == signal.SIGINT:
        return  # same handler as SIGTERM; resuming after it is checked once, below
    r = cli("train", str(cfg_file), "--out", str(run), "--resume")
    _, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    assert_identical(weights(run), final)


def _diverged_line(cfg: Path, d: dict) -> list[str]:
    """Train config ``d`` in a subprocess that must stop on a non-finite value (exit 3, one
    line, no traceback); returns that line (as a one-element list)."""
    cfg.write_text(yaml.safe_dump(d))
    p = cli("train", str(cfg))
    _, err = p.communicate(timeout=300)
    assert p.returncode == 3, err
    line = [ln for ln in err.splitlines() if "non-finite" in ln]
    assert len(line) == 1 and "Traceback" not in err
    return line


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good(cifar_zip, tmp_path):
    cfg = tmp_path / "nan.yaml"
    d = small(
        cifar_zip,
        tmp_path / "run",
        optim={"lr": 1.0e4, "weight_decay": 0.0},
        schedule={"warmup": 0.0},
        train={"checkpoint_every": 1, "batch_size": 20},
    )
    line = _diverged_line(cfg, d)
    bad = int(line[0].split(" at step ")[1].split()[0])
    good = latest_step(tmp_path / "run")
    assert good == bad - 1 and f"last good checkpoint: {tmp_path / 'run'}" in line[0]
    model, info = load_model(tmp_path / "run")
    assert info["state"]["step"] == good
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


@pytest.mark.slow
@pytest.mark.parametrize("bad, at_step", [(float("inf"), 1), (float("nan"), 3)])
def test_last_good_checkpoint_never_holds_non_finite_weights(
    cifar_zip, tmp_path, monkeypatch, capsys, bad, at_step
):
    """A finite loss can still leave inf/NaN weights after the optimizer step (an overflowing
    update; the config schema refuses inf/NaN/huge values, so the step is made to overflow here):
    such weights are never saved, training stops (exit 3, one line) and `latest` (if any) loads
    finite."""
    real_step = torch.optim.SGD.step

    def overflowing_step(opt, *a, **k):
        out = real_step(opt, *a, **k)
        overflowing_step.calls.append(1)
        if len(overflowing_step.calls) == at_step:
            with torch.no_grad():
                opt.param_groups[0]["params"][0].view(-1)[0] = bad
        return out

    overflowing_step.calls = []
    monkeypatch.setattr(torch.optim.SGD, "step", overflowing_step)
    cfg = tmp_path / "bad.yaml"
    d = small(cifar_zip, tmp_path / "run", train={"checkpoint_every": 1, "batch_size": 20})
    cfg.write_text(yaml.safe_dump(d))
    assert main(["train", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert f"non-finite weights (conv1.weight) after step {at_step}" in err, err
    ck = tmp_path / "run" / "checkpoints"
    if at_step > 1:
        assert latest_step(tmp_path / "run") == at_step - 1
        assert f"last good checkpoint: {ck / f'step-{at_step - 1:08d}'}" in err
    else:
        assert "no checkpoint was saved yet" in err and not (ck / "latest").exists()
    for step in ck.glob("step-*"):  # no checkpoint on disk holds non-finite weights
        model, _ = load_model(step)
        assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_bf16_grad_clip_label_smoothing(cifar_zip, tmp_path):
    d = small(
        cifar_zip,
        tmp_path / "run",
        optim={"momentum": 0.0, "weight_decay": 0.0},
        schedule={"name": "constant", "warmup": 0.0},
        train={
            "epochs": 1,
            "steps_per_epoch": 1,
            "grad_clip": 1e-3,
            "bf16": True,
            "label_smoothing": 0.1,
        },
    )
    tr = Trainer(config_from_dict(d))
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(tr.model.parameters(), before)])
    # one plain SGD step of a gradient clipped to norm 1e-3: ||update|| = lr * 1e-3
    assert delta.norm().item() == pytest.approx(0.05 * 1e-3, rel=1e-3)
