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
