"""Training runs beyond resume: the centre log of attention models, tensorboard, the CPU-scale
quadratic model's loss, torch.compile, the run folder (one training at a time, `latest` never
leads out), the log window after a resume."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

from attnconv.cli import main
from attnconv.train.checkpoint import CheckpointError, load_model
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Trainer
from attnconv.train.optim import no_decay_names
from attnconv.train.runfolder import RunLock
from train_helpers import latest_step, small, use_cache, weights


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    use_cache(tmp_path_factory.mktemp("cache"))


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


@pytest.mark.slow  # a training start and two resumes
def test_machines_log_says_where_each_start_and_resume_trained(cifar_zip, tmp_path):
    from attnconv import __version__
    from attnconv.cpuinfo import cpu_name
    from attnconv.train.loop import Interrupted

    d = small(cifar_zip, tmp_path / "run", train={"epochs": 2, "threads": 2})  # the test's: 1
    log = tmp_path / "run" / "machines.jsonl"
    with pytest.raises(Interrupted):
        Trainer(config_from_dict(d), stop_at_step=3).fit()
    with pytest.raises(Interrupted):
        Trainer(config_from_dict(d), resume=True, stop_at_step=6).fit()
    with log.open("a") as f:  # a line past the checkpoint resumed from is dropped, as metrics'
        f.write(json.dumps({"step": 9}) + "\n")
    Trainer(config_from_dict(d), resume=True).fit()
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 3, 6]
    for r in recs:
        assert (r["device"], r["name"], r["threads"], r["processes"]) == ("cpu", cpu_name(), 2, 1)
        assert (r["torch"], r["attnconv"]) == (torch.__version__, __version__)
        assert r["time"].endswith("Z")
    Trainer(config_from_dict(d), overwrite=True).fit()  # a new run: a new log
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0]


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
    stub = SimpleNamespace(
        sums=sums,
        info=DistInfo(),
        mon=mon,
        step=200,
        lr=0.1,
        win_before=49 * 64.0,
        t0=time.time() - 8.0,
    )
    Trainer._log_window(stub, epoch=1)
    ips = rows[0][-1]
    assert 7.0 < ips < 8.1, ips  # 64 images in ~8 s, not 3200
    assert stub.win_before == 0.0  # the next window is all this sitting's
    Trainer._log_window(stub, epoch=1)  # an empty window logs nothing
    assert len(rows) == 1
