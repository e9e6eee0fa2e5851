"""`attnconv analyze` / `attnconv explore` on tiny real checkpoints and real CIFAR-10 test images:
every figure the model has the parts for is written, and its numbers match direct computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import attnconv
from attnconv.analysis.centers import head_centers, read_center_log, write_center_log_line
from attnconv.analysis.distance import mean_attention_distance
from attnconv.analysis.explorer import normalize
from attnconv.analysis.inputs import test_images as load_test_images
from attnconv.cli import main
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


@pytest.mark.slow
def test_analyze_vit_checkpoint(vit_checkpoint, cifar_zip, tmp_path, capsys):
    ck, model = vit_checkpoint
    out = tmp_path / "figs"
    argv = ["analyze", str(ck), "--data", str(cifar_zip), "--out", str(out), "--num-images", "12"]
    assert main(argv + ["--query", "5", "30", "--image", "3"]) == 0
    assert "figures" in capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    expect = {
        "attention_single",
        "attention_average",
        "attention_single_zoom",
        "attention_average_zoom",
        "mass_contours",
        "mean_distance",
        "conv_likeness",
        "position_similarity",
        "patch_pcs",
    }
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


@pytest.mark.slow
def test_sa_quadratic_run_centres_contours_and_trajectories(cifar_zip, tmp_path, capsys):
    """A tiny quadratic-encoding model trained a few SGD steps per epoch on real images, its
    centres logged per epoch in the run folder, analyzed from its step checkpoint."""
    torch.manual_seed(0)
    kw = dict(num_classes=10, hidden_size=18, num_layers=2, num_heads=9, ff_size=16)
    model = attnconv.create_model("sa_quadratic", **kw)
    images, labels = load_test_images(str(cifar_zip), 20)
    x = normalize(images, DATA["mean"], DATA["std"])
    y = torch.tensor([sorted(set(labels)).index(c) for c in labels])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run = tmp_path / "run"
    run.mkdir()
    for epoch in range(3):
        write_center_log_line(run / "centers.jsonl", epoch, head_centers(model))
        for _ in range(2):
            loss = F.cross_entropy(model.train()(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    write_center_log_line(run / "centers.jsonl", 3, head_centers(model))
    ck = save_checkpoint(run / "checkpoints" / "step-6", model, "sa_quadratic", kw)
    out = tmp_path / "figs"
    argv = ["analyze", str(ck), "--data", str(cifar_zip), "--out", str(out)]
    assert main(argv + ["--num-images", "6", "--zoom", "0"]) == 0  # log found in the run folder
    rep = json.loads((out / "report.json").read_text())
    figs = rep["figures"]
    assert {"mass_contours", "center_trajectories", "center_trajectories_gif"} <= set(figs)
    assert "position_similarity" not in figs and "attention_single_zoom" not in figs
    # position-only attention is the same for every image: no single-image copy of the average
    assert rep["same_for_every_image"] and "attention_single" not in figs
    for name in figs.values():
        if name.endswith(".png"):
            png_ok(out / name)
    with Image.open(out / figs["center_trajectories_gif"]) as gif:
        assert gif.format == "GIF" and gif.n_frames == 4
    now = [c.tolist() for c in head_centers(model)]
    assert np.allclose(rep["centers"], now, atol=1e-6)
    epochs, traj = read_center_log(run / "centers.jsonl")
    assert epochs.tolist() == [0, 1, 2, 3] and np.allclose(traj[1][-1], now[1], atol=1e-6)
    assert not np.allclose(traj[0][0], traj[0][-1])  # training moved the centres
    # position-only attention: the same for every image, so the modal offsets are stable
    assert all(s == 1.0 for layer in rep["conv_likeness"] for s in layer["stability"])


def test_cli_errors_are_one_line(tmp_path, cifar_zip, capsys):
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "missing checkpoint" in capsys.readouterr().err
    cnn = attnconv.create_model("tiny_cnn")
    ck = save_checkpoint(tmp_path / "cnn", cnn, "tiny_cnn", {"num_classes": 10})
    argv = ["analyze", str(ck), "--data", str(cifar_zip), "--out", str(tmp_path / "o")]
    assert main(argv + ["--num-images", "2"]) == 2
    *status, err = capsys.readouterr().err.strip().splitlines()  # the error: one line, last
    assert "convert it first" in err and all(s.startswith("analyze: ") for s in status)
    assert main(["explore", str(ck), "--data", str(cifar_zip), "--out", str(tmp_path / "p.html")])
    assert "convert it first" in capsys.readouterr().err  # was "returned no attention maps"
    kw = {"hidden_size": 16, "num_layers": 1, "num_heads": 2}
    sa = attnconv.create_model("sa_learned_content", **kw)
    argv[1] = str(save_checkpoint(tmp_path / "sa", sa, "sa_learned_content", kw))
    assert main(argv + ["--num-images", "2", "--query", "40", "0"]) == 2
    assert "outside the 32x32 image" in capsys.readouterr().err
    assert main(["explore", str(ck), "--out", str(tmp_path / "p.txt")]) == 2
    assert ".html" in capsys.readouterr().err


@pytest.mark.slow
def test_analyze_and_explore_a_converted_cnn(tmp_path, cifar_zip, capsys):
    """A CNN converted by `attnconv convert --out` is analyzed like an attention model: its heads
    are hard, one-hot on the kernel's grid (conv-likeness 1, every 3x3 offset held)."""
    torch.manual_seed(0)
    cnn = attnconv.create_model("tiny_cnn")
    ck = save_checkpoint(
        tmp_path / "cnn", cnn, "tiny_cnn", {"num_classes": 10}, extra={"data": DATA}
    )
    conv = tmp_path / "converted"
    assert main(["convert", str(ck), "--num-images", "2", "--out", str(conv)]) == 0
    out = tmp_path / "an"
    argv = ["analyze", str(conv), "--data", str(cifar_zip), "--out", str(out)]
    assert main(argv + ["--num-images", "2"]) == 0
    rep = json.loads((out / "report.json").read_text())
    n3 = [g for g in rep["grid_score"] if len(g["offsets"]) == 9]
    assert n3 and all(g["sharp_heads"] == 9 and g["grid3"] == 9 for g in n3)
    assert all(c["score"] > 0.99 for c in rep["conv_likeness"])
    # rows, tables and the page name the converted modules, not "layer N"
    assert [L["name"] for L in rep["layers"]] == ["conv1", "conv2"]
    assert "| conv2 | 1.000 |" in rep["conv_likeness_table"]
    png_ok(out / "attention_average.png")
    page = tmp_path / "page.html"
    args = ["explore", str(conv), "--data", str(cifar_zip), "--out", str(page), "--images", "1"]
    assert main(args + ["--average", "2"]) == 0
    data = json.loads(page.read_text().split('id="explorer-data">')[1].split("</script>")[0])
    assert [L["name"] for L in data["layers"]] == ["conv1", "conv2"]


@pytest.mark.slow
def test_a_cnn_converted_from_a_model_name_is_analyzed_without_data(tmp_path):
    """`attnconv convert NAME --out DIR` records the data it checked the model on (the embedded
    sample), so `analyze DIR` needs no --data."""
    conv = tmp_path / "converted"
    assert main(["convert", "tiny_cnn", "--num-images", "2", "--out", str(conv)]) == 0
    out = tmp_path / "an"
    assert main(["analyze", str(conv), "--out", str(out), "--num-images", "2"]) == 0
    assert (out / "report.json").is_file()
