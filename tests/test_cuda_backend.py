"""The GPU backend's pieces that run on any machine (issue 17): both score_mods of the quadratic
encoding (in-kernel Gaussian for inference, gathered row/column logits for training) give the
dense logits; zero-padding of narrow heads; the CUDA bench's report and its error without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.bench.cuda import render
from attnconv.layers.encodings import QuadraticEncoding
from attnconv.layers.kernels.content import score_mod
from attnconv.layers.kernels.flex import MIN_HEAD_DIM, flex_mod_attention

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.slow
@given(
    heads=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    dk=st.integers(1, 20),
    grad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_quadratic_score_mods_equal_dense_attention(heads, h, w, dk, grad, seed):
    """score_mod (grad=False: eq. 9 from pixel offsets; grad=True: gathered row/column
    logits) inside Flex == softmax(scale q k^T + dense logits) v, float64, eager on CPU; dk < 16
    exercises the zero padding compiled Flex needs."""
    torch.manual_seed(seed)
    enc = QuadraticEncoding(heads).double()
    with torch.no_grad():
        enc.centers.uniform_(-3, 3)
        enc.set_alpha(torch.rand(heads, dtype=torch.float64) * 3)
    t = h * w
    q, k, v = (torch.randn(2, heads, t, dk, dtype=torch.float64) for _ in range(3))
    scale = dk**-0.5
    with torch.no_grad():
        mod = score_mod(enc.term(h, w, content=True), q, in_kernel=not grad)
        y = flex_mod_attention(q, k, v, mod, scale)
        logits = q @ k.transpose(-2, -1) * scale + enc.dense_bias(q, k, h, w, torch.float64)
        ref = torch.softmax(logits, -1) @ v
    assert dk >= MIN_HEAD_DIM or y.shape[-1] == dk  # padded columns are dropped
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-11)


def test_cuda_report_renders_the_groups_it_ran():
    rows = [
        dict(
            group="local",
            name="SASA local k7 train fp32 B2 C16 8x8",
            attnconv_ms=1.0,
            ratio_unfold=2.0,
            err_attnconv=1e-7,
        )
    ]
    md = render(rows, "Command: `x`.")
    assert "## SASA local attention" in md and "## Content attention" not in md
    assert "| SASA local k7 train fp32 B2 C16 8x8 | 1.000 | - | 2.00 |" in md


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_cuda_bench_without_a_gpu_is_one_clear_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnconv.cli",
            "bench",
            "--suite",
            "cuda",
            "--out-dir",
            str(tmp_path),
            "--",
            "--quick",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith("no CUDA device (torch.cuda.is_available())")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_cpu_dry_run_needs_quick_and_says_so(tmp_path):
    """`--device cpu` is the suite's dry run: at full size it would run for hours on a CPU, so
    without --quick it stops in one line before anything is built or written."""
    from attnconv.bench import cuda

    with pytest.raises(SystemExit, match="--device cpu is a dry run; add --quick"):
        cuda.main(["--device", "cpu", "--out-dir", str(tmp_path), "--only", "content"])
    assert list(tmp_path.iterdir()) == []
