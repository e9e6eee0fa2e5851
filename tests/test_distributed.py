"""Real torchrun (2 processes, gloo on 127.0.0.1): same weights as one process with the same global
batch, and a distributed run stopped mid-epoch and resumed under torchrun still matches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnconv.train.checkpoint import LATEST
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Trainer
from torchrun_helpers import latest_weights as _weights
from torchrun_helpers import torchrun_train as _torchrun


def _rows(run: Path) -> list[list[float | str]]:
    """metrics.csv's rows without the timing columns: kind, epoch, step, lr, loss, acc."""
    rows = [r.split(",")[:6] for r in (run / "metrics.csv").read_text().splitlines()[1:]]
    return [[r[0], *map(float, r[1:])] for r in rows]


def _assert_same_rows(run: Path, single: Path) -> None:
    got, want = _rows(run), _rows(single)
    assert [r[:3] for r in got] == [r[:3] for r in want]
    for a, b in zip(got, want):
        assert a[3:] == pytest.approx(b[3:], rel=0, abs=2e-6), (a, b)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from conftest import CIFAR_ZIP

    tmp = tmp_path_factory.mktemp("dist")
    d = {
        # GroupNorm (per sample) and no dropout: the 1-process run is the exact reference
        "model": {"name": "tiny_cnn", "kwargs": {"width": 16, "norm": "group"}},
        "data": {
            "dataset": str(CIFAR_ZIP),
            "max_per_class": 16,
            "eval_max_per_class": 3,
            "cache_dir": str(tmp / "cache"),
        },
        "optim": {"name": "sgd", "lr": 0.05},
        "train": {
            "epochs": 2,
            "batch_size": 40,
            "log_every": 2,
            "checkpoint_every": 3,
            "threads": 1,
            "progress": False,
        },
    }
    cfg = tmp / "dist.yaml"
    cfg.write_text(yaml.safe_dump(d))
    threads = torch.get_num_threads()
    try:  # the single-process reference, global batch 40
        Trainer(config_from_dict({**d, "out_dir": str(tmp / "single")})).fit()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
    return cfg, tmp, _weights(tmp / "single")


@pytest.mark.slow
def test_torchrun_two_processes_match_one(setup):
    cfg, tmp, single = setup
    r = _torchrun(cfg, tmp / "ddp", cache=tmp / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    ddp = _weights(tmp / "ddp")
    for k in single:
        torch.testing.assert_close(ddp[k], single[k], rtol=0, atol=1e-5)
    # rank 0 alone wrote the logs: one metrics row per logged step
    _assert_same_rows(tmp / "ddp", tmp / "single")


@pytest.mark.slow
def test_torchrun_stop_mid_epoch_and_resume_match_one(setup):
    cfg, tmp, single = setup
    out = tmp / "ddp_resumed"
    r = _torchrun(cfg, out, "--stop-at-step", "5", cache=tmp / "cache")  # 4 steps an epoch
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "checkpoints" / LATEST).read_text().strip() == "step-00000005"
    r = _torchrun(cfg, out, "--resume", cache=tmp / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = _weights(out)
    for k in single:
        torch.testing.assert_close(resumed[k], single[k], rtol=0, atol=1e-5)
    # stopped mid log window (steps 5 of 4..6): the window's sums over both ranks were saved,
    # restored once (rank 0's alone, restored on every rank, counted it twice)
    _assert_same_rows(out, tmp / "single")


@pytest.mark.slow
def test_torchrun_batchnorm_logged_evaluation_is_the_saved_models(setup):
    """BatchNorm under torchrun: each rank normalizes its slice and updates its own running
    statistics; the sharded evaluation read each rank's (the logged loss was not the saved
    model's). Now every rank evaluates rank 0's, which the checkpoint holds."""
    cfg, tmp, _ = setup
    out = tmp / "ddp_bn"
    bn = ("--set", "model.kwargs={width: 16, norm: batch}", "--set", "train.epochs=1")
    r = _torchrun(cfg, out, *bn, cache=tmp / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    logged = [row for row in _rows(out) if row[0] == "eval"][-1][4]
    env = {**os.environ, "ATTNCONV_CACHE": str(tmp / "cache")}
    args = [
        sys.executable,
        "-m",
        "attnconv.cli",
        "-q",
        "eval",
        str(out),
        "--json",
        "--max-per-class",
        "3",
    ]
    ev = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert json.loads(ev.stdout)["loss"] == pytest.approx(logged, rel=0, abs=2e-6)


@pytest.mark.slow
def test_torchrun_takes_one_bf16_choice(setup):
    """train.bf16 under torchrun: the ranks agree on bf16 autocast (one all-reduce of whether
    any rank passes it over) and the run completes; rank 0's dtype line gives one of the
    verdicts device.bf16_passed_over can reach on this CPU. The gain is measured per rank on a
    shared machine, so it is not measured again here: ranks may differ near the threshold (CI
    once had rank 1 pass over what rank 0 and this process kept), and the all-reduce then says
    "another rank's CPU"."""
    from attnconv.device import _cpu_bf16_flags

    cfg, tmp, _ = setup
    r = _torchrun(cfg, tmp / "ddp_bf16", "--set", "train.bf16=true", cache=tmp / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stderr.splitlines() if x.startswith("  dtype"))
    if not _cpu_bf16_flags():  # no measurement: every rank passes over for the same reason
        assert "passed over: this CPU has no bf16 instructions" in line, line
        return
    verdicts = (
        "bfloat16 autocast (float32 weights)",
        "passed over: this CPU's bf16 matrix products measured",
        "passed over: passed over on another rank's CPU",
    )
    assert sum(v in line for v in verdicts) == 1, line


def test_a_worker_exits_with_its_code_and_flushed_streams_a_lone_process_returns():
    """``exit_worker``: a process that joined a process group ends at once with the command's
    code, its log and streams flushed (the interpreter's teardown aborted a gloo rank once in ~40
    runs); one that never joined returns to its caller."""
    from attnconv.train.distributed import exit_worker

    assert exit_worker(0) is None  # this process never joined a group
    code = (
        "import logging, sys\n"
        "import attnconv.train.distributed as d\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.INFO)\n"
        "d._joined = True\n"
        "print('saved', end='')\n"
        "logging.getLogger('t').info('logged')\n"
        "d.exit_worker(7)\n"
        "print('never')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (7, "saved") and "logged" in r.stderr, r


@pytest.mark.slow
def test_torchrun_launches_at_once_each_take_a_port_of_their_own(tmp_path):
    """The rendezvous store binds port 0 as it starts (torchrun_command), so launches at once
    (the full run's two test processes, the experiments runner beside them) never race for a
    port: four two-process launches together all run, each on its own port, none on a fixed one."""
    import torchrun_helpers

    script = tmp_path / "hello.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"  # the ranks meet (gloo's mesh may still be connecting at init)
        "assert t.item() == 2\n"
        "print('rank ran on port', os.environ['MASTER_PORT'])\n"
        "dist.destroy_process_group()\n"
    )
    cmd = torchrun_helpers.torchrun(str(script), procs=2)
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = [subprocess.Popen(cmd, **pipes) for _ in range(4)]
    ports = set()
    for p in runs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.count("rank ran") == 2, err[-1000:]
        ports |= {ln.split()[-1] for ln in out.splitlines() if "rank ran" in ln}
    assert len(ports) == 4, ports  # two ranks of a launch share its port; launches do not
