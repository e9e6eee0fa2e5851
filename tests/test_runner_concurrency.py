"""benchmarks/experiments.py `run` started many times at once on one run root (issue 79): the
experiment's runner lock is taken before anything is restored or decided, a run is restored
into a private temp folder and renamed into place whole, a run is finished only by a complete
wall.json, and a finished run is never trained again (only `--rerun NAME`, which writes no
archive). Each runner is a real process (forked, so that many start within milliseconds of
each other); training is replaced by a stand-in that records its command."""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

import attnconv.loading.checkpoint  # noqa: F401 - imported before the forks (the runner's)
import attnconv.train.runfolder  # noqa: F401
from attnconv.models import create_model
from attnconv.train.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "experiments.py"
sys.path.insert(0, str(SCRIPT.parent))
NAME = "tiny"
SKIPPED = "skipped: another run is training it"


def _module():
    spec = importlib.util.spec_from_file_location("experiments_concurrency", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _archived_run(store: Path, finished: bool) -> Path:
    """An archived run of tiny_cnn: finished (wall.json, final weights, analysis files that make
    the copy take a while) or not (a resume checkpoint)."""
    run = store / NAME
    torch.manual_seed(0)
    model = create_model("tiny_cnn", width=4)
    if finished:
        save_checkpoint(run / "final", model, "tiny_cnn", {"width": 4})
        (run / "wall.json").write_text(json.dumps({"train_seconds": 12.5}))
        for i in range(40):
            (run / "analysis").mkdir(parents=True, exist_ok=True)
            (run / "analysis" / f"fig{i}.png").write_bytes(os.urandom(20_000))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = {"step": 2, "epoch": 0, "total_steps": 4}
        save_checkpoint(
            run / "checkpoints" / "step-00000002",
            model,
            "tiny_cnn",
            {"width": 4},
            optimizer=opt,
            state=state,
            state_tensors={"rng.torch": torch.get_rng_state()},
        )
        (run / "checkpoints" / "latest").write_text("step-00000002\n")
    (run / "config.yaml").write_text(f"out_dir: ../runs/{NAME}\n")
    (run / "metrics.csv").write_text("kind,epoch,step\ntrain,1,2\n")
    return run


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """The runner module with its configs, archive and run root in tmp_path, and `sh` replaced
    by a stand-in that appends each command to calls.txt (a training "finishes" at once)."""
    mod = _module()
    configs, calls = tmp_path / "configs", tmp_path / "calls.txt"
    configs.mkdir()
    d = {"model": {"name": "tiny_cnn", "kwargs": {"width": 4}}, "data": {"dataset": "sample"}}
    d["train"] = {"epochs": 1, "batch_size": 10}
    (configs / f"{NAME}.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.setattr(mod, "CONFIGS", configs)
    monkeypatch.setattr(mod.archive, "ARCHIVE", tmp_path / "archive")
    monkeypatch.setattr(mod, "progress", lambda cfg, out: "")

    def sh(cmd, log, every=None):
        with open(calls, "a") as f:
            f.write(" ".join(map(str, cmd)) + "\n")
        return 0.0

    monkeypatch.setattr(mod, "sh", sh)
    return mod


def _start_together(mod, root: Path, n: int, out: Path, rerun: list[str] = ()) -> list[str]:
    """``n`` runner processes `run tiny` on ``root``, released together; each one's outcome."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n)
    out.mkdir(parents=True, exist_ok=True)
    data = root.parent / "data.zip"
    data.write_bytes(b"")
    args = argparse.Namespace(data=data, threads=None, procs=1, names=[NAME], rerun=list(rerun))

    def one(i: int) -> None:
        sys.stdout = open(out / f"{i}.log", "w")  # what this runner says
        mod.RUNS = root
        barrier.wait()
        try:
            mod.run(args)
            outcome = "ok"
        except SystemExit as e:
            outcome = f"exit: {e}"
        except BaseException as e:  # noqa: BLE001 - what the test looks for
            outcome = f"crash: {type(e).__name__}: {e}"
        sys.stdout.flush()
        (out / f"{i}.txt").write_text(outcome)
        os._exit(0)

    procs = [ctx.Process(target=one, args=(i,)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    outcomes = []
    for i in range(n):
        said = (out / f"{i}.log").read_text()
        outcome = (out / f"{i}.txt").read_text()
        assert outcome == "ok" or (
            outcome == f"exit: failed or skipped: {NAME}" and SKIPPED in said
        )
        outcomes.append(outcome)
    return outcomes


def _left_behind(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()} - {NAME, f".{NAME}.runner.lock"}


def _calls(tmp_path: Path) -> list[str]:
    f = tmp_path / "calls.txt"
    return f.read_text().splitlines() if f.exists() else []


def _finished_run_started_many_times(runner, tmp_path, starts: int, rounds: int) -> None:
    store = tmp_path / "archive"
    archived = _files(_archived_run(store, finished=True))
    for r in range(rounds):
        root = tmp_path / f"runs{r}"
        for phase in ("fresh", "existing"):
            _start_together(runner, root, starts, tmp_path / "out" / f"{r}{phase}")
            assert _calls(tmp_path) == []  # never trained again
            assert _left_behind(root) == set()  # no temp folder of a restore
            assert _files(root / NAME) == archived  # whole, as archived
    assert _files(store / NAME) == archived  # the archive untouched


def test_a_finished_run_started_many_times_at_once_is_never_trained(runner, tmp_path):
    _finished_run_started_many_times(runner, tmp_path, starts=8, rounds=2)


@pytest.mark.slow
def test_fifty_concurrent_starts_of_a_finished_run(runner, tmp_path):
    _finished_run_started_many_times(runner, tmp_path, starts=50, rounds=3)


@pytest.mark.parametrize("starts", [8, pytest.param(50, marks=pytest.mark.slow)])
def test_an_unfinished_run_started_many_times_at_once_trains_once(runner, tmp_path, starts):
    """Restored from the archive by one runner, resumed (never --overwrite) by one, finished by
    its complete wall.json: the runners started after it find it finished."""
    _archived_run(tmp_path / "archive", finished=False)
    root = tmp_path / "runs"
    outcomes = _start_together(runner, root, starts, tmp_path / "out" / "fresh")
    calls = _calls(tmp_path)
    assert len(calls) == 1 and calls[0].endswith("--resume"), calls
    assert "--overwrite" not in calls[0]
    assert "ok" in outcomes and _left_behind(root) == set()
    assert runner.finished(root / NAME)
    _start_together(runner, root, starts, tmp_path / "out" / "again")
    assert len(_calls(tmp_path)) == 1
    assert (tmp_path / "archive" / NAME / "wall.json").is_file()  # archived as it ended


def test_a_damaged_finish_is_refused_and_only_rerun_trains_it_again(runner, tmp_path, capsys):
    """A cut wall.json (or a run with final weights and none) is no finish, and no reason to
    train from step 0: one line; `--rerun NAME` does, with nothing of the old run left and the
    archive unwritten."""
    store = tmp_path / "archive"
    _archived_run(store, finished=True)
    archived = _files(store / NAME)
    root = tmp_path / "runs"
    root.mkdir()
    runner.RUNS = root
    runner.archive.restore(root, [NAME])
    (root / NAME / "wall.json").write_text('{"train_seco')  # cut by a kill or a copy
    assert not runner.finished(root / NAME)
    data = tmp_path / "data.zip"
    data.write_bytes(b"")
    args = argparse.Namespace(data=data, threads=None, procs=1, names=[NAME], rerun=[])
    with pytest.raises(SystemExit, match=f"failed or skipped: {NAME}"):
        runner.run(args)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "wall.json is damaged" in line and f"--rerun {NAME}" in line
    assert _calls(tmp_path) == []
    (root / NAME / "wall.json").unlink()
    with pytest.raises(SystemExit):
        runner.run(args)
    assert "no wall.json" in capsys.readouterr().out and _calls(tmp_path) == []

    (root / NAME / "eval.json").write_text("{}")
    runner.run(argparse.Namespace(**{**vars(args), "names": [], "rerun": [NAME]}))
    calls = _calls(tmp_path)
    assert len(calls) == 1 and "--resume" not in calls[0] and "--overwrite" not in calls[0]
    left = {p.name for p in (root / NAME).iterdir()}
    assert left <= {"experiment.log", ".lock", "wall.json", "wall_partial.json"}, left
    assert runner.finished(root / NAME)
    assert _files(store / NAME) == archived  # a rerun never writes the archive


def test_a_restore_that_fails_leaves_no_temp_folder(runner, tmp_path, monkeypatch):
    store = tmp_path / "archive"
    _archived_run(store, finished=True)
    root = tmp_path / "runs"

    def broken(src, dest, **kw):
        Path(dest).mkdir(parents=True)
        (Path(dest) / "half").write_text("x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner.archive.shutil, "copytree", broken)
    with pytest.raises(SystemExit, match=f"{NAME}: restoring it from .* failed .*No space"):
        runner.archive.restore(root, [NAME])
    assert list(root.iterdir()) == []


def test_what_a_killed_restore_left_is_removed_once_stale(runner, tmp_path):
    """A runner killed mid-copy leaves its private temp folder: the next restore of that run
    removes it once it is an hour old (a younger one may be another process's, at work)."""
    _archived_run(tmp_path / "archive", finished=True)
    root = tmp_path / "runs"
    old, young = root / f".{NAME}.restore.k1ll3d", root / f".{NAME}.restore.w0rk1n"
    for p in (old, young):
        (p / NAME).mkdir(parents=True)
    os.utime(old, (0, 0))
    assert runner.archive.restore(root, [NAME]) == [NAME]
    assert not old.exists() and young.exists()
    assert runner.archive.restore(root, [NAME]) == []  # there: left as it is
