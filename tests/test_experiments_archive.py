"""benchmarks/experiments_archive.py: the run folders kept in the repository. A run root lost
mid-run (a new machine) is restored from the archive and the run resumes from its saved step to
the same weights as an uninterrupted run; a finished run keeps what the report reads and its
final weights (weights-only, loadable), an unfinished one a resume checkpoint replaced only a
quarter of the run's steps further; a run folder the run root has is never overwritten."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnconv.catalog import CIFAR_ZIP
from attnconv.cli import main
from attnconv.loading import load_model
from attnconv.models import create_model
from attnconv.train.checkpoint import follow_latest, save_checkpoint
from tiny_runs import tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import experiments_archive as archive  # noqa: E402


def _weights(run: Path) -> dict:
    return load_file(follow_latest(run / "checkpoints") / "model.safetensors")


def _sha(f: Path) -> str:
    return hashlib.sha256(f.read_bytes()).hexdigest()


def _checkpoint(run: Path, step: int, total: int | None = 100, latest: bool = True) -> Path:
    """A real training checkpoint of tiny_cnn (weights, SGD momentum, RNG state) as the trainer
    writes it: ``run/checkpoints/step-N`` (and ``latest`` naming it), with the run's config.yaml
    and a metrics row for its step; machine paths under the run's parent's parent (the base)."""
    torch.manual_seed(step)
    model = create_model("tiny_cnn", width=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    state = {"step": step, "epoch": 0} | ({"total_steps": total} if total else {})
    base = run.parent.parent
    config = {"data": {"dataset": str(base / "data" / CIFAR_ZIP)}, "out_dir": str(run)}
    name = f"step-{step:08d}"
    save_checkpoint(
        run / "checkpoints" / name,
        model,
        "tiny_cnn",
        {"width": 4},
        optimizer=opt,
        state=state,
        state_tensors={"rng": torch.arange(4)},
        config=config,
        extra={"classes": [str(i) for i in range(10)], "mean": [0.5] * 3, "std": [0.2] * 3},
    )
    if latest:
        (run / "checkpoints" / "latest").write_text(name + "\n")
    (run / "config.yaml").write_text(f"out_dir: {run}\n")
    with open(run / "metrics.csv", "a") as f:
        f.write(f"{step},0.5\n")
    return run / "checkpoints" / name


def test_a_lost_run_root_resumes_from_the_archive_to_the_same_weights(tmp_path, cifar_zip):
    runs, store = tmp_path / "runs", tmp_path / "archive"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(runs / "exp"))
    assert main(["train", cfg, "--stop-at-step", "2"]) == 0  # 4 steps in all
    (runs / "exp" / "tb").mkdir(exist_ok=True)
    (runs / "exp" / "tb" / "events").write_text("x")
    assert archive.save(runs, store, base=tmp_path) == ["exp"]
    kept = {p.relative_to(store / "exp").as_posix() for p in store.rglob("*") if p.is_file()}
    assert {"config.yaml", "metrics.csv", "checkpoints/latest"} <= kept
    for f in store.rglob("*"):  # no machine folder in the archive: paths made relative
        if f.suffix in (".yaml", ".json"):
            assert str(tmp_path) not in f.read_text(), f
    assert "out_dir: ../runs/exp" in (store / "exp" / "config.yaml").read_text()
    steps = {k.split("/")[1] for k in kept if k.startswith("checkpoints/step-")}
    assert steps == {"step-00000002"}  # the resume point only
    assert not any(k.startswith("tb/") for k in kept)

    shutil.rmtree(runs)  # the machine is gone
    assert archive.restore(runs, archive=store) == ["exp"]
    assert main(["train", cfg, "--resume"]) == 0
    resumed = _weights(runs / "exp")

    whole = tmp_path / "whole"
    assert main(["train", tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(whole))]) == 0
    expect = _weights(whole)
    assert resumed.keys() == expect.keys()
    assert all((resumed[k] == expect[k]).all() for k in expect)

    (runs / "exp" / "wall.json").write_text('{"train_seconds": 1.0}')  # finished
    archive.save(runs, store)
    kept = {p.relative_to(store / "exp").as_posix() for p in store.rglob("*") if p.is_file()}
    assert "wall.json" in kept and not any(k.startswith("checkpoints") for k in kept)
    assert {k for k in kept if k.startswith("final/")} == {
        "final/checkpoint.json",
        "final/model.safetensors",
    }
    model, _ = load_model(store / "exp" / "final")  # its final weights, as a user loads them
    assert all((model.state_dict()[k] == resumed[k]).all() for k in resumed)


def test_restore_never_overwrites_a_run_folder_the_run_root_has(tmp_path):
    store, runs = tmp_path / "archive", tmp_path / "runs"
    for name, text in (("a", "archived"), ("b", "archived")):
        (store / name).mkdir(parents=True)
        (store / name / "config.yaml").write_text(text)
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "config.yaml").write_text("newer")
    assert archive.restore(runs, archive=store) == ["b"]
    assert (runs / "a" / "config.yaml").read_text() == "newer"
    assert (runs / "b" / "config.yaml").read_text() == "archived"
    assert archive.restore(tmp_path / "empty", ["zzz"], archive=store) == []


def test_run_archives_the_run_it_trains_while_it_trains(tmp_path, monkeypatch):
    """benchmarks/experiments.py's ``sh`` calls its ``every`` each SAVE_EVERY seconds while the
    command runs (the runner saves the training run there), and ``save(names=...)`` saves only
    the runs named."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "experiments_runner_archive", Path(archive.__file__).with_name("experiments.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "SAVE_EVERY", 0.05)
    ticks = []
    mod.sh(
        [sys.executable, "-c", "import time; time.sleep(0.5)"],
        tmp_path / "log",
        every=lambda: ticks.append(1),
    )
    assert len(ticks) >= 3
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.yaml").write_text(name)
    assert archive.save(runs, tmp_path / "store", names=["b"]) == ["b"]
    assert not (tmp_path / "store" / "a").exists()


def test_a_finished_run_keeps_its_final_weights_weights_only(tmp_path):
    runs, store = tmp_path / "root" / "runs", tmp_path / "archive"
    run = runs / "done"
    last = _checkpoint(run, 4)
    named = _checkpoint(run, 2)  # `latest` names step 2: that one, not the last folder
    (run / "wall.json").write_text('{"train_seconds": 1.0}')
    assert archive.save(runs, store, base=tmp_path) == ["done"]
    final = store / "done" / "final"
    assert sorted(p.name for p in final.iterdir()) == ["checkpoint.json", "model.safetensors"]
    assert _sha(final / "model.safetensors") == _sha(named / "model.safetensors")
    assert not (store / "done" / "checkpoints").exists()
    text = (final / "checkpoint.json").read_text()
    assert str(tmp_path) not in text and "../" not in text  # no machine's paths, not even ../
    meta = json.loads(text)
    assert "optimizer" not in meta and "total_steps" not in meta["state"]
    assert meta["state"] == {"step": 2} and list(meta["files"]) == ["model.safetensors"]
    assert meta["config"]["data"]["dataset"] == CIFAR_ZIP and meta["config"]["out_dir"] is None
    model, info = load_model(final)  # digest and weights verified
    weights = load_file(named / "model.safetensors")
    assert all((model.state_dict()[k] == weights[k]).all() for k in weights)
    assert info["classes"] == [str(i) for i in range(10)]

    (run / "checkpoints" / "latest").unlink()  # no `latest`: the last step folder
    archive.save(runs, store, base=tmp_path)
    assert _sha(final / "model.safetensors") == _sha(last / "model.safetensors")
    assert json.loads((final / "checkpoint.json").read_text())["state"] == {"step": 4}

    before = {f.name: _sha(f) for f in final.iterdir()}
    shutil.rmtree(run / "checkpoints")  # none left in the run root: the archived one stays
    (run / "metrics.csv").write_text("4,0.25\n")
    assert archive.save(runs, store, base=tmp_path) == ["done"]
    assert (store / "done" / "metrics.csv").read_text() == "4,0.25\n"
    assert {f.name: _sha(f) for f in final.iterdir()} == before

    shutil.rmtree(runs)  # restore brings final/ back too
    assert archive.restore(runs, archive=store) == ["done"]
    load_model(runs / "done" / "final")


def test_an_unfinished_runs_archived_checkpoint_is_replaced_a_quarter_further(tmp_path):
    runs, store = tmp_path / "root" / "runs", tmp_path / "archive"
    run = runs / "long"
    first = _checkpoint(run, 10, total=100)
    assert archive.save(runs, store, base=tmp_path) == ["long"]  # none archived yet: copied
    kept = store / "long" / "checkpoints"
    assert (kept / "latest").read_text() == "step-00000010\n"
    shutil.rmtree(first)  # the trainer prunes it: the archive keeps its own copy
    pinned = {f.name: _sha(f) for f in (kept / "step-00000010").iterdir()}
    assert "state.safetensors" in pinned

    _checkpoint(run, 20, total=100)  # 10% further: the archived checkpoint stays
    assert archive.save(runs, store, base=tmp_path) == ["long"]
    assert (kept / "latest").read_text() == "step-00000010\n"
    assert sorted(p.name for p in kept.iterdir()) == ["latest", "step-00000010"]
    assert {f.name: _sha(f) for f in (kept / "step-00000010").iterdir()} == pinned
    assert (store / "long" / "metrics.csv").read_text() == "10,0.5\n20,0.5\n"  # logs updated

    newer = _checkpoint(run, 35, total=100)  # 25% further: replaced
    archive.save(runs, store, base=tmp_path)
    assert (kept / "latest").read_text() == "step-00000035\n"
    assert sorted(p.name for p in kept.iterdir()) == ["latest", "step-00000035"]
    assert _sha(kept / "step-00000035" / "model.safetensors") == _sha(newer / "model.safetensors")
    assert str(tmp_path) not in (kept / "step-00000035" / "checkpoint.json").read_text()
    load_model(kept)

    _checkpoint(run, 36, total=None)  # no total steps recorded: replaced as ever
    archive.save(runs, store, base=tmp_path)
    assert (kept / "latest").read_text() == "step-00000036\n"
