"""Smoke test of `attnconv bench --suite convert --quick` (sizes tiny; no timing asserted)."""

from __future__ import annotations

import json
import math

import pytest

from attnconv.bench.common import RESULTS_DIR
from attnconv.cli import main


@pytest.mark.slow
def test_bench_convert_quick(tmp_path, capsys, monkeypatch):
    """Without --out-dir the results go under the current directory, never into the committed
    benchmarks/results/ (unchanged, byte for byte)."""
    committed = {p: p.read_bytes() for p in RESULTS_DIR.glob("convert*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--suite", "convert", "--quick"]) == 0
    assert {p: p.read_bytes() for p in RESULTS_DIR.glob("convert*") if p.is_file()} == committed
    tmp_path = tmp_path / "attnconv-bench"
    res = json.loads((tmp_path / "convert.json").read_text())
    assert (tmp_path / "convert_lemma2.png").stat().st_size > 1000
    assert "Lemma 2" in (tmp_path / "convert.md").read_text()
    speed = res["speed"]
    assert speed["max_abs_logit_diff"] < 1e-4 and speed["seconds"]["conv"] > 0
    for dt, floor in (("float32", 1e-6), ("float64", 1e-14)):
        rows = res["lemma2"][dt]["rows"]
        assert res["lemma2"][dt]["monotone_to_precision"]
        assert rows[0]["rel_err"] > 0.1 and math.isinf(rows[-1]["alpha"])
        assert rows[-2]["rel_err"] < floor and rows[-1]["rel_err"] < floor
    out = capsys.readouterr().out  # every ratio printed beside the times it divides
    assert "speed of resnet18_cifar" in out and "original" in out and "channels_last" in out
    assert "network table" in out and "x wall" in out and "x CPU" in out
