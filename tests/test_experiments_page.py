"""The generated tables of docs/experiments.md equal what their scripts print from the committed
run folders (benchmarks/results/experiment_runs/, a run root as `report` restores it): the page's
tests (experiments_tests.py), the models' parameters and FLOPs (experiments_cost.py), Table 1 with
its order, the SASA table, the long budget and grid_long's two seeds side by side. A failure
means the page is stale: `python benchmarks/experiments.py report --runs <an empty folder>`
regenerates it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import experiments_cost as cost_  # noqa: E402
import experiments_grid as grid_  # noqa: E402
import experiments_tests as tests_  # noqa: E402
from experiments_stats import p_text  # noqa: E402

ARCHIVE = ROOT / "benchmarks" / "results" / "experiment_runs"
PAGE = ROOT / "docs" / "experiments.md"
STALE = "docs/experiments.md is stale: `python benchmarks/experiments.py report --runs DIR`"


def _on_page(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert text.strip(), "nothing generated"
    assert text in PAGE.read_text(), STALE


def test_the_tests_table_is_its_scripts():
    lines: list[str] = []
    tests_.tests_section(lines, ARCHIVE)
    _on_page(lines)


def test_table1_its_order_and_the_sasa_table_are_their_scripts(monkeypatch):
    import experiments_report as report_

    monkeypatch.setattr(report_, "RUNS", ARCHIVE)
    for section in (report_.table1, report_.sasa):
        lines: list[str] = []
        section(lines)
        _on_page(lines)
    assert "within one std" not in PAGE.read_text()  # the page's one rule, no other


def test_the_long_budget_table_is_its_scripts():
    from experiments_long import long_budget

    lines: list[str] = []
    long_budget(lines, ARCHIVE)
    _on_page(lines)


def test_grid_longs_two_seeds_side_by_side_are_their_scripts():
    from attnconv.analysis.evolution import head_evolution

    lines: list[str] = []
    seeds = [
        head_evolution(ARCHIVE / r / "centers.jsonl") for r in ("grid_long", "grid_long_seed1")
    ]
    grid_.both_seeds(lines, *seeds)
    _on_page(lines)


@pytest.mark.slow
def test_the_cost_table_is_its_scripts():
    lines: list[str] = []
    cost_.cost_section(lines, ARCHIVE)
    _on_page(lines)


def test_held_since_is_the_first_step_of_the_final_run_of_values():
    evo = [
        {"step": s, "layers": [{"grid3": g, "sharp_heads": 0}]}
        for s, g in ((0, 0), (10, 2), (20, 1), (30, 2), (40, 2))
    ]
    assert grid_.held_since(evo) == [30] and grid_.held_since(evo, "sharp_heads") == [0]


def test_runs_cell_folds_seeds_into_their_seed_0_run_only():
    names = ["sasa_k7", "sasa_k7_seed1", "sasa_k7_seed2", "sasa_k9", "t_warmup_seed1"]
    assert cost_.runs_cell(names) == "`sasa_k7` (3 seeds), `sasa_k9`, `t_warmup_seed1`"


def test_p_is_never_printed_as_zero():
    assert p_text(0.0582) == "0.058" and p_text(2.2e-4) == "2.2e-04"


def _run(root: Path, name: str, seed: int, acc: float, rate: float, machine: str | None = None):
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"model:\n  name: tiny_cnn\n  kwargs: {{}}\ntrain:\n  seed: {seed}\n"
    )
    (run / "wall.json").write_text(json.dumps({"train_seconds": 1.0}))
    (run / "metrics.csv").write_text(
        "kind,epoch,step,lr,loss,acc,images_per_s,seconds\n"
        f"train,1,10,0.1,1.0,0.5,{rate},1\neval,1,10,0.1,1.0,{acc},0,1\n"
    )
    if machine:
        (run / "machines.jsonl").write_text(json.dumps({"step": 0, "name": machine}) + "\n")


def test_a_comparison_states_seeds_machines_and_gpu_rows(tmp_path):
    for k, acc in enumerate((0.50, 0.52, 0.51)):
        _run(tmp_path, "sasa_k7" + (f"_seed{k}" if k else ""), k, acc, 40.0)
    _run(tmp_path, "sasa_k3", 0, 0.45, 40.0, machine="Intel(R) Xeon(R) Processor")
    _run(tmp_path, "sasa_k3_seed1", 1, 0.44, 2000.0)
    a, b = tests_.seeds_of(tmp_path, "sasa_k7"), tests_.seeds_of(tmp_path, "sasa_k3")
    assert [p.name for p in a] == ["sasa_k7", "sasa_k7_seed1", "sasa_k7_seed2"]
    assert tests_.varied(a, b) == (
        "seeds 0-2; sasa_k3 logged Intel Xeon Processor; sasa_k3_seed1 1 GPU rows; "
        "no machine log (4 of 5 runs)"
    )
    lines: list[str] = []
    tests_.tests_section(lines, tmp_path)
    text = "\n".join(lines)
    assert lines[0] == tests_.TITLE
    assert (
        "| SASA, 1,000 steps | k=7 - k=3 | " in text
        and "| 3 and 2 | 51.00 - 44.50 = +6.50 |" in text
    )
    assert "k=5" not in text  # its runs are not here: no row
