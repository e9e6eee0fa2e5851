"""Weights are checked the same way by every command that loads them (issue 79): non-finite
weights refused in one line by eval, analyze, explore, convert and attnconv.load_model (before
any figure is drawn of them), and float64 / float16 checkpoints run, cast to float32 and said in
one line (they stopped on a dtype message)."""

from __future__ import annotations

import pytest
import torch

import attnconv
from attnconv.cli import main
from attnconv.loading import CheckpointError, load_model
from attnconv.loading.weights_check import as_float32
from attnconv.train.checkpoint import save_checkpoint

VIT = dict(num_classes=10, depth=1, embed_dim=16, num_heads=2)
DATA = {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26], "image_size": [32, 32]}


def _vit(tmp_path, name: str, dtype=torch.float32, nan: bool = False):
    torch.manual_seed(0)
    model = attnconv.create_model("vit_tiny_cifar", **VIT)
    if nan:
        with torch.no_grad():
            model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
    return save_checkpoint(
        tmp_path / name, model.to(dtype), "vit_tiny_cifar", VIT, extra={"data": DATA}
    )


def _commands(ck, tmp_path) -> dict[str, list[str]]:
    return {
        "eval": ["eval", str(ck), "--data", "sample", "--max-per-class", "1"],
        "analyze": ["analyze", str(ck), "--data", "sample", "--num-images", "2"]
        + ["--out", str(tmp_path / "figs")],
        "explore": ["explore", str(ck), "--data", "sample", "--images", "1", "--num-images", "1"]
        + ["--out", str(tmp_path / "page.html")],
        "convert": ["convert", str(ck), "--data", "sample", "--max-per-class", "1"],
    }


@pytest.mark.parametrize("command", ["eval", "analyze", "explore", "convert"])
def test_non_finite_weights_are_refused_by_every_command(tmp_path, capsys, command):
    ck = _vit(tmp_path, "nan", nan=True)
    assert main(_commands(ck, tmp_path)[command]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "non-finite weights (blocks.0.attn.q_proj.weight)" in err[-1]
    assert [ln for ln in err if "error" in ln or "Traceback" in ln] == [err[-1]]  # one line
    assert not (tmp_path / "figs").exists() and not (tmp_path / "page.html").exists()


def test_load_model_refuses_them_too(tmp_path):
    ck = _vit(tmp_path, "nan", nan=True)
    with pytest.raises(CheckpointError, match=r"non-finite weights \(blocks.0.attn.q_proj"):
        load_model(ck)
    model, _ = load_model(_vit(tmp_path, "f64", torch.float64))  # the library keeps its dtype
    assert next(model.parameters()).dtype == torch.float64


@pytest.mark.parametrize(
    "command, dtype",
    [(c, d) for c in ("eval", "convert") for d in (torch.float64, torch.float16)]
    + [("analyze", torch.float64)],  # its figures: the longest (explore loads as analyze does)
)
def test_float64_and_float16_checkpoints_run_cast_to_float32(tmp_path, capfd, command, dtype):
    ck = _vit(tmp_path, "ck", dtype)
    assert main(_commands(ck, tmp_path)[command]) == 0
    said = capfd.readouterr()
    name = str(dtype).removeprefix("torch.")
    lines = [ln for ln in (said.out + said.err).splitlines() if "run cast to float32" in ln]
    assert len(lines) == 1 and f"weights stored as {name}" in lines[0]


def test_as_float32_says_nothing_for_float32():
    model = attnconv.create_model("tiny_cnn", width=4)
    assert as_float32(model, "x") == (model, "")
    model, line = as_float32(model.double(), "x")
    assert line == "x: weights stored as float64, run cast to float32"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
