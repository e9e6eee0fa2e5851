"""`attnconv demo` end to end (the README's main command), offline, on the embedded sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from attnconv.train.checkpoint import load_model
from attnconv.train.config import config_from_dict
from attnconv.train.optim import lr_at


@pytest.mark.slow
def test_demo_writes_checkpoint_metrics_centres_and_figures(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "ATTNCONV_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "attnconv.cli",
        "demo",
        "--data",
        "sample",
        "--minutes",
        "0.2",
        "--out",
        str(out),
        "--set",
        "data.eval_max_per_class=5",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"run folder: {out.resolve()}" in r.stdout
    model, info = load_model(out)
    assert info["model"] == "sa_quadratic" and info["state"]["step"] >= 6
    rows = (out / "metrics.csv").read_text().splitlines()
    # what it achieved, in words (no raw dict); the schedule was sized to finish, and did
    assert "{" not in r.stdout and "Test accuracy:" in r.stdout and "The demo took" in r.stdout
    assert "followed its cosine schedule to the end" in r.stdout, r.stdout
    # what to expect of the heads: how far the centres moved, where the grid is shown
    assert "The Gaussian centres moved" in r.stdout and "thousands of steps" in r.stdout
    assert "measuring this machine's speed" in r.stderr and "planned" in r.stderr
    train_rows = [x.split(",") for x in rows if x.startswith("train,")]
    assert int(train_rows[-1][2]) == info["state"]["total_steps"] == info["state"]["step"]
    total = info["state"]["total_steps"]
    cfg = config_from_dict(info["config"])
    end = lr_at(total - 1, cfg.optim.lr, cfg.schedule, total, cfg.train.steps_per_epoch)
    assert float(train_rows[-1][3]) == pytest.approx(end, rel=1e-5) and end < 0.1 * cfg.optim.lr
    assert rows[0].startswith("kind,epoch,step") and any(x.startswith("eval,") for x in rows)
    assert len((out / "centers.jsonl").read_text().splitlines()) >= 7  # init + 6 short epochs
    assert (out / "figures" / "index.md").is_file()
    assert len(list((out / "figures").glob("*.png"))) >= 3
    # attnconv eval on the same 50 test images reproduces the run's last eval row
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnconv.cli",
            "eval",
            str(out),
            "--data",
            "sample",
            "--max-per-class",
            "5",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    last = [x.split(",") for x in rows if x.startswith("eval,")][-1]
    assert res["images"] == 50 and abs(res["accuracy"] - float(last[5])) < 1e-6
    assert abs(res["loss"] - float(last[4])) < 1e-5


@pytest.mark.slow
def test_demo_refuses_an_occupied_folder_and_overwrite_replaces_it(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "ATTNCONV_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "attnconv.cli",
        "demo",
        "--data",
        "sample",
        "--minutes",
        "0.1",
        "--out",
        str(out),
        "--no-figures",
        "--set",
        "data.eval_max_per_class=2",
    ]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    before = (out / "metrics.csv").read_text()
    t0 = time.perf_counter()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    last = again.stderr.strip().splitlines()[-1]
    assert again.returncode != 0 and "--overwrite" in last and "--resume" not in last
    assert time.perf_counter() - t0 < 30  # refused before any work (it took 20 s of it before)
    assert (out / "metrics.csv").read_text() == before  # refused: nothing touched
    (out / "checkpoints" / "step-99999999").mkdir()  # a checkpoint only the old run has
    over = subprocess.run(
        [*cmd, "--overwrite"], env=env, capture_output=True, text=True, timeout=600
    )
    assert over.returncode == 0, over.stderr[-2000:]
    assert not (out / "checkpoints" / "step-99999999").exists()
