"""The grid experiment's sections of the experiments page (benchmarks/experiments_grid.py and
experiments_sensitivity.py): the kept sections of absent runs, the heads' table, the pull table,
the power law of the travel left and its interpolation at a summed learning rate."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import experiments_grid as grid  # noqa: E402
import experiments_runs as runs_  # noqa: E402
import experiments_sensitivity as sens  # noqa: E402


def test_power_fit_recovers_a_power_law_and_leaves_out_the_first_steps():
    def layers(d):  # two layers whose mean displacement is d
        return [{"displacement": d - 0.1}, {"displacement": d + 0.1}]

    pts = [(0.0, layers(0.1)), (5.0, layers(9.0))]  # left out: S < 10
    pts += [(s, layers(0.02 * s**0.7)) for s in (10.0, 40.0, 160.0, 640.0)]
    a, b, lo, hi = sens.power_fit(pts)
    assert abs(a - 0.02) < 1e-9 and abs(b - 0.7) < 1e-9 and (lo, hi) == (10.0, 640.0)
    assert sens.power_fit(pts[:4]) is None  # fewer than 3 points to fit


def test_grid_sections_whose_runs_are_absent_are_kept_and_said_so(tmp_path, monkeypatch):
    """A run root without grid_sa_quadratic / grid_long (a new machine) keeps their last
    regenerated sections, each with one note, instead of dropping them."""
    old = [
        grid.GRID_TITLE,
        "",
        "| step | 20000 |",
        "",
        grid.LONG_TITLE,
        "",
        "| step | 10500 |",
        "",
        sens.SENSITIVITY_TITLE,
        "",
        "| grid5k_base |",
        "",
        "### SASA",
        "",
    ]
    results = tmp_path / "experiments.md"
    results.write_text("\n".join(old))
    monkeypatch.setattr(runs_, "RESULTS", results)
    lines: list[str] = []
    grid.grid_formation(lines, tmp_path / "runs")
    text = "\n".join(lines)
    assert text.count(runs_.KEPT) == 2 and "| step | 20000 |" in text and "| step | 10500 |" in text
    assert sens.SENSITIVITY_TITLE not in text  # no sensitivity run here: nothing to show
    results.write_text(text)  # regenerated again from the kept report: still one note each
    lines = []
    grid.grid_formation(lines, tmp_path / "runs")
    assert "\n".join(lines).count(runs_.KEPT) == 2


def test_grid_heads_table_says_how_far_each_sharp_head_travelled(tmp_path, monkeypatch):
    """The per-layer table of where the heads sit: a sharp head's offset, top-key share and the
    distance its centre travelled from step 0; the other heads' mean |Delta| then and now."""
    import json

    monkeypatch.setattr(grid, "FIGS", tmp_path / "figs")
    start = {"layers": [[[-1.5, 0.2], [1.0, 1.0]]], "alpha": [[0.5, 0.5]]}
    end = {"layers": [[[-1.0, 0.0], [3.0, 4.0]]], "alpha": [[20.0, 0.01]]}
    log = tmp_path / "centers.jsonl"
    log.write_text(
        "\n".join(
            json.dumps({"epoch": e, "step": s, **r}) for e, s, r in ((0, 0, start), (1, 500, end))
        )
        + "\n"
    )
    lines: list[str] = []
    grid.grid_heads(lines, log, "t")
    row = next(ln for ln in lines if ln.startswith("| 1 |"))
    assert "(-1, 0) 1.00 (0.54)" in row  # sqrt(0.5^2 + 0.2^2) = 0.54 tokens travelled
    assert row.endswith("| 1.41 -> 5.00 |")  # the broad head moved out, from sqrt 2 to 5
    figures = [i for i, ln in enumerate(lines) if ln.startswith("![")]
    assert len(figures) == 2 and all(lines[i + 2].startswith("*") for i in figures)
    assert "to step 500 (arrowhead)" in lines[figures[0] + 2]  # the log's last step
    assert (tmp_path / "figs" / "t_center_trajectories.png").is_file()


def test_grid_pull_table_reads_the_milestones_measured(tmp_path):
    """grid_long's pull table: one row per grid_width_checkpoint_*.json of a grid_long
    milestone, in step order; '-' where a layer's drift is within twice its error; layer 4's
    resolved heads counted by the sign of their radial cosine."""
    import json

    def result(step, drifts):
        layers = [
            {"drift": d, "drift_error": 1.0, "resolved": d > 2.0, "summed_lr_per_token": 10.0 / d}
            for d in drifts
        ]
        heads = [
            {"resolved": True, "radial": -0.9},
            {"resolved": True, "radial": 0.5},
            {"resolved": False, "radial": -0.1},
        ]
        return {
            "model": f"grid_long/checkpoints/step-{step:08d} (hidden 64)",
            "layers": layers,
            "heads": {"layer": 4, "rows": heads},
        }

    for step in (20000, 5000):
        (tmp_path / f"grid_width_checkpoint_{step}.json").write_text(
            json.dumps({"results": [result(step, [4.0, 1.0])]})
        )
    (tmp_path / "grid_width.json").write_text(
        json.dumps({"results": [{"model": "sa_quadratic (hidden 64)", "layers": [], "heads": {}}]})
    )  # not a milestone
    lines: list[str] = []
    grid.grid_pull(lines, lambda step: step / 10, pulls=tmp_path)
    rows = [ln for ln in lines if ln[:3] == "| 5" or ln[:3] == "| 2"]
    assert rows == [
        "| 5000 | 500 | 4.0, 1.0 | 2, - | 1 / 1 / 1 |",
        "| 20000 | 2000 | 4.0, 1.0 | 2, - | 1 / 1 / 1 |",
    ]
    lines = []
    grid.grid_pull(lines, lambda step: 0.0, pulls=tmp_path / "none")
    assert lines == []  # no milestone measured: no table


def test_displacement_at_interpolates_a_run_at_a_summed_learning_rate():
    def layers(d):
        return [{"displacement": d - 0.1}, {"displacement": d + 0.1}]

    pts = [(0.0, layers(0.0)), (100.0, layers(1.0)), (300.0, layers(2.0))]
    assert sens.displacement_at(pts, 50.0) == 0.5 and sens.displacement_at(pts, 200.0) == 1.5
    assert sens.displacement_at(pts, 300.0) == 2.0 and sens.displacement_at(pts, 301.0) is None


def _run(root, name, accs, model="tiny_cnn"):
    import json

    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"model:\n  name: {model}\n  kwargs: {{}}\n")
    (run / "wall.json").write_text(json.dumps({"train_seconds": 60.0}))
    rows = ["kind,epoch,step,lr,loss,acc,images_per_s,seconds"]
    for step in range(250, 1001, 250):
        rows.append(f"train,1,{step},0.1,1.0,{0.5 + step / 4000},500,{step / 10}")
    rows += [f"eval,1,{s},0.1,1.0,{a},0,0" for s, a in accs.items()]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_long_budget_puts_the_two_runs_side_by_side(tmp_path, monkeypatch):
    import experiments_long as long

    monkeypatch.setattr(runs_, "RESULTS", tmp_path / "none.md")
    lines = []
    long.long_budget(lines, tmp_path)
    assert lines == []  # neither run here, nothing regenerated before: nothing to show
    _run(tmp_path, "grid_long", {500: 0.6, 1000: 0.8})
    _run(tmp_path, "resnet18_long", {500: 0.7, 1000: 0.75})
    long.long_budget(lines, tmp_path)
    text = "\n".join(lines)
    assert lines[0] == long.TITLE
    assert "| 500 | 0.03M | 50 | 60.0% | 70.0% |" in text
    assert "| 1,000 | 0.06M | 100 | 80.0% | 75.0% |" in text
    # the last 750 steps' train windows (500, 750, 1000 -> 0.625, 0.6875, 0.75, weighted)
    assert "| 80.00% | 68.8% | 500 | none |" in text and "| 75.00% | 68.8% | 500 | none |" in text
    assert "seed 1" not in text  # not run yet: not shown
    _run(tmp_path, "resnet18_long_seed1", {500: 0.65, 1000: 0.77})
    lines = []
    long.long_budget(lines, tmp_path)
    text = "\n".join(lines)
    assert "| 1,000 | 0.06M | 100 | 80.0% | 75.0% | 77.0% |" in text
    assert "| ResNet18 seed 1 | " in text and "|---|---|---|---|---|---|" in text
    assert "ResNet18's two seeds end 2.00 points apart (75.00% and 77.00%)" in text
    assert "over the 2 pairs of seeds: -5.00 to -3.00 points." in text
    assert "single run on a side (n = 2 and 1), no test" in text
    assert "Seed 0 each, and seed 1 of ResNet18," in text
    _run(tmp_path, "grid_long_seed1", {500: 0.62, 1000: 0.78})  # sa_quadratic's second seed
    lines = []
    long.long_budget(lines, tmp_path)
    text = "\n".join(lines)
    assert "| 1,000 | 0.06M | 100 | 80.0% | 75.0% | 77.0% | 78.0% |" in text
    assert "Seed 0 each, and seed 1 of ResNet18 and sa_quadratic," in text
    assert "sa_quadratic's two seeds end 2.00 points apart (80.00% and 78.00%)" in text
    assert "over the 4 pairs of seeds: -5.00 to -1.00 points." in text
    assert "Welch t = " in text and "(n = 2 and 2)" in text
