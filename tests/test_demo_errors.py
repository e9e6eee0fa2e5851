"""`attnconv demo` refuses bad input in one line before any work: a non-finite ``--minutes``, a
model too large for the machine (before the speed probe allocates it), a ``num_classes`` that is
not the dataset's. Cheap: nothing here trains beyond one probe step on a few sample images."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from attnconv.cli import main
from attnconv.commands.demo import MODEL

LIMIT_AS = 6 << 30  # address space of the oversized-model subprocess (torch imports in ~3 GiB)


def _demo(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["demo", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("minutes", ["inf", "nan", "-inf", "1e308", "0", "-1"])
def test_minutes_must_be_finite_and_positive(minutes, tmp_path, capsys):
    # refused before any work: the missing dataset is never looked at
    argv = ["--data", str(tmp_path / "none.zip"), "--out", str(tmp_path / "d")]
    code, err = _demo([f"--minutes={minutes}", *argv], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"attnconv demo: error: --minutes must be a finite number > 0, got {float(minutes):g}"
    ]
    assert not (tmp_path / "d").exists()


def test_num_classes_that_is_not_the_datasets_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNCONV_CACHE", str(tmp_path / "cache"))
    argv = ["--data", "sample", "--out", str(tmp_path / "d"), "--set", "data.eval_max_per_class=2"]
    code, err = _demo([*argv, "--set", "model.kwargs.num_classes=5"], capsys)
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        "attnconv demo: error: model.kwargs.num_classes is 5, the dataset has 10 classes"
    ), err
    assert [ln for ln in err.splitlines() if "error" in ln] == [last]


def test_the_probe_takes_a_num_classes_that_matches(tmp_path, monkeypatch):
    """``model.kwargs.num_classes=10`` on 10-class data is allowed (it used to be passed twice)."""
    import torch

    from attnconv.commands.demo import _probe
    from attnconv.data import load_dataset
    from attnconv.train.config import config_from_dict

    monkeypatch.setenv("ATTNCONV_CACHE", str(tmp_path / "cache"))
    kwargs = {**MODEL, "num_classes": 10, "hidden_size": 18, "num_layers": 1}
    cfg = config_from_dict(
        {"model": {"kwargs": kwargs}, "data": {"dataset": "sample"}, "train": {"batch_size": 10}}
    )
    ds = load_dataset("sample", "test", max_per_class=2)
    threads = torch.get_num_threads()
    try:
        train_ips, eval_ips = _probe(cfg, ds, 1, probe_s=0.0, steps=0)
    finally:
        torch.set_num_threads(threads)
    assert train_ips > 0 and eval_ips > 0


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is Linux's")
def test_a_model_too_large_is_refused_like_train_before_it_is_allocated(tmp_path, capsys):
    """hidden_size=60000 declares ~130 GB of parameters: the demo refuses it with the trainer's
    line (models/budget.py, on the meta device). Run under a 6 GiB address-space limit, so that
    without the check the probe's allocation fails at once instead of filling the machine."""
    env = {
        **os.environ,
        "ATTNCONV_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    common = ["--set", "model.kwargs.hidden_size=60000", "--out", str(tmp_path / "d")]
    demo = ["demo", "--data", "sample", "--minutes", "0.1", *common]
    r = subprocess.run(
        [sys.executable, "-m", "attnconv.cli", *demo],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr  # refused before the data is read
    pattern = r"model 'sa_quadratic' declares more than [\d.]+ GiB of parameters"
    assert lines[0].startswith("attnconv demo: error: ") and re.search(pattern, lines[0])
    assert not (tmp_path / "d").exists()
    # the same line as `attnconv train` with the demo's model and the same override
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"kwargs": MODEL}, "train": {"batch_size": 50}}))
    capsys.readouterr()
    assert main(["train", str(cfg), *common]) == 2
    train_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert train_line.replace("attnconv train:", "attnconv demo:") == lines[0]
