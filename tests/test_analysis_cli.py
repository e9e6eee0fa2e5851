"""`attnconv analyze` / `attnconv explore` on tiny real checkpoints and real CIFAR-10 test images:
every figure the model has the parts for is written, and its numbers match direct computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import attnconv
from attnconv.analysis.centers import head_centers, read_center_log, write_center_log_line
from attnconv.analysis.distance import mean_attention_distance
from attnconv.analysis.explorer import normalize
from attnconv.analysis.inputs import test_images as load_test_images
from attnconv.analysis.report import analyze_model
from attnconv.cli import main
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.train.checkpoint import save_checkpoint

VIT_KW = dict(num_classes=10, depth=2, embed_dim=32, num_heads=4)
DATA = {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26], "image_size": [32, 32]}


def png_ok(path):
    with Image.open(path) as im:
        assert im.format == "PNG" and min(im.size) > 100
        a = np.asarray(im.convert("RGB"))
    assert a.std() > 5  # not a blank canvas


@pytest.fixture
def vit_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = attnconv.create_model("vit_tiny_cifar", **VIT_KW)
    return save_checkpoint(
        tmp_path / "vit", model, "vit_tiny_cifar", VIT_KW, extra={"data": DATA}
    ), model


def test_analyze_vit_checkpoint(vit_checkpoint, cifar_zip, tmp_path, capsys):
    ck, model = vit_checkpoint
    out = tmp_path / "figs"
    argv = ["analyze", str(ck), "--data", str(cifar_zip), "--out", str(out), "--num-images", "12"]
    assert main(argv + ["--query", "5", "30", "--image", "3"]) == 0
    assert "figures" in capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    expect = {
        "attention_single", "attention_average", "attention_single_zoom",
        "attention_average_zoom", "mass_contours", "mean_distance", "conv_likeness",
        "position_similarity", "patch_pcs",
    }  # fmt: skip
    assert set(rep["figures"]) == expect  # no centres: a ViT has no quadratic layers
    index = (out / "index.md").read_text()
    for name in rep["figures"].values():
        png_ok(out / name)
        assert f"({name})" in index and name in (out / "index.html").read_text()
    assert rep["query_token"] == [1, 7] and rep["attention_grid"] == [8, 8]
    # the numbers behind the figures: recompute on the same images with the loaded weights
    images, _ = load_test_images(str(cifar_zip), 12)
    x = normalize(images, DATA["mean"], DATA["std"])
    with torch.no_grad():
        _, attns = model.eval()(x, return_attention=True)
    for li, a in enumerate(attns):
        d = mean_attention_distance(a, (8, 8), num_prefix_tokens=1, pixels_per_token=(4, 4))
        assert rep["mean_distance_px"][li] == pytest.approx(d.tolist(), rel=1e-4)
    var = rep["patch_pc_variance"]
    assert len(var) == 28 and var == sorted(var, reverse=True) and 0 < sum(var) <= 1 + 1e-6


def test_explore_vit_checkpoint(vit_checkpoint, cifar_zip, tmp_path, capsys):
    ck, _ = vit_checkpoint
    page = tmp_path / "page.html"
    argv = ["explore", str(ck), "--data", str(cifar_zip), "--out", str(page)]
    assert main(argv + ["--images", "2", "--average", "10"]) == 0
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and "src=" not in html
    data = json.loads(html.split('id="explorer-data">')[1].split("</script>")[0])
    assert len(data["images"]) == 2 and data["num_average"] == 10
    assert [L["grid"] for L in data["layers"]] == [[8, 8], [8, 8]]


class TinySA(nn.Module):
    """Two quadratic-encoding layers on a 2x2 space-to-depth grid (Cordonnier sec. 4, tiny)."""

    num_prefix_tokens = 0

    def __init__(self, dim: int = 18, heads: int = 9):
        super().__init__()
        self.embed = nn.Conv2d(12, dim, 1)
        self.layers = nn.ModuleList(
            MultiHeadSelfAttention2d(dim, dim, heads, positional="quadratic", content=False)
            for _ in range(2)
        )
        self.head = nn.Linear(dim, 10)
        self.attention_grid = (16, 16)

    def forward(self, x, return_attention=False):
        x = self.embed(F.pixel_unshuffle(x, 2))  # (B, dim, 16, 16)
        attns = []
        for layer in self.layers:
            x, a = layer(x, return_attention=True)
            attns.append(a)  # (1, Nh, 256, 256): position-only, shared by the batch
        y = self.head(x.mean((2, 3)))
        return (y, attns) if return_attention else y


def test_quadratic_model_centres_contours_and_trajectories(cifar_zip, tmp_path):
    torch.manual_seed(0)
    model = TinySA()
    log = tmp_path / "centers.jsonl"
    for epoch in range(4):  # centres spreading out, as in training (fig. 3)
        with torch.no_grad():
            for layer in model.layers:
                layer.positional_encoding.centers.mul_(1.2)
        write_center_log_line(log, epoch, head_centers(model))
    images, labels = load_test_images(str(cifar_zip), 6)
    rep = analyze_model(
        model, images, tmp_path / "sa", mean=DATA["mean"], std=DATA["std"], labels=labels,
        center_log=log, zoom=None,
    )  # fmt: skip
    figs = rep["figures"]
    assert {"mass_contours", "center_trajectories", "center_trajectories_gif"} <= set(figs)
    assert "position_similarity" not in figs and "patch_pcs" not in figs
    for name in figs.values():
        if name.endswith(".png"):
            png_ok(tmp_path / "sa" / name)
    with Image.open(tmp_path / "sa" / figs["center_trajectories_gif"]) as gif:
        assert gif.format == "GIF" and gif.n_frames == 4
    now = [layer.attention_centers().tolist() for layer in model.layers]
    assert np.allclose(rep["centers"], now)
    _, traj = read_center_log(log)
    assert np.allclose(traj[0][-1], now[0]) and np.allclose(traj[1][-1], now[1])
    # position-only attention: the same for every image, so the modal offsets are stable
    assert all(s == 1.0 for layer in rep["conv_likeness"] for s in layer["stability"])


def test_cli_errors_are_one_line(tmp_path, cifar_zip, capsys):
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "missing checkpoint" in capsys.readouterr().err
    cnn = attnconv.create_model("tiny_cnn")
    ck = save_checkpoint(tmp_path / "cnn", cnn, "tiny_cnn", {"num_classes": 10})
    argv = ["analyze", str(ck), "--data", str(cifar_zip), "--out", str(tmp_path / "o")]
    assert main(argv + ["--num-images", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing to analyze" in err and "\n" not in err
    assert main(argv + ["--num-images", "2", "--query", "40", "0"]) == 2
    assert "outside the 32x32 image" in capsys.readouterr().err
    assert main(["explore", str(ck), "--out", str(tmp_path / "p.txt")]) == 2
    assert ".html" in capsys.readouterr().err
