"""Reproduce the papers' experiments at CPU scale and regenerate their tables and figures.

    python benchmarks/experiments.py run [NAME ...]   # train every configs/experiments/*.yaml
    python benchmarks/experiments.py status [NAME ...]  # what is done, what is left
    python benchmarks/experiments.py report           # tables + figures from the run folders
    python benchmarks/experiments.py save             # the run folders into the repository
    python benchmarks/experiments.py ship [NAME ...]  # finished runs as the package's pretrained

Run folders live under a run root outside the repository: ``--runs DIR``, else the environment
variable ATTNCONV_RUNS, else ../attnconv-runs beside the checkout. `run` trains each experiment with
`attnconv train` into <runs>/<name>/, resuming every unfinished run from its last checkpoint (a
budget of many hours accrues across sittings: kill it at any time, run it again), skipping a
finished one (a complete wall.json, written last; never trained again but by `--rerun NAME`, which
writes no archive) or one that a second `run` beside it is training: its runner lock
(<runs>/.<name>.runner.lock) is taken before anything is restored or decided (start one `run` per
core, or give one run both: `--procs 2`, two processes of one thread under torchrun, 1.26x the
images/s of one process with `--threads 2` on grid_long), then the follow-ups: `attnconv analyze`
for the attention models, `attnconv convert` of the trained ResNet18 on the 10,000 test images, and
the Lemma 2 sweep. `report` reads only those folders: it writes benchmarks/results/experiments.md,
copies the figures to docs/figures/, and replaces the block between the experiments markers of
docs/experiments.md (its links are relative to that page). Nothing in the tables is typed by hand.
The run folders are kept in the repository too (experiments_archive.py): `save` (and `report`) copy
them to benchmarks/results/experiment_runs/ (an unfinished run with its last checkpoint), `run` does
for the run it trains, every few minutes and once more as it ends, and `run` and `report` restore
any the run root lacks, so a new machine resumes where the last one saved. On a machine with a CUDA
GPU `attnconv train` runs there (its default device), CIFAR kept on the GPU as uint8 with crop and
flip done there; a run started on one device resumes on the other (not bit for bit: the two round
differently).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the report's modules beside this file
import experiments_archive as archive  # noqa: E402
import experiments_report as report_  # noqa: E402
import experiments_ship as ship_  # noqa: E402
from experiments_runs import CONFIGS, ROOT, default_data, finished, progress  # noqa: E402

RUNS = Path(os.environ.get("ATTNCONV_RUNS") or ROOT.parent / "attnconv-runs")  # see --runs
ARCHIVE_WHILE_TRAINING = True  # False for a --runs root given on the command line (scratch runs
# must not replace the committed ones; `save` still archives on request)
CLI = [sys.executable, "-m", "attnconv.cli"]


def train_cli(procs: int) -> list:
    """The trainer's command: one process, or ``procs`` under torchrun (gloo on 127.0.0.1, the
    same global batch; each process its slice of it and its own threads)."""
    if procs == 1:
        return CLI
    from attnconv.train.distributed import torchrun_command  # torch: not for `status`

    return [*torchrun_command(procs), "-m", "attnconv.cli"]


def experiments(names: list[str]) -> list[Path]:
    cfgs = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("_"))
    if names:
        known = {p.stem: p for p in cfgs}
        missing = [n for n in names if n not in known]
        if missing:
            raise SystemExit(f"unknown experiments {missing}; known: {sorted(known)}")
        cfgs = [known[n] for n in names]
    return cfgs


SAVE_EVERY = 600.0  # seconds: a training run's folder is archived this often while it trains


def sh(cmd: list[str], log: Path, every=None) -> float:
    """Run a command, appending its output to ``log``; returns wall seconds; raises on failure.
    ``every``: called each SAVE_EVERY seconds while the command runs."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.flush()
        start = f.tell()  # this command's output begins here
        p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        while True:
            try:
                rc = p.wait(timeout=SAVE_EVERY)
                break
            except subprocess.TimeoutExpired:
                if every is not None:
                    every()
    if rc != 0:
        with open(log, errors="replace") as f:  # a signal's stop (the trainer saved): say so
            f.seek(start)
            stops = [ln.strip() for ln in f if "stopped by SIG" in ln]
        if stops:
            raise SystemExit(f"{stops[-1]} (`run` resumes it)")
        raise SystemExit(f"command failed (exit {rc}), see {log}: {' '.join(map(str, cmd))}")
    return time.time() - t0


def run(args: argparse.Namespace) -> None:
    data = Path(args.data)
    if not data.exists():
        raise SystemExit(f"--data {data}: no such file")
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"--threads {args.threads}: must be at least 1")
    if args.procs < 1:
        raise SystemExit(f"--procs {args.procs}: must be at least 1")
    rerun = list(getattr(args, "rerun", None) or [])
    cfgs = experiments(args.names) if args.names or not rerun else []
    cfgs += [c for c in (experiments(rerun) if rerun else []) if c not in cfgs]
    failed = []
    for cfg in cfgs:
        try:
            run_one(cfg, data, args.threads, args.procs, rerun=cfg.stem in rerun)
            if ARCHIVE_WHILE_TRAINING and not rerun:  # the finished run as it ends, and its
                with held(cfg.stem) as mine:  # follow-ups (a rerun: never archived); under
                    if mine:  # its lock (a runner that took it meanwhile saves it as it ends)
                        archive.save(RUNS, names=[cfg.stem])
        except SystemExit as e:  # one experiment's failure does not stop the queue
            print(f"[{time.strftime('%H:%M:%S')}] {cfg.stem}: {e}", flush=True)
            failed.append(cfg.stem)
    if failed:
        raise SystemExit(f"failed or skipped: {', '.join(failed)}")


def busy(out: Path) -> bool:
    """Another training (a second `run` beside this one) holds the run folder's lock."""
    from attnconv.train.runfolder import RunFolderBusy, RunLock

    try:
        RunLock(out).release()
    except RunFolderBusy:
        return True
    return False


def runner_lock(name: str) -> Path:
    """The experiment's runner lock: a file of the run root beside its run folder (taken before
    the folder is restored, made or read; a folder restored is renamed into place whole)."""
    return RUNS / f".{name}.runner.lock"


@contextlib.contextmanager
def held(name: str):
    """The experiment's runner lock, held for the block: yields True, or False (not held) when
    another runner holds it."""
    RUNS.mkdir(parents=True, exist_ok=True)
    with open(runner_lock(name), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def run_one(
    cfg: Path, data: Path, threads: int | None = None, procs: int = 1, rerun: bool = False
) -> None:
    """Restore one experiment from the archive if the run root lacks it, train it to its end
    (resuming it), then its follow-ups. Two `run`s side by side (one per core) share the queue:
    an experiment another `run` holds (its flock, taken before anything is restored or
    decided, released when that process ends however it ends) is skipped. ``threads``: the
    trainer's threads instead of the config's; ``procs``: processes under torchrun (a resume
    may change both); ``rerun``: train it again from step 0 even if it finished (the old run
    folder removed first; `run` then writes no archive)."""
    with held(cfg.stem) as mine:
        if not mine:
            raise SystemExit("skipped: another run is training it")
        if not rerun:
            for name in archive.restore(RUNS, [cfg.stem]):
                print(f"{name}: restored from {_shown(archive.ARCHIVE)}", flush=True)
        out = RUNS / cfg.stem
        out.mkdir(parents=True, exist_ok=True)
        _run_one(cfg, out, data, threads, procs, rerun)


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _write_json(path: Path, value: dict) -> None:
    """``path`` replaced whole (temp file + rename): never read back half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _seconds_before(partial: Path) -> float:
    try:
        return float(json.loads(partial.read_text())["train_seconds"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or cut by a kill
        return 0.0


def _start_again(out: Path) -> None:
    """--rerun: every file of the old run taken away (the trainer's own removal, under its
    lock), so that a rerun killed half-way is never taken for the finished run."""
    from attnconv.train.runfolder import RunFolderBusy, RunLock, remove_old_run

    try:
        lock = RunLock(out)
    except RunFolderBusy:
        raise SystemExit("skipped: another run is training it") from None
    try:
        remove_old_run(out)
    finally:
        lock.release()


def _run_one(
    cfg: Path, out: Path, data: Path, threads: int | None, procs: int, rerun: bool = False
) -> None:
    log = out / "experiment.log"
    if rerun:
        _start_again(out)
    done = finished(out)
    if not done and ((out / "wall.json").exists() or (out / archive.FINAL).is_dir()):
        what = "its wall.json is damaged" if (out / "wall.json").exists() else "no wall.json"
        raise SystemExit(
            f"{out} holds a finished run's final weights or record but {what}: not trained "
            f"again (`run --rerun {cfg.stem}` trains it from step 0)"
        )
    if not done and busy(out):
        raise SystemExit("skipped: another run is training it")
    if not done and cfg.stem.endswith("_bf16"):  # a bf16 run trained in float32
        import torch  # would be mislabelled: not on this CPU

        from attnconv.device import bf16_passed_over

        passed_over = bf16_passed_over(torch.device("cpu"))
        if passed_over:
            raise SystemExit(f"skipped: bf16 autocast is passed over on this CPU ({passed_over})")
    if not done:
        cmd = [*train_cli(procs), "train", cfg, "--out", out, "--set", f"data.dataset={data}"]
        if threads is not None:
            cmd += ["--set", f"train.threads={threads}"]
        # a run begun here (its config.yaml or a checkpoint) resumes: from its checkpoint, or
        # from step 0 when killed before its first (the trainer says so); never --overwrite
        begun = (out / "config.yaml").is_file() or (out / "checkpoints").is_dir()
        if begun:
            cmd.append("--resume")
        print(f"[{time.strftime('%H:%M:%S')}] train {cfg.stem}: {progress(cfg, out)}", flush=True)
        partial = out / "wall_partial.json"  # seconds of earlier sittings (their sh calls)
        before = _seconds_before(partial)
        t0 = time.time()
        try:
            keep = lambda: archive.save(RUNS, names=[cfg.stem])  # noqa: E731
            sh(cmd, log, every=keep if ARCHIVE_WHILE_TRAINING and not rerun else None)
        finally:  # a sitting's time counts even when it is interrupted
            total = before + time.time() - t0
            _write_json(partial, {"train_seconds": total})
        _write_json(out / "wall.json", {"train_seconds": total})  # the finish: written last
    analyzed = cfg.stem.startswith("table1_sa") and not cfg.stem.endswith("_bf16")
    if analyzed and not (out / "analysis" / "report.json").exists():
        if not (out / "checkpoints" / "latest").exists():  # finished before seeds were analyzed
            print(
                f"[{time.strftime('%H:%M:%S')}] analyze {cfg.stem}: skipped, no checkpoint "
                f"(`run --rerun {cfg.stem}` trains it again)",
                flush=True,
            )
            return
        print(f"[{time.strftime('%H:%M:%S')}] analyze {cfg.stem}", flush=True)
        sh([*CLI, "analyze", out, "--data", data, "--out", out / "analysis"], log)
    control = out / "analysis_init" / "report.json"
    if analyzed and not control.exists():
        print(f"[{time.strftime('%H:%M:%S')}] analyze {cfg.stem} at step 0", flush=True)
        save_init(out)  # the control: the same model before its first step
        sh([*CLI, "analyze", out / "init", "--data", data, "--out", out / "analysis_init"], log)
    if cfg.stem == "table1_resnet18" and not (out / "convert.json").exists():
        print(f"[{time.strftime('%H:%M:%S')}] convert {cfg.stem}", flush=True)
        sh([*CLI, "convert", out, "--data", data, "--json", out / "convert.json"], log)


def status(args: argparse.Namespace) -> None:
    print(f"run root: {RUNS}")
    for cfg in experiments(args.names):
        out = RUNS / cfg.stem
        if not out.exists() and (archive.ARCHIVE / cfg.stem).exists():
            out = archive.ARCHIVE / cfg.stem  # `run` restores it from there
        now = " (training now)" if (out / ".lock").is_file() and busy(out) else ""
        print(f"{cfg.stem:32s} {progress(cfg, out)}{now}")


def save_init(run: Path) -> None:
    """Save ``run``'s model as the trainer builds it before step 0 (same seed, same config) as
    the checkpoint ``run/init``."""
    import torch
    import yaml

    from attnconv.models import create_model
    from attnconv.train.checkpoint import save_checkpoint

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    kwargs = {"num_classes": 10, **cfg["model"]["kwargs"]}
    torch.manual_seed(cfg["train"]["seed"])
    model = create_model(cfg["model"]["name"], **kwargs)
    data = {"mean": cfg["data"]["mean"], "std": cfg["data"]["std"], "image_size": [32, 32]}
    save_checkpoint(run / "init", model, cfg["model"]["name"], kwargs, extra={"data": data})


def save(args: argparse.Namespace) -> None:
    if RUNS.is_dir():
        names = archive.save(RUNS)
        print(f"saved {len(names)} run folders to {archive.ARCHIVE.relative_to(ROOT)}")


def report(args: argparse.Namespace) -> None:
    save(args)
    archive.restore(RUNS)
    report_.report(RUNS)


def main() -> None:
    global RUNS, ARCHIVE_WHILE_TRAINING
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the experiments (all, or the NAMEs given)")
    r.add_argument("names", nargs="*")
    r.add_argument("--data", default=str(default_data()), help="CIFAR-10 zip/folder")
    r.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads per training (default: the config's, 1: one run per core)",
    )
    r.add_argument(
        "--procs",
        type=int,
        default=1,
        help="processes per training, under torchrun (2 x 1 thread: both cores on "
        "one run; the same global batch)",
    )
    r.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="NAME",
        help="train NAME again from step 0 even if it finished, its old run folder removed "
        "first (repeatable; only these run when no NAME is given; nothing is archived)",
    )
    r.set_defaults(fn=run)
    st = sub.add_parser("status", help="what is done and what is left, per experiment")
    st.add_argument("names", nargs="*")
    st.set_defaults(fn=status)
    sub.add_parser("report", help="regenerate tables and figures").set_defaults(fn=report)
    sub.add_parser("save", help="keep the run folders in the repository").set_defaults(fn=save)
    sh_ = sub.add_parser("ship", help="finished runs as pretrained weights with cards (package)")
    sh_.add_argument("names", nargs="*", help="names of benchmarks/pretrained_cards.yaml (all)")
    sh_.add_argument("--data", default=str(default_data()), help="the CIFAR-10 JPEG zip")
    sh_.set_defaults(fn=lambda a: ship_.ship(a.names, RUNS, Path(a.data)))
    for sp in sub.choices.values():
        sp.add_argument("--runs", default=None, help=f"run root (default: {RUNS})")
    args = p.parse_args()
    if args.runs:
        RUNS = Path(args.runs).resolve()
        ARCHIVE_WHILE_TRAINING = False
    args.fn(args)


if __name__ == "__main__":
    main()
