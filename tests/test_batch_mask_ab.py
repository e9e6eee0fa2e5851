"""benchmarks/batch_mask_ab.py (its measurements: docs/benchmarks.md): both ways of applying a
batch-shared dropout mask are timed on the same shapes and agree to float32 roundoff."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import batch_mask_ab  # noqa: E402


def test_times_both_paths_and_they_agree(capsys):
    batch_mask_ab.main(["--rounds", "1", "--p", "0.3", "--cases", "2x4x3x5", "1x3x1x7"])
    out = capsys.readouterr().out.splitlines()
    rows = [line.split("|")[1:-1] for line in out if line.startswith("| ") and "ms" not in line]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("2", "4x4"), ("1", "3x3")]
    for *_, dense_ms, sparse_ms, ratio, rel in rows:
        assert float(dense_ms) >= 0 and float(sparse_ms) >= 0 and float(ratio) > 0
        assert float(rel) < 1e-5  # float32 roundoff of the two summation orders
