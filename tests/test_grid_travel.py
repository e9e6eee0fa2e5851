"""analysis.grid.grid_travel: the mean distance heads must move to hold distinct offsets of a
k x k kernel, against a brute force over every assignment."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.analysis.grid import grid_travel


def brute_force(centers: torch.Tensor, k: int) -> float:
    r = k // 2
    offs = [(i, j) for i in range(-r, r + 1) for j in range(-r, r + 1)]
    best = min(
        sum(((c[0] - o[0]) ** 2 + (c[1] - o[1]) ** 2) ** 0.5 for c, o in zip(centers.tolist(), p))
        for p in itertools.permutations(offs, centers.shape[0])
    )
    return best / centers.shape[0]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), seed=st.integers(0, 2**16), scale=st.floats(0.1, 4.0))
def test_equals_the_best_of_every_assignment(n, seed, scale):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(n, 2, generator=g, dtype=torch.float64) * scale
    assert abs(grid_travel(centers) - brute_force(centers, 3)) < 1e-12


def test_a_convolution_layout_needs_no_travel_and_a_shifted_one_its_shift():
    offs = torch.tensor([[i, j] for i in (-1, 0, 1) for j in (-1, 0, 1)], dtype=torch.float32)
    perm = offs[torch.randperm(9, generator=torch.Generator().manual_seed(0))]
    assert grid_travel(perm) == 0.0
    assert abs(grid_travel(perm + torch.tensor([0.5, 0.0])) - 0.5) < 1e-6
    on_query = torch.zeros(9, 2)  # 4 offsets 1 away, 4 at sqrt(2), 1 at 0
    assert abs(grid_travel(on_query) - (4 * 1 + 4 * 2**0.5) / 9) < 1e-12


@pytest.mark.parametrize(
    "centers, k",
    [(torch.zeros(10, 2), 3), (torch.zeros(3, 2), 2), (torch.zeros(3), 3), (torch.zeros(3, 2), 5)],
)
def test_bad_sizes_are_one_line_errors(centers, k):
    with pytest.raises(ValueError, match="grid_travel|centers must be"):
        grid_travel(centers, k)
