"""benchmarks/experiments.py: the run root lives outside the repository and `status` says what
is left of each experiment (the resumable budget of many sittings)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnconv.catalog import RECIPES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "experiments.py"
sys.path.insert(0, str(SCRIPT.parent))
import experiments_runs as runs_  # noqa: E402


def _module():
    spec = importlib.util.spec_from_file_location("experiments_runner", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_default_run_root_is_outside_the_repository(monkeypatch):
    monkeypatch.delenv("ATTNCONV_RUNS", raising=False)
    mod = _module()
    assert ROOT not in mod.RUNS.resolve().parents and mod.RUNS.resolve() != ROOT


def test_progress_reads_the_run_folder(tmp_path):
    mod = _module()
    cfg = mod.CONFIGS / "grid_sa_quadratic.yaml"
    n = runs_.total_steps(cfg)
    assert n == 20000
    out = tmp_path / "grid_sa_quadratic"
    assert mod.progress(cfg, out) == "not started"
    out.mkdir()
    rows = ["kind,step,images_per_s"] + [f"train,{s},128" for s in (50, 100, 150)]
    (out / "metrics.csv").write_text("\n".join(rows) + "\n")
    left_h = (n - 150) * 64 / 128 / 3600
    assert mod.progress(cfg, out) == (f"step 150 of {n} (1%), ~{left_h:.1f} h left at 128 img/s")
    (out / "wall.json").write_text('{"train_seconds": 1.0}')
    assert mod.progress(cfg, out) == "done"


def test_status_command_with_a_run_root(tmp_path):
    (tmp_path / "sasa_k3").mkdir()
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "status", "sasa_k3", "--runs", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.splitlines() == [
        f"run root: {tmp_path.resolve()}",
        f"{'sasa_k3':32s} not started",
    ]


def test_table1_seeds_and_their_spread():
    mod = _module()
    runs = ["table1_sa_quadratic", "table1_sa_quadratic_seed1", "table1_sa_quadratic_seed2"]
    assert mod.report_.seed_runs("sa_quadratic") == runs
    m, sd = runs_.mean_std([0.40, 0.42, 0.44])
    assert abs(m - 0.42) < 1e-12 and abs(sd - 0.02) < 1e-12
    assert runs_.mean_std([0.5]) == (0.5, 0.0)
    cell = mod.report_.seeds_cell  # one seed has no std; two 0.05 points apart are not +- 0.0
    assert cell([]) == "not run" and cell([0.3806]) == "38.1% (1 seed)"
    assert cell([0.4140, 0.4135]) == "41.4 +- 0.04% (2: 41.40, 41.35)"
    from attnconv.train.config import load_config

    for name in ("resnet18", "sa_quadratic", "sa_learned", "sa_learned_content"):
        base = load_config(mod.CONFIGS / f"table1_{name}.yaml")
        for k, run in enumerate(mod.report_.seed_runs(name)):
            cfg = load_config(mod.CONFIGS / f"{run}.yaml")
            assert cfg.train.seed == k and cfg.model == base.model  # only the seed differs


def test_a_folder_another_run_trains_is_skipped(tmp_path, monkeypatch):
    from attnconv.train.runfolder import RunLock

    mod = _module()
    monkeypatch.setattr(mod, "RUNS", tmp_path)
    lock = RunLock(tmp_path / "sasa_k3")  # a second `run` is training it
    try:
        import pytest

        with pytest.raises(SystemExit, match="another run is training it"):
            mod.run_one(mod.CONFIGS / "sasa_k3.yaml", tmp_path / "data.zip")
        assert not (tmp_path / "sasa_k3" / "metrics.csv").exists()
    finally:
        lock.release()


def test_summed_lr_counts_each_logged_rate_for_the_steps_since_the_last_log(tmp_path):
    rows = ["kind,step,lr", "train,50,0.01", "eval,50,", "train,100,0.1", "train,150,0.05"]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    lr_sum = runs_.summed_lr(tmp_path)
    assert lr_sum(0) == 0.0 and lr_sum(49) == 0.0
    assert abs(lr_sum(100) - (50 * 0.01 + 50 * 0.1)) < 1e-12
    assert abs(lr_sum(10_000) - (50 * 0.01 + 50 * 0.1 + 50 * 0.05)) < 1e-12


def test_planned_lr_sum_of_the_reference_recipe_is_its_per_epoch_staircase():
    import math

    steps, total = runs_.planned_lr_sum(RECIPES / "sa_quadratic.yaml")
    assert steps == 300 * 500  # 300 epochs of 50,000 images in batches of 100
    per_epoch = [0.1 * e / 15 for e in range(15)]  # epoch 0 at lr 0 (the reference's warm-up)
    per_epoch += [0.05 * (1 + math.cos(math.pi * (e - 15) / 285)) for e in range(15, 300)]
    assert abs(total - 500 * sum(per_epoch)) < 1e-6


def test_total_steps_count_an_epoch_as_the_trainer_does(tmp_path):
    """steps_per_epoch is capped at one pass (50,000 // batch, the last partial batch dropped),
    as the trainer's Loader caps it."""
    base = RECIPES / "experiments" / "_sa_small.yaml"
    cfg = tmp_path / "capped.yaml"
    cfg.write_text(f"base: {base}\ntrain:\n  epochs: 3\n  steps_per_epoch: 1000\n")
    assert runs_.total_steps(cfg) == 3 * 781
    cfg.write_text(f"base: {base}\ntrain:\n  epochs: 3\n  steps_per_epoch: 100\n")
    assert runs_.total_steps(cfg) == 300
    import torch

    from attnconv.data.datasets import ArrayDataset
    from attnconv.data.loader import Loader

    split = ArrayDataset(
        torch.zeros(50_000, 3, 1, 1, dtype=torch.uint8),  # CIFAR-10's 50,000
        torch.zeros(50_000, dtype=torch.int64),
        ["a"],
    )
    assert len(Loader(split, 64, shuffle=True, max_steps=1000)) == 781


def test_the_sasa_table_without_its_runs_is_kept_with_one_note(tmp_path, monkeypatch):
    mod = _module()
    title = "### SASA ablations at CPU scale (Ramachandran et al. 2019)"
    results = tmp_path / "experiments.md"
    results.write_text(f"{title}\n\n| k=3 | 43.0% |\n\n### Next\n")
    monkeypatch.setattr(runs_, "RESULTS", results)
    monkeypatch.setattr(mod.report_, "RUNS", tmp_path / "runs")
    lines: list[str] = []
    mod.report_.sasa(lines)
    text = "\n".join(lines)
    assert "| k=3 | 43.0% |" in text and "### Next" not in text and text.count(runs_.KEPT) == 1
    results.write_text(text)
    lines = []
    mod.report_.sasa(lines)
    assert "\n".join(lines) == text  # regenerating a kept table changes nothing


def test_every_figure_of_the_experiments_page_has_a_caption():
    """Each figure of docs/experiments.md is followed by its caption: an italic paragraph that
    says which run it shows (the report writes them: benchmarks/experiments_captions.py)."""
    lines = (ROOT / "docs" / "experiments.md").read_text().splitlines()
    figures = [i for i, ln in enumerate(lines) if ln.startswith("![")]
    assert len(figures) >= 10
    for i in figures:
        cap = lines[i + 2]
        assert lines[i + 1] == "" and cap.startswith("*") and cap.endswith("*"), lines[i]
        assert "`" in cap or "Conv2d" in cap, cap  # names its run (or the converted conv)


def test_threads_reach_the_trainer_and_zero_is_refused(tmp_path, monkeypatch):
    """`run --threads 2` trains with `--set train.threads=2` (a resume may change the threads);
    `--threads 0` is one line, before anything runs."""
    import pytest

    mod = _module()
    monkeypatch.setattr(mod, "RUNS", tmp_path)
    monkeypatch.setattr(mod.archive, "ARCHIVE", tmp_path / "no-archive")  # nothing restored
    seen = []

    def sh(cmd, log, every=None):
        seen.append([str(c) for c in cmd])
        raise SystemExit("stop")

    monkeypatch.setattr(mod, "sh", sh)
    with pytest.raises(SystemExit, match="stop"):
        mod.run_one(mod.CONFIGS / "sasa_k3.yaml", tmp_path / "data.zip", threads=2)
    assert seen[0][-2:] == ["--set", "train.threads=2"]  # a fresh folder: never --overwrite
    _assert_refused(tmp_path, "--threads")


def _assert_refused(tmp_path, flag: str) -> None:
    """`run sasa_k3 FLAG 0` is one line, before anything runs."""
    data = tmp_path / "data.zip"
    data.write_bytes(b"")
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "run",
            "sasa_k3",
            flag,
            "0",
            "--data",
            str(data),
            "--runs",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and f"{flag} 0: must be at least 1" in r.stderr
    assert not (tmp_path / "sasa_k3" / "metrics.csv").exists()


def _tiny_config(tmp_path: Path) -> Path:
    """An experiment config "tiny": tiny_cnn on 40 real images, 5 steps of batch 8, one epoch."""
    cfg = tmp_path / "tiny.yaml"
    model = {"name": "tiny_cnn", "kwargs": {"width": 8}}
    data = {"max_per_class": 4, "eval_max_per_class": 1, "cache_dir": str(tmp_path / "c")}
    train = {"epochs": 1, "batch_size": 8, "log_every": 1, "threads": 1, "progress": False}
    cfg.write_text(yaml.safe_dump({"model": model, "data": data, "train": train}))
    return cfg


@pytest.mark.slow
def test_procs_train_one_run_under_torchrun(tmp_path, monkeypatch):
    """`run --procs 2` trains the experiment as two processes under real torchrun (gloo on
    127.0.0.1), to its end, with the same number of steps; `--procs 0` is refused."""
    from conftest import CIFAR_ZIP

    mod = _module()
    monkeypatch.setattr(mod, "RUNS", tmp_path / "runs")
    mod.run_one(_tiny_config(tmp_path), CIFAR_ZIP, procs=2)
    out = tmp_path / "runs" / "tiny"
    log = (out / "experiment.log").read_text()
    assert "torch.distributed.run --nproc-per-node 2" in log and "x2 process(es)" in log
    assert (out / "wall.json").exists()
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000005"
    _assert_refused(tmp_path, "--procs")


def test_a_stopped_training_is_reported_as_stopped_a_failed_one_as_failed(tmp_path):
    """`sh` on a command that exits non-zero: the trainer's "stopped by SIG..." line (a stop that
    saved a resumable checkpoint, whatever the exit code: torchrun's agent exits 1) is what the
    runner reports; any other exit is a failure that names the log. Only this command's output
    counts: a stop logged by an earlier command is not this one's."""
    mod = _module()
    log = tmp_path / "experiment.log"
    log.write_text("stopped by SIGINT at step 3/9; resumable checkpoint: old\n")
    fail = [sys.executable, "-c", "import sys; print('boom'); sys.exit(2)"]
    with pytest.raises(SystemExit, match=r"command failed \(exit 2\), see .*experiment.log"):
        mod.sh(fail, log)
    line = "stopped by SIGINT at step 5/10; resumable checkpoint: ck/step-5 (continue with -r)"
    stop = [sys.executable, "-c", f"import sys; print({line!r}); sys.exit(1)"]
    with pytest.raises(SystemExit) as e:
        mod.sh(stop, log)
    assert str(e.value) == f"{line} (`run` resumes it)"


def test_a_second_runner_is_kept_out_before_it_decides_anything(tmp_path, monkeypatch):
    """Two `run`s started together: the second finds the first's flock (taken before either
    restores or looks at the folder, so no stale --overwrite), and skips; a killed runner's
    flock dies with it and the experiment is free again (tests/test_runner_concurrency.py
    starts many at once)."""
    mod = _module()
    monkeypatch.setattr(mod, "RUNS", tmp_path)
    monkeypatch.setattr(mod.archive, "ARCHIVE", tmp_path / "no-archive")
    folder = tmp_path / "sasa_k3"
    hold = (
        "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", hold, str(mod.runner_lock("sasa_k3"))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match="another run is training it"):
            mod.run_one(mod.CONFIGS / "sasa_k3.yaml", tmp_path / "data.zip")
        assert not folder.exists()  # nothing restored, made nor decided
    finally:
        p.kill()
        p.wait()
    calls = []
    monkeypatch.setattr(mod, "_run_one", lambda *a: calls.append(a))
    mod.run_one(mod.CONFIGS / "sasa_k3.yaml", tmp_path / "data.zip")
    assert len(calls) == 1


def test_scratch_run_roots_are_not_archived_while_training(tmp_path, monkeypatch):
    mod = _module()
    monkeypatch.setattr(sys, "argv", ["experiments.py", "status", "--runs", str(tmp_path)])
    mod.main()
    assert mod.RUNS == tmp_path.resolve() and mod.ARCHIVE_WHILE_TRAINING is False
    assert _module().ARCHIVE_WHILE_TRAINING is True  # the default root is archived


def test_a_runs_training_time_counts_every_sitting(tmp_path):
    """The trainer's clock restarts at every resume: the report sums the sittings (wall.json
    once kept only the last: grid_long's 4.0 h of 23.8)."""
    import experiments_report as report

    run = tmp_path / "r"
    run.mkdir()
    rows = [
        "kind,epoch,step,lr,loss,acc,images_per_s,seconds",
        "train,1,50,0.1,2.0,0.1,10.0,100.0",
        "train,1,100,0.1,2.0,0.1,10.0,200.0",
        "train,2,150,0.1,2.0,0.1,10.0,90.0",
        "eval,2,150,0.1,2.0,0.1,0.0,120.0",
    ]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    (run / "wall.json").write_text('{"train_seconds": 130.0}')
    assert report.train_seconds(run) == 320.0  # 200 + 120
    (run / "wall.json").write_text('{"train_seconds": 400.0}')
    assert report.train_seconds(run) == 400.0  # the runner's clock where it is larger


def test_a_finished_seed_run_is_analyzed_from_its_checkpoint_or_skipped_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """The Table 1 attention runs of every seed are analyzed (fig. 5-6 read over seeds): with
    its checkpoint the trained model and the step-0 control; a run that finished before seeds
    were analyzed (no checkpoint left) is one line naming what to delete, nothing called."""
    mod = _module()
    monkeypatch.setattr(mod, "RUNS", tmp_path)
    calls = []
    monkeypatch.setattr(mod, "sh", lambda cmd, log, every=None: calls.append(cmd))
    monkeypatch.setattr(mod, "save_init", lambda run: calls.append(["save_init", run]))
    out = tmp_path / "table1_sa_learned_seed1"
    out.mkdir()
    (out / "wall.json").write_text('{"train_seconds": 1.0}')
    cfg = mod.CONFIGS / "table1_sa_learned_seed1.yaml"
    mod.run_one(cfg, tmp_path / "data.zip")
    assert calls == [] and "skipped, no checkpoint" in capsys.readouterr().out
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "latest").write_text("step-00001000")
    mod.run_one(cfg, tmp_path / "data.zip")
    analyzed = [[str(c) for c in cmd] for cmd in calls if cmd[0] != "save_init"]
    assert [c[c.index("--out") + 1] for c in analyzed] == [
        str(out / "analysis"),
        str(out / "analysis_init"),
    ]


def test_a_run_is_archived_once_more_as_it_ends(tmp_path, monkeypatch):
    """`run` archives each experiment when it ends (the copies made while it trained stop a few
    minutes short of its last rows and its analysis); one another runner holds is not, and a
    scratch run root (--runs) never is."""
    import argparse

    mod = _module()
    monkeypatch.setattr(mod, "RUNS", tmp_path)
    monkeypatch.setattr(mod.archive, "restore", lambda runs, names: [])
    saved = []
    monkeypatch.setattr(mod.archive, "save", lambda runs, names: saved.append(names))

    def run_one(cfg, data, threads, procs, rerun=False):
        if cfg.stem == "sasa_k3":
            raise SystemExit("skipped: another run is training it")

    monkeypatch.setattr(mod, "run_one", run_one)
    data = tmp_path / "data.zip"
    data.write_bytes(b"")
    args = argparse.Namespace(data=data, threads=None, procs=1, names=["sasa_k3", "sasa_k7"])
    with pytest.raises(SystemExit, match="skipped: sasa_k3"):
        mod.run(args)
    assert saved == [["sasa_k7"]]
    monkeypatch.setattr(mod, "ARCHIVE_WHILE_TRAINING", False)
    with pytest.raises(SystemExit):
        mod.run(args)
    assert saved == [["sasa_k7"]]
