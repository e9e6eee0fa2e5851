"""`attnconv demo` end to end (the README's main command), offline, on the embedded sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from attnconv.train.checkpoint import load_model


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
