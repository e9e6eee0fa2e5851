"""`attnconv bench --suite models`: runs end to end at --quick sizes and writes its files (no
timing asserted); its CPU scale is the experiment's; the docs block is replaced in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnconv.bench import models as bench_models
from attnconv.bench import models_report
from attnconv.catalog import RECIPES
from attnconv.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_bench_models_quick_writes_json_and_table(tmp_path):
    argv = ["bench", "--suite", "models", "--quick", "--out-dir", str(tmp_path)]
    assert main(argv + ["--", "--only", "sa_quadratic"]) == 0
    data = json.loads((tmp_path / "models_throughput.json").read_text())
    rows = data["rows"]
    # the reference code's algorithm (float32) and attnconv in float32 and bf16 autocast
    assert [(r["impl"], r["precision"]) for r in rows] == [
        ("reference", "fp32"),
        ("attnconv", "fp32"),
        ("attnconv", "bf16"),
    ]
    assert all(r["img_s"] > 0 and r["gflop_img"] > 0 and r["gflops_s"] > 0 for r in rows)
    by = {(r["impl"], r["bf16"]): r for r in rows}
    assert by[("reference", False)]["x_reference"] == 1.0
    x = by[("attnconv", True)]
    assert x["x_reference"] == x["img_s"] / by[("reference", False)]["img_s"]
    assert data["peak_gflops"]["quick"]["fp32"] > 0 and data["peak_gflops"]["quick"]["bf16"] > 0
    assert [t["required"] for t in data["targets"]] == [">= 1.5", ">= 60", ">= 10", ">= 60"]
    md = (tmp_path / "models_throughput.md").read_text()
    assert "| scale | model |" in md and "attnconv bench --suite models --quick" in md


def test_several_batches_run_as_groups_each_against_its_own_reference(tmp_path):
    argv = ["bench", "--suite", "models", "--quick", "--repeats", "2", "--out-dir", str(tmp_path)]
    assert main(argv + ["--", "--only", "sa_quadratic", "--batch-cpu", "2", "3"]) == 0
    data = json.loads((tmp_path / "models_throughput.json").read_text())
    groups = [(r["group"], r["batch"], r["impl"], r["precision"]) for r in data["rows"]]
    assert groups == [
        (f"quick B{b}", b, impl, prec)
        for b in (2, 3)
        for impl, prec in (("reference", "fp32"), ("attnconv", "fp32"), ("attnconv", "bf16"))
    ]
    for b in (2, 3):  # each batch's ratios against the reference at that batch
        rows = [r for r in data["rows"] if r["batch"] == b]
        ref = next(r for r in rows if r["impl"] == "reference")
        assert all(r["x_reference"] == r["img_s"] / ref["img_s"] for r in rows)
    assert sorted(data["peak_gflops"]) == ["quick B2", "quick B3"]
    assert {t["target"].split(" sa_quadratic")[0] for t in data["targets"]} == {
        "quick B2",
        "quick B3",
    }
    assert data["command"].endswith("--only sa_quadratic --batch-cpu 2 3")


def test_reference_anchor_is_checked_equal_before_timing(monkeypatch):
    """A re-statement that computes another function is refused, not timed."""
    from attnconv.bench import reference_algo

    bench_models.make_step("sa_learned", "quick", 2, impl="reference")  # equal: builds
    monkeypatch.setattr(reference_algo, "gelu", lambda x: x)  # a different function
    with pytest.raises(ValueError, match="differs from the model"):
        bench_models.make_step("sa_learned", "quick", 2, impl="reference")


def test_cpu_scale_is_the_experiments_geometry():
    exp = RECIPES / "experiments"
    sa = yaml.safe_load((exp / "_sa_small.yaml").read_text())["model"]["kwargs"]
    sa.pop("attn_dropout")  # the benchmark sets it per case
    assert sa == bench_models.CPU_SA
    res = yaml.safe_load((exp / "table1_resnet18.yaml").read_text())["model"]["kwargs"]
    assert res == bench_models.CPU_RESNET


def test_docs_block_is_replaced_in_place(tmp_path):
    path = tmp_path / "benchmarks.md"
    b, e = models_report.BEGIN, models_report.END
    path.write_text(f"intro\n{b}\nold table\n{e}\nrest\n")
    models_report.replace_block("new table", path)
    assert path.read_text() == f"intro\n{b}\nnew table\n{e}\nrest\n"
    path.write_text("no markers\n")
    with pytest.raises(ValueError, match="benchmarks.md has no .* block"):
        models_report.replace_block("x", path)
    assert path.read_text() == "no markers\n"  # nothing lost


def test_report_rerenders_saved_results_or_says_what_is_missing(tmp_path, capsys):
    argv = ["bench", "--suite", "models", "--out-dir", str(tmp_path), "--", "--report"]
    assert main(argv) == 2
    assert "no results to re-render" in capsys.readouterr().err
    rows = [
        dict(
            scale="cpu",
            model="sa_quadratic",
            batch=2,
            impl=impl,
            bf16=b,
            img_s=10.0 + b,
            gflop_img=0.2,
            gflops_s=2.0,
            peak_mb=100.0 / (1 + (impl == "attnconv")),
        )
        for impl, b in (("reference", False), ("attnconv", False))
    ]
    bench_models.derive(rows, {"fp32": 10.0, "bf16": 20.0})
    payload = dict(
        command="attnconv bench --suite models",
        threads=1,
        repeats=3,
        torch="x",
        machine="m",
        peak_gflops={"cpu": {"fp32": 10.0, "bf16": 20.0}},
        targets=bench_models.targets(rows, "cpu"),
        rows=rows,
    )
    (tmp_path / "models_throughput.json").write_text(json.dumps(payload))
    assert main(argv) == 0
    md = (tmp_path / "models_throughput.md").read_text()
    assert "| cpu | sa_quadratic | 2 | attnconv | fp32 | 10 | 1.00 | 50 | 0.50 |" in md
    assert "| cpu sa_quadratic fp32: peak memory / reference | 0.50 | <= 0.5 | True |" in md
