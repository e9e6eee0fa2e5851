"""`attnconv bench --suite compile` (issue 77, item 4) at tiny size: every case runs (training
step and inference of attnconv eager, attnconv compiled and the plain model compiled), the
ratios come from the interleaved medians, and the scales read what they say."""

from __future__ import annotations

import json

import pytest
import torch

from attnconv.bench import SUITES
from attnconv.bench import compile as suite


def test_the_scales_are_the_cpu_recipes_and_the_papers_batch_8():
    kw, batch = suite.scale_options("sa_quadratic", "cpu")
    assert kw == dict(downsample=4, hidden_size=64, num_layers=3, num_heads=9, ff_size=128)
    assert batch == 50
    assert suite.scale_options("sa_learned_content", "paper") == ({}, 8)


def test_quick_run_times_every_case_and_writes_the_ratios(tmp_path, capsys):
    """--quick, one model, torch.compile's aot_eager backend (no C++ compile): 6 cases, one
    summary row per mode, the ratios those of the medians."""
    assert "compile" in SUITES
    argv = ["--quick", "--models", "sa_learned", "--backend", "aot_eager", "--out", str(tmp_path)]
    assert suite.main(argv) == 0
    payload = json.loads((tmp_path / "compile_models.json").read_text())
    rows, summary = payload["rows"], payload["summary"]
    assert sorted((r["code"], r["mode"]) for r in rows) == sorted(
        (c, m) for c in suite.CODES for m in suite.MODES
    )
    assert all(r["median_s"] > 0 and len(r["times_s"]) == 1 for r in rows)
    assert [s["mode"] for s in summary] == ["train", "infer"]
    med = {(r["code"], r["mode"]): r["median_s"] for r in rows}
    s = summary[0]
    assert s["compiled_x_eager"] == pytest.approx(
        med[("attnconv", "train")] / med[("attnconv compiled", "train")]
    )
    assert s["x_plain"] == pytest.approx(
        med[("plain compiled", "train")] / med[("attnconv compiled", "train")]
    )
    assert payload["backend"] == "aot_eager" and "--backend aot_eager" in payload["command"]
    assert "compiled x eager" in (tmp_path / "compile_models.md").read_text()
    assert "wrote" in capsys.readouterr().out


def test_the_plain_case_runs_the_reference_backend():
    """The plain model is the same model on backend='reference' (what set_backend gives)."""
    torch._dynamo.reset()
    call = suite.make_case("sa_quadratic", "quick", "plain compiled", "infer", backend="eager")
    call()
    layers = [m for m in call.net.modules() if hasattr(m, "BACKENDS")]
    assert layers and all(m.backend == "reference" for m in layers)


def test_a_scale_runs_in_a_fresh_subprocess():
    rows = suite.run_scale_subprocess(suite.specs("quick", ["sa_quadratic"], "eager"), 1, 1)
    assert len(rows) == 6 and all(
        r["compile_s"] is None for r in rows if "compiled" not in r["code"]
    )
