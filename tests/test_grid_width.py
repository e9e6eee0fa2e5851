"""benchmarks/grid_width.py: the centres' drift (the mean gradient, its noise share removed)
and what it says about the summed learning rate a centre needs to travel one token."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import grid_width  # noqa: E402


def test_drift_removes_the_noise_share_of_the_mean():
    g = torch.Generator().manual_seed(0)
    n, true = 4000, torch.tensor([3e-3, -4e-3])  # ||E g|| = 5e-3 for every head
    grads = true + 0.05 * torch.randn(n, 2, 9, 2, generator=g, dtype=torch.float64)
    rows = grid_width.layer_stats(grads)
    for r in rows:
        assert abs(r["drift"] - 5e-3) < 0.2 * 5e-3  # the noise floor 0.05 sqrt(2/n) = 1.1e-3
        assert abs(r["noise"] - 0.05 * 2**0.5) < 0.01 and r["resolved"]
        assert abs(r["summed_lr_per_token"] - (1 - 0.9) / r["drift"]) < 1e-9


def test_pure_noise_has_no_drift():
    g = torch.Generator().manual_seed(1)
    grads = 0.05 * torch.randn(64, 3, 9, 2, generator=g, dtype=torch.float64)
    for r in grid_width.layer_stats(grads):
        assert r["drift"] < r["drift_error"] and not r["resolved"]


def test_head_stats_direction_radial_and_towards_the_grid():
    """A head at (1.3, 0) pulled outward along +row: descent (1, 0), radial +1, away from its
    nearest offset (1, 0) (to grid -1); one pulled in along -row: radial -1, to grid +1; pure
    noise: not resolved."""
    g = torch.Generator().manual_seed(2)
    n = 2000
    mean = torch.tensor([[-1e-2, 0.0], [1e-2, 0.0], [0.0, 0.0]], dtype=torch.float64)
    grads = mean + 1e-2 * torch.randn(n, 3, 2, generator=g, dtype=torch.float64)
    centres = torch.tensor([[1.3, 0.0], [1.3, 0.0], [0.0, 2.0]])
    rows = grid_width.head_stats(grads, centres, torch.tensor([1.0, 2.0, 3.0]))
    out, inward, noise = rows
    assert out["resolved"] and inward["resolved"] and not noise["resolved"]
    assert abs(out["descent"][0] - 1) < 0.01 and abs(out["radial"] - 1) < 0.01
    assert abs(out["to_grid"] + 1) < 0.01
    assert abs(inward["radial"] + 1) < 0.01 and abs(inward["to_grid"] - 1) < 0.01
    assert noise["to_grid"] == 0.0  # on an integer offset: no way to the grid
    assert out["alpha"] == 1.0 and out["centre"] == [1.3, 0.0]
    lines = grid_width.head_lines("m", 4, rows)
    assert lines[-1].endswith("| - | - | - |") and "| +1.00 | -1.00 |" in lines[4]


def test_heads_figure_is_written(tmp_path):
    rows = grid_width.head_stats(
        torch.randn(8, 2, 2, dtype=torch.float64),
        torch.tensor([[1.0, 0.5], [0.0, 0.0]]),
        torch.tensor([0.5, 0.0]),
    )
    grid_width.heads_figure("m", 4, rows, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
