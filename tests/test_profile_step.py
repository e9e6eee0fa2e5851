"""benchmarks/profile_step.py's product tables (their measurements: docs/benchmarks.md): both
layouts of the fused and blocked kernels' gradient product are timed and compared on the same
shapes, one product or heads batched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import profile_step  # noqa: E402


@pytest.mark.parametrize("heads", ["1", "3"])
def test_layouts_times_both_layouts_of_each_shape(capsys, heads):
    profile_step.main(["--layouts", "32x8x4", "16x4x12", "--heads", heads])
    out = capsys.readouterr().out.splitlines()
    assert ("baddbmm_" in out[0]) == (heads != "1")
    rows = [
        line.split("|")[1:-1]
        for line in out
        if line.startswith("| 32x8x4") or line.startswith("| 16x4x12")
    ]
    assert [r[0].strip() for r in rows] == ["32x8x4", "16x4x12"]
    for _, row_us, col_us, ratio in rows:
        assert float(row_us) >= 0 and float(col_us) >= 0 and float(ratio) > 0
