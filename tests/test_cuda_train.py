"""The paper models trained, stopped, resumed and evaluated on a GPU by the commands a researcher
runs (`attnconv train --device cuda`, `--stop-at-step`, `--resume`, `attnconv eval`), on the
CIFAR-10 sample shipped in the package (a lent GPU machine has no copy of the data folder):
bf16 autocast, the paper's dropout, the learned positions and the content kernels on CUDA.
Needs CUDA (benchmarks/gpu_session.sh runs it); the same commands on the CPU are the training
tests'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from attnconv.cli import main
from attnconv.train.checkpoint import LATEST
from train_helpers import weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _config(tmp_path: Path, name: str, out: Path) -> str:
    kw = {"downsample": 4, "hidden_size": 16, "num_layers": 2, "num_heads": 4, "ff_size": 16}
    cfg = {
        "model": {"name": name, "kwargs": kw},
        "data": {"dataset": "sample", "max_per_class": 8, "eval_max_per_class": 2},
        "train": {
            "epochs": 2,
            "batch_size": 20,
            "bf16": True,
            "threads": 1,
            "progress": False,
            "checkpoint_every": 1,
        },
        "out_dir": str(out),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def train_stop_resume_eval(tmp_path: Path, name: str, device: str) -> dict:
    """Train ``name`` stopped after 3 steps and resumed to its end, once straight through; its
    weights both ways and the resumed run's `eval --json` result."""
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    cfg = _config(tmp_path, name, resumed)
    assert main(["train", cfg, "--device", device, "--stop-at-step", "3"]) == 0
    assert main(["train", cfg, "--device", device, "--resume"]) == 0
    assert main(["train", cfg, "--device", device, "--out", str(straight)]) == 0
    ckpt = resumed / "checkpoints" / (resumed / "checkpoints" / LATEST).read_text().strip()
    out = tmp_path / "eval.json"
    argv = ["eval", str(ckpt), "--data", "sample", "--max-per-class", "2", "--device", device]
    assert main([*argv, "--json", str(out)]) == 0
    return dict(
        resumed=weights(resumed), straight=weights(straight), eval=json.loads(out.read_text())
    )


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned", "sa_learned_content"])
def test_a_paper_model_trains_stops_resumes_and_evaluates_on_cuda(tmp_path, name):
    """The resumed run ends where the uninterrupted one does (within bf16 autocast's rounding:
    atomics in CUDA's backward kernels may add in another order), every weight finite, and the
    evaluation reads its checkpoint on the GPU."""
    got = train_stop_resume_eval(tmp_path, name, "cuda")
    assert got["resumed"].keys() == got["straight"].keys()
    for key, a in got["resumed"].items():
        b = got["straight"][key]
        assert torch.isfinite(a).all(), key
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3, msg=key)
    assert 0.0 <= got["eval"]["accuracy"] <= 1.0
