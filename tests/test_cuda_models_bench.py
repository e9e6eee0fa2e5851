"""The GPU suite's paper-model baselines, checked on the CPU where they can be: the "dense SDPA
+ bias" layer (what a user writes on a GPU, bench/cuda_models.py) computes the layer's function,
and every model gets the paths the suite times."""

from __future__ import annotations

import copy

import pytest
import torch

from attnconv.bench import cuda_models
from attnconv.layers.kernels import triton_axis
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d


@pytest.mark.parametrize(
    "positional, content", [("quadratic", False), ("relative_learned", True), ("quadratic", True)]
)
def test_dense_sdpa_layer_equals_the_layer(positional, content):
    torch.manual_seed(0)
    lay = (
        MultiHeadSelfAttention2d(
            12, 12, num_heads=3, positional=positional, content=content, backend="reference"
        )
        .double()
        .eval()
    )
    dense = cuda_models.dense_sdpa_forward(copy.deepcopy(lay))
    x = torch.randn(2, 12, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(dense(x), lay(x), rtol=1e-12, atol=1e-12)
    xt = x.permute(2, 3, 0, 1)  # the paper models' (H, W, B, C) tokens reach it too
    torch.testing.assert_close(
        dense.forward_tokens(xt), lay.forward_tokens(xt), rtol=1e-12, atol=1e-12
    )


def test_every_model_is_timed_against_the_reference_and_the_dense_model():
    for model in cuda_models.SA_MODELS:
        for scale in ("paper", "quick"):
            names = [name for name, _, _ in cuda_models.variants(model, scale)]
            assert names[0] == "reference" and names[-1] == "dense bf16"
            # the Triton row where the kernel takes the content heads: hidden_size wide, 400 at
            # the paper's configuration, 16 at the quick one
            assert ("attnconv bf16 triton" in names) == (
                model == "sa_learned_content" and triton_axis.INSTALLED
            )


@pytest.mark.skipif(not triton_axis.INSTALLED, reason="needs triton")
def test_the_paper_content_heads_are_within_what_the_triton_kernel_takes():
    """The paper-scale Triton row times the kernel, not the dense fallback: the built model's
    heads (400 wide, over FlashAttention's 256) are within its head widths."""
    from attnconv.bench.models import build

    net = build("sa_learned_content", "paper")
    widths = {m.head_dim for m in net.modules() if type(m).__name__ == "MultiHeadSelfAttention2d"}
    assert widths == {400}
    q = torch.zeros(1, 1, 16 * 16, 400)
    assert "head widths" not in (triton_axis.unsupported(q, q, 16, 16) or "")


def test_a_models_run_cut_short_keeps_its_models_so_far(tmp_path, monkeypatch):
    """The models group saves its rows after each model (cuda_models.partial.json, with the
    device), as the layer groups do, and gpu_goals reads them as a partial run."""
    import argparse
    import json

    from attnconv.bench import gpu_goals

    row = dict(model="sa_quadratic", path="attnconv fp32", img_s=10.0, x_ref=1.5)

    def cut_short(models, scale, batch, repeats, device, peaks, save):
        save([row])
        raise TimeoutError("the script's timeout")

    monkeypatch.setattr(cuda_models, "run", cut_short)
    monkeypatch.setattr(cuda_models, "gemm_peaks", lambda device: {"fp32": 1.0, "bf16": 1.0})
    args = argparse.Namespace(quick=True, device="cpu")
    with pytest.raises(TimeoutError):
        cuda_models.report(args, 1, tmp_path)
    saved = json.loads((tmp_path / "cuda_models.partial.json").read_text())
    assert saved["rows"] == [row] and "CPU dry run" in saved["device"]
    text = gpu_goals.report(tmp_path)
    assert "cuda_models: only the cases run before its time ran out" in text
    assert "| fp32: x the reference algorithm | sa_quadratic (attnconv fp32) | 1.50 |" in text
