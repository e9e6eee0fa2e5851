"""benchmarks/experiments_archive.py: the run folders kept in the repository. A run root lost
mid-run (a new machine) is restored from the archive and the run resumes from its saved step to
the same weights as an uninterrupted run; a finished run keeps what the report reads and no
checkpoint; a run folder the run root has is never overwritten."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file

from attnconv.cli import main
from attnconv.train.checkpoint import follow_latest
from tiny_runs import tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import experiments_archive as archive  # noqa: E402


def _weights(run: Path) -> dict:
    return load_file(follow_latest(run / "checkpoints") / "model.safetensors")


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
