"""`attnconv bench --suite models`: runs end to end at --quick sizes and writes its files (no
timing asserted); its CPU scale is the experiment's; the README block is replaced in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnconv.bench import models as bench_models
from attnconv.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_bench_models_quick_writes_json_and_table(tmp_path):
    argv = ["bench", "--suite", "models", "--quick", "--out-dir", str(tmp_path)]
    assert main(argv + ["--", "--only", "sa_quadratic"]) == 0
    data = json.loads((tmp_path / "models_throughput.json").read_text())
    rows = data["rows"]
    assert len(rows) == 6  # (dropout 0, batch mask, sample mask) x (fp32, bf16)
    assert all(r["img_s"] > 0 and r["gflop_img"] > 0 and r["gflops_s"] > 0 for r in rows)
    by = {(r["p_drop"], r["mask"], r["bf16"]): r for r in rows}
    # dropout leaves the separable path: the dense shared path executes more FLOPs
    assert by[(0.1, "batch", False)]["gflop_img"] > by[(0.0, None, False)]["gflop_img"]
    assert by[(0.0, None, True)]["x_no_dropout"] == 1.0
    assert by[(0.1, "sample", True)]["bf16_speedup"] > 0
    assert data["peak_gflops"]["quick"]["fp32"] > 0 and data["peak_gflops"]["quick"]["bf16"] > 0
    assert [t["required"] for t in data["targets"]] == [">= 0.8", ">= 0.8"]
    md = (tmp_path / "models_throughput.md").read_text()
    assert "| scale | model |" in md and "attnconv bench --suite models --quick" in md


def test_cpu_scale_is_the_experiments_geometry():
    exp = ROOT / "configs" / "experiments"
    sa = yaml.safe_load((exp / "_sa_small.yaml").read_text())["model"]["kwargs"]
    sa.pop("attn_dropout")  # the benchmark sets it per case
    assert sa == bench_models.CPU_SA
    res = yaml.safe_load((exp / "table1_resnet18.yaml").read_text())["model"]["kwargs"]
    assert res == bench_models.CPU_RESNET


def test_readme_block_is_replaced_in_place(tmp_path):
    path = tmp_path / "README.md"
    b, e = bench_models.BEGIN, bench_models.END
    path.write_text(f"intro\n{b}\nold table\n{e}\nrest\n")
    bench_models.replace_readme_block("new table", path)
    assert path.read_text() == f"intro\n{b}\nnew table\n{e}\nrest\n"
    path.write_text("no markers\n")
    with pytest.raises(ValueError, match="README.md has no .* block"):
        bench_models.replace_readme_block("x", path)
    assert path.read_text() == "no markers\n"  # nothing lost


def test_report_rerenders_saved_results_or_says_what_is_missing(tmp_path, capsys):
    argv = ["bench", "--suite", "models", "--out-dir", str(tmp_path), "--", "--report"]
    assert main(argv) == 2
    assert "no results to re-render" in capsys.readouterr().err
    rows = [dict(scale="cpu", model="resnet18_cifar", batch=2, p_drop=0.0, mask=None, bf16=b,
                 img_s=10.0 + b, gflop_img=0.2, gflops_s=2.0) for b in (False, True)]  # fmt: skip
    bench_models.derive(rows, {"fp32": 10.0, "bf16": 20.0})
    payload = dict(command="attnconv bench --suite models", threads=1, repeats=3, torch="x",
                   machine="m", peak_gflops={"cpu": {"fp32": 10.0, "bf16": 20.0}}, targets=[],
                   rows=rows)  # fmt: skip
    (tmp_path / "models_throughput.json").write_text(json.dumps(payload))
    assert main(argv) == 0
    md = (tmp_path / "models_throughput.md").read_text()
    assert "| cpu | resnet18_cifar | 2 | bf16 | 0 | 11 | 1.00 | 1.10 |" in md
