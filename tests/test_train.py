"""Training on real CIFAR-10: loss falls, exact resume (mid-epoch, after kill -9, after SIGTERM /
SIGINT), non-finite guard, configs, optimizer groups, schedules, CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml
from safetensors.torch import load_file

from attnconv.cli import main
from attnconv.layers.centers import center_layers
from attnconv.train.checkpoint import LATEST, CheckpointError, load_model
from attnconv.train.config import Config, ScheduleConfig, config_from_dict, load_config
from attnconv.train.loop import Interrupted, Trainer
from attnconv.train.optim import lr_at, no_decay_names
from attnconv.train.runfolder import RunLock

ROOT = Path(__file__).resolve().parents[1]


_CACHE: list[Path] = []  # decoded-images cache shared by this module's runs


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    _CACHE[:] = [tmp_path_factory.mktemp("cache")]


def small(cifar: Path, out: Path, **sections) -> dict:
    """A config dict: tiny_cnn on 40 real images per class, 8 steps per epoch, 5 epochs."""
    d = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 32}},
        "data": {
            "dataset": str(cifar),
            "max_per_class": 40,
            "eval_max_per_class": 2,
            "cache_dir": str(_CACHE[0]),
        },
        "optim": {"name": "sgd", "lr": 0.05},
        "train": {
            "epochs": 5,
            "batch_size": 50,
            "log_every": 4,
            "checkpoint_every": 3,
            "threads": 1,
            "progress": False,
        },
        "out_dir": str(out),
    }
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v} if isinstance(v, dict) else v
    return d


def weights(run: Path) -> dict[str, torch.Tensor]:
    ck = run / "checkpoints"
    return load_file(ck / (ck / LATEST).read_text().strip() / "model.safetensors")


def latest_step(run: Path) -> int:
    p = run / "checkpoints" / LATEST
    return int(p.read_text().strip().split("-")[1]) if p.is_file() else -1


def train_until_step(cfg_file: Path, run: Path, step: int) -> subprocess.Popen:
    """Start `attnconv train` into ``run``; return once it has checkpointed ``step`` (or died,
    or 120 s passed)."""
    p = cli("train", str(cfg_file), "--out", str(run))
    deadline = time.time() + 120
    while latest_step(run) < step and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    return p


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "ATTNCONV_CACHE": str(_CACHE[0]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "attnconv.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


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
def test_resume_refuses_changed_config(baseline, cifar_zip, tmp_path, monkeypatch):
    d = small(cifar_zip, tmp_path / "run")
    with pytest.raises(Interrupted):
        Trainer(config_from_dict(d), stop_at_step=2).fit()
    d["optim"]["lr"] = 0.5

    def no_data(*a, **k):
        raise AssertionError("the data was read before the changed config was refused")

    monkeypatch.setattr("attnconv.train.loop.load_dataset", no_data)  # refused from the metadata
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
def test_last_good_checkpoint_never_holds_non_finite_weights(cifar_zip, tmp_path, monkeypatch,
                                                             capsys, bad, at_step):  # fmt: skip
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


# ---- configs, optimizer groups, schedules ------------------------------------------------------


def test_unknown_config_key_lists_close_matches(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown config key 'optim.lrr'; did you mean optim.lr"):
        load_config(f)
    with pytest.raises(ValueError, match=r"'train.epoch'; did you mean train.epochs"):
        load_config(None, ["train.epoch=3"])
    with pytest.raises(TypeError, match="train.epochs' must be an integer"):
        load_config(None, ["train.epochs=1.5"])
    with pytest.raises(ValueError, match="must look like key=value"):
        load_config(None, ["optim.lr"])


def test_config_base_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("optim: {lr: 0.1, momentum: 0.8}\ntrain: {epochs: 300}\n")
    (tmp_path / "cpu.yaml").write_text("base: base.yaml\ntrain: {epochs: 2}\n")
    c = load_config(tmp_path / "cpu.yaml", ["optim.lr=0.05", "schedule.milestones=[1, 2]"])
    assert (c.optim.lr, c.optim.momentum, c.train.epochs) == (0.05, 0.8, 2)
    assert c.schedule.milestones == [1, 2]


def test_cli_bad_config_and_data_one_line(tmp_path, capsys, cifar_zip):
    from attnconv.cli import main

    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"train": {"epochs": 1}, "data": {"dataset": "sample"}}))
    assert main(["train", str(f), "--set", "optim.weight_decy=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean optim.weight_decay" in err
    assert main(["train", str(f), "--set", f"data.dataset={tmp_path / 'gone.zip'}"]) == 2
    assert "gone.zip: no such dataset" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such config file" in capsys.readouterr().err


class _Quadratic(nn.Module):
    def __init__(self):
        super().__init__()
        self.centers = nn.Parameter(torch.randn(4, 2))
        self.alpha = nn.Parameter(torch.ones(4))
        self.proj = nn.Linear(3, 3)

    def attention_centers(self) -> torch.Tensor:
        return self.centers


def test_no_weight_decay_on_norms_biases_centres():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), _Quadratic(), nn.LayerNorm(3))
    names = set(no_decay_names(m, ["centers", "alpha"]))  # names given in the config
    assert names == {
        "0.bias",
        "1.weight",
        "1.bias",
        "2.centers",
        "2.alpha",
        "2.proj.bias",
        "3.weight",
        "3.bias",
    }
    assert center_layers(m) == [m[2]]


def test_schedules():
    cos = ScheduleConfig(name="cosine", warmup=0.1)
    lrs = [lr_at(s, 1.0, cos, 100, 10) for s in range(100)]
    assert lrs[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])  # linear warm-up
    assert lrs[10] == 1.0 and lrs[55] == pytest.approx(0.5, abs=0.02) and lrs[-1] < 1e-3
    ms = ScheduleConfig(name="multistep", warmup=0.0, milestones=[2, 4], gamma=0.1)
    assert [lr_at(s, 1.0, ms, 60, 10) for s in (0, 19, 20, 39, 40)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01]
    )


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_are_valid(path):
    from attnconv.models import list_models

    cfg = load_config(path)
    assert isinstance(cfg, Config) and cfg.model.name in list_models()
    if path.parent.name == "cpu":  # the small models build and run with these kwargs
        from attnconv import create_model

        model = create_model(cfg.model.name, num_classes=10, **cfg.model.kwargs)
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned"])
def test_centre_log_of_attention_models(cifar_zip, tmp_path, name):
    from attnconv.analysis.centers import read_center_log

    kw = {"downsample": 4, "hidden_size": 16, "num_layers": 2, "num_heads": 4, "ff_size": 16}
    d = small(
        cifar_zip,
        tmp_path / "run",
        model={"name": name, "kwargs": kw},
        data={"max_per_class": 4},
        train={"epochs": 2, "batch_size": 20},
    )
    tr = Trainer(config_from_dict(d))
    tr.fit()
    log = tmp_path / "run" / "centers.jsonl"
    if name == "sa_learned":  # no Gaussian centres: no log, training unaffected
        assert not log.exists()
        return
    epochs, layers = read_center_log(log)  # the analysis reader accepts the training log
    assert epochs.tolist() == [0, 1, 2] and [a.shape for a in layers] == [(3, 4, 2)] * 2
    for layer, a in zip(tr.model.layers, layers):
        assert torch.allclose(layer.attn.attention_centers(), torch.tensor(a[-1]).float())
    assert not torch.equal(torch.tensor(layers[0][0]), torch.tensor(layers[0][-1]))  # they moved
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    last = recs[-1]["alpha"]  # isotropic heads: their alpha per epoch too (sharpness)
    for layer, a in zip(tr.model.layers, last):
        assert torch.allclose(layer.attn.positional_encoding.alpha, torch.tensor(a))
    assert recs[0]["alpha"] != last  # alpha trains
    assert "layers.0.attn.positional_encoding.centers" in no_decay_names(tr.model, ["centers"])


def test_tensorboard_missing_is_a_clear_error(cifar_zip, tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        d = small(cifar_zip, tmp_path / "run", train={"tensorboard": True})
        with pytest.raises(ValueError, match="needs the tensorboard package"):
            Trainer(config_from_dict(d))
        return
    d = small(cifar_zip, tmp_path / "run", train={"tensorboard": True, "epochs": 1})
    Trainer(config_from_dict(d)).fit()
    assert list((tmp_path / "run" / "tb").glob("events.*"))


@pytest.mark.slow
def test_cpu_scale_quadratic_model_loss_falls_on_real_cifar(cifar_zip, tmp_path):
    from attnconv.train.loop import evaluate

    kw = {
        "downsample": 4,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 9,
        "ff_size": 64,
        "dropout": 0.0,
        "attn_dropout": 0.0,
    }
    d = small(
        cifar_zip,
        tmp_path / "run",
        model={"name": "sa_quadratic", "kwargs": kw},
        data={
            "max_per_class": 10,
            "eval_split": "train",
            "eval_max_per_class": 10,
            "augment": False,
        },
        optim={"name": "adamw", "lr": 3e-3, "weight_decay": 0.0},
        train={"epochs": 15, "batch_size": 50, "checkpoint_every": 0},
    )
    tr = Trainer(config_from_dict(d))
    before, _ = evaluate(tr.model, tr.eval_loader, tr.info)  # loss on the 100 training images
    after = tr.fit()["eval_loss"]
    assert after < before - 0.2, (before, after)  # measured here: 2.30 -> 1.95


@pytest.mark.slow
def test_compile_trains_and_saves_plain_weights(cifar_zip, tmp_path):
    """train.compile: the torch.compile'd model trains, and its checkpoint holds the plain
    model's names (no ``_orig_mod.`` prefix) so it loads without compiling."""
    d = small(cifar_zip, tmp_path / "run", train={"epochs": 1, "compile": True})
    tr = Trainer(config_from_dict(d))
    tr.fit()
    assert tr.net is not tr.model  # the compiled wrapper ran the steps
    saved = weights(tmp_path / "run")
    assert set(saved) == set(tr.model.state_dict())
    model, _ = load_model(tmp_path / "run")
    for name, t in model.state_dict().items():
        torch.testing.assert_close(t, saved[name])


# ---- the run folder: one training at a time, an old run never replaced by accident
def _cfg(tmp_path, cifar_zip, run, **train):
    d = small(cifar_zip, run, train={"epochs": 1, "steps_per_epoch": 2, **train})
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(d))
    return str(f)


def test_second_training_without_resume_is_refused(tmp_path, cifar_zip, capsys):
    run = tmp_path / "run"
    cfg = _cfg(tmp_path, cifar_zip, run)
    assert main(["train", cfg]) == 0
    before = (run / "metrics.csv").read_text()
    step = latest_step(run)
    capsys.readouterr()
    assert main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "\n" not in err.strip()
    assert (run / "metrics.csv").read_text() == before and latest_step(run) == step
    assert main(["train", cfg, "--overwrite"]) == 0  # explicit replacement works
    assert latest_step(run) == step


def test_concurrent_training_on_one_folder_is_locked_out(tmp_path, cifar_zip, capsys):
    run = tmp_path / "run"
    cfg = _cfg(tmp_path, cifar_zip, run)
    lock = RunLock(run)  # another training holds the folder
    try:
        assert main(["train", cfg]) == 2
        err = capsys.readouterr().err
        assert f"in use by another training (PID {os.getpid()})" in err
        assert not (run / "metrics.csv").exists()
    finally:
        lock.release()
    assert main(["train", cfg]) == 0  # free again once the holder is gone


def test_latest_pointer_never_leads_out_of_the_run_folder(tmp_path, cifar_zip):
    """`latest` holding an absolute path, `..`, or being a symlink is refused with its name;
    nothing outside the run folder is read (a symlink to a system file stays unread)."""
    run = tmp_path / "run"
    assert main(["train", _cfg(tmp_path, cifar_zip, run)]) == 0
    latest = run / "checkpoints" / "latest"
    for bad in ("/etc", "../../run/checkpoints/step-00000002", "step-2/../../x"):
        latest.write_text(bad)
        with pytest.raises(CheckpointError, match="not a step folder inside"):
            load_model(run)
    latest.unlink()
    latest.symlink_to("/etc/hostname")
    with pytest.raises(CheckpointError, match="a symlink is never followed") as e:
        load_model(run)
    assert open("/etc/hostname").read().strip() not in str(e.value)


def test_a_step_folder_without_latest_resumes_and_stale_temps_are_cleaned(tmp_path, cifar_zip):
    """Killed after a step folder was written but before `latest` named it: the newest complete
    step folder is the checkpoint; temp folders of a save killed half-way are removed at start."""
    run = tmp_path / "run"
    cfg = _cfg(tmp_path, cifar_zip, run, epochs=2)
    assert main(["train", cfg, "--stop-at-step", "1"]) == 0
    ck = run / "checkpoints"
    (ck / "latest").unlink()
    stale = ck / ".step-00000002.abc.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    _, info = load_model(run)
    assert info["state"]["step"] == 1
    assert main(["train", cfg, "--resume"]) == 0
    assert not stale.exists() and latest_step(run) == 4


def test_numbers_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads 1e-3 as a string; a float option takes it (users type it daily)."""
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 1e-3\n")
    cfg = load_config(f, ["optim.weight_decay=5E-4", "schedule.min_lr=+.5e-4"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.schedule.min_lr) == (1e-3, 5e-4, 5e-5)
    with pytest.raises(TypeError, match="'optim.lr' must be a number, got '1e-3x'"):
        load_config(f, ["optim.lr=1e-3x"])


def test_first_window_after_resume_times_only_its_own_images():
    """A log window that a stop split: its images trained before the resume (restored with the
    sums) were timed by the earlier sitting; images/s counts this sitting's images only."""
    import time
    from types import SimpleNamespace

    from attnconv.train.distributed import DistInfo
    from attnconv.train.loop import SUMS, Trainer

    rows = []
    mon = SimpleNamespace(row=lambda *a: rows.append(a), bar=lambda *a: None)
    sums = dict.fromkeys(SUMS, 0.0) | {"win_n": 50 * 64.0, "win_loss": 100.0, "win_correct": 9.0}
    stub = SimpleNamespace(sums=sums, info=DistInfo(), mon=mon, step=200, lr=0.1,
                           win_before=49 * 64.0, t0=time.time() - 8.0)  # fmt: skip
    Trainer._log_window(stub, epoch=1)
    ips = rows[0][-1]
    assert 7.0 < ips < 8.1, ips  # 64 images in ~8 s, not 3200
    assert stub.win_before == 0.0  # the next window is all this sitting's
    Trainer._log_window(stub, epoch=1)  # an empty window logs nothing
    assert len(rows) == 1
