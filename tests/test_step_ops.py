"""benchmarks/step_ops.py: the ops of one training step, counted on a CPU for the CPU's plan and
for a GPU's (each attention layer's CUDA kernel run on CPU tensors)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "step_ops.py"
sys.path.insert(0, str(SCRIPT.parent))
import step_ops  # noqa: E402


def test_gpu_plan_launches_fewer_ops_and_a_cnn_does_not_depend_on_the_plan():
    """sa_quadratic: the GPU's `shared` kernel launches fewer ops than the CPU's per-head loop
    (counted, deterministic, not timed); a CNN has no attention layer, so one count."""
    cpu, gpu = (step_ops.step_ops("sa_quadratic", 2, 0.0, g) for g in (False, True))
    assert 0 < gpu < cpu
    cnn = [step_ops.step_ops("tiny_cnn", 2, 0.0, g) for g in (False, True)]
    assert cnn[0] == cnn[1] > 0


@pytest.mark.slow  # about 30 s: a dispatch mode counts every op of six steps
def test_results_written_where_asked(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--models", "sa_learned", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| sa_learned |" in (tmp_path / "step_ops.md").read_text()


@pytest.mark.parametrize(
    "bad, msg",
    [
        (["--batch", "0"], "--batch 0: must be at least 1"),
        (["--models", "nope"], "--models: unknown nope"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, bad, msg):
    cmd = [sys.executable, str(SCRIPT), *bad, "--out", str(tmp_path / "x")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode != 0 and msg in r.stderr and not (tmp_path / "x").exists()
