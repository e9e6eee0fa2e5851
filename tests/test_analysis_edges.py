"""Edge cases of the analysis: converted convs' empty rows (queries whose tap is in the padding),
one-image and bf16 runs, converted ViTs, odd centre logs, an attnconv checkpoint given as
pretrained weights, and `eval` of a converted model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn

import attnconv
from attnconv.analysis.centers import read_center_log
from attnconv.analysis.converted import ConvertedAttentionView, layer_maps
from attnconv.analysis.convlike import conv_likeness
from attnconv.analysis.distance import mean_attention_distance
from attnconv.analysis.evolution import head_evolution
from attnconv.analysis.inputs import normalization, pretrained_normalization
from attnconv.analysis.inputs import test_images as load_test_images
from attnconv.analysis.measure import measure_model
from attnconv.analysis.report import render_report
from attnconv.cli import main
from attnconv.convert import conv_to_attention, convert_model
from attnconv.layers.attention_map import AttentionMap
from attnconv.loading import load_model
from attnconv.train.checkpoint import save_checkpoint

MEAN, STD = [0.5] * 3, [0.25] * 3
DATA = {"dataset": "sample", "image_size": [32, 32], "mean": MEAN, "std": STD}
R2 = math.sqrt(2.0)
KERNEL3 = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 0), (0, 1), (1, -1), (1, 0), (1, 1)]


def converted_3x3(grid):
    """The AttentionMap of a converted 3x3 conv (padding 1) on a grid x grid input: hard heads,
    the rows of border queries whose tap lies in the padding empty."""
    torch.manual_seed(0)
    ca = conv_to_attention(nn.Conv2d(3, 4, 3, padding=1))
    return AttentionMap(layer_maps(ca, grid, grid), (grid, grid))


@pytest.fixture(scope="module")
def images():
    return load_test_images("sample", 2)[0]  # the embedded sample, no download


# ---------------------------------------------------------------------------- empty rows


@pytest.mark.parametrize("grid", [32, 4])
def test_distance_of_a_converted_conv_skips_rows_in_the_padding(grid):
    """Bug 1: was 0.969 / 1.327 px on 32x32 (0.75 / 0.795 on 4x4): padding rows counted as 0."""
    d = mean_attention_distance(converted_3x3(grid), (grid, grid))
    want = [R2, 1.0, R2, 1.0, 0.0, 1.0, R2, 1.0, R2]
    assert d.tolist() == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("grid", [2, 8])
def test_convlike_of_a_converted_conv_ignores_empty_rows(grid):
    """Bug 2: on 2x2 empty rows voted key 0 (score 0.667, kernel 0); peaks were < 1 (0.94 on
    8x8) for exactly one-hot heads."""
    r = conv_likeness(converted_3x3(grid))
    assert r.offsets == KERNEL3 and r.kernel == 3 and r.distinct
    assert r.score == pytest.approx(1.0)
    assert r.peak == pytest.approx([1.0] * 9) and r.stability == pytest.approx([1.0] * 9)


@pytest.mark.parametrize("k, stride, pad", [(4, 4, 0), (3, 1, 0), (2, 2, 0), (5, 3, 2)])
def test_distance_and_convlike_of_strided_and_unpadded_convs_count_their_outputs_only(
    k, stride, pad
):
    """Queries a strided or unpadded conv never outputs read pixels clamped at the border (and
    between strides): a ViT's stride-4 patch embedding read 0.969 px for its distance-1 heads
    (1.388 for sqrt 2) on 32x32. The view's maps say which queries the conv outputs."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, k, stride=stride, padding=pad).double()
    view = ConvertedAttentionView(nn.Sequential(conv_to_attention(conv)), (32, 32))
    (m,) = view(torch.randn(1, 3, 32, 32, dtype=torch.float64), return_attention=True)[1]
    oh, ow = conv_to_attention(conv).geometry.output_size(32, 32)
    assert int(m.queries.sum()) == oh * ow
    offsets = [(i, j) for i in range(k) for j in range(k)]
    a = conv_to_attention(conv).geometry.anchor
    want = [math.hypot(i - a[0], j - a[1]) for i, j in offsets]
    assert mean_attention_distance(m, (32, 32)).tolist() == pytest.approx(want, abs=1e-5)
    r = conv_likeness(m)
    assert r.score == pytest.approx(1.0) and r.peak == pytest.approx([1.0] * k * k)
    assert sorted(r.offsets) == sorted((i - a[0], j - a[1]) for i, j in offsets)


def test_attention_map_queries_are_checked():
    with pytest.raises(ValueError, match="queries must be a \\(4,\\) bool tensor"):
        AttentionMap(torch.ones(1, 1, 4, 4) / 4, (2, 2), 0, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool tensor"):
        AttentionMap(torch.ones(1, 1, 4, 4) / 4, (2, 2), 0, torch.ones(4))


# ---------------------------------------------------------------------------- normalization


def test_model_flag_with_an_attnconv_checkpoint_uses_its_normalization(tmp_path):
    """Bug 6: `--model NAME --checkpoint <attnconv ckpt>` used ImageNet's mean/std."""
    torch.manual_seed(0)
    kw = {"hidden_size": 16, "num_layers": 2, "num_heads": 2}
    m = attnconv.create_model("sa_learned_content", **kw)
    ck = save_checkpoint(tmp_path / "ck", m, "sa_learned_content", kw, extra={"data": DATA})
    assert pretrained_normalization(ck) == (MEAN, STD)
    assert pretrained_normalization(ck) == normalization(load_model(ck)[1])
    assert pretrained_normalization(tmp_path / "nothing")[0] == [0.485, 0.456, 0.406]


# ---------------------------------------------------------------------------- same maps


def test_a_content_model_on_one_image_is_not_called_position_only(images, tmp_path):
    """Bug 5: with one image its map equals the average: reported same_for_every_image."""
    torch.manual_seed(0)
    m = attnconv.create_model("sa_learned_content", hidden_size=16, num_layers=2, num_heads=2)
    res = measure_model(m.eval(), images[:1], mean=MEAN, std=STD)
    assert not res.shared
    rep = render_report(res, tmp_path / "one")
    assert rep["same_for_every_image"] is False and "attention_single" in rep["figures"]
    quad = attnconv.create_model("sa_quadratic", hidden_size=16, num_layers=2).eval()
    assert measure_model(quad, images, mean=MEAN, std=STD).shared  # shared maps: position only


# ---------------------------------------------------------------------------- CLI, converted


@pytest.fixture(scope="module")
def converted_cnn(tmp_path_factory):
    """`attnconv convert tiny_cnn --out DIR`: random weights, checked on the embedded sample."""
    conv = tmp_path_factory.mktemp("conv") / "converted"
    torch.manual_seed(0)
    assert main(["convert", "tiny_cnn", "--num-images", "2", "--out", str(conv)]) == 0
    return conv


@pytest.mark.slow
def test_converted_cnn_with_a_corner_query_draws_the_whole_report(converted_cnn, tmp_path):
    """Bug 3: heads pointing into the padding aborted with "attention map has no mass"."""
    out = tmp_path / "an"
    argv = ["analyze", str(converted_cnn), "--out", str(out), "--num-images", "2"]
    assert main(argv + ["--query", "0", "0", "--device", "cpu"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert "mass_contours" in rep["figures"] and (out / "index.md").is_file()
    assert all((out / f).is_file() for f in rep["figures"].values())


@pytest.mark.slow
def test_eval_of_a_converted_model_finds_its_dataset(converted_cnn, capsys):
    """Bug 10: eval read only config.data.dataset: "the checkpoint stores no dataset"."""
    argv = ["eval", str(converted_cnn), "--max-per-class", "1", "--device", "cpu", "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["data"] == "sample" and res["images"] == 10


# ---------------------------------------------------------------------------- centre logs


@pytest.mark.parametrize("layers", [[], [[]]])
def test_centre_log_without_layers_or_heads_is_a_one_line_error(tmp_path, layers):
    """Bug 8: accepted, then a ZeroDivisionError when drawn."""
    log = tmp_path / "centers.jsonl"
    log.write_text(json.dumps({"epoch": 0, "layers": layers}) + "\n")
    with pytest.raises(ValueError, match=r"centers.jsonl:1: .*without layers or heads"):
        read_center_log(log)


def test_head_evolution_of_more_than_nine_heads(tmp_path):
    """Bug 9: 16 heads raised ValueError in grid_travel(k=3); now travel3 is NaN."""
    torch.manual_seed(0)
    log = tmp_path / "centers.jsonl"
    lines = [
        {
            "epoch": s // 100,
            "step": s,
            "layers": [torch.randn(16, 2).tolist()],
            "alpha": [[0.5] * 16],
        }
        for s in (0, 100)
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    layer = head_evolution(log, grid=(8, 8))[-1]["layers"][0]
    assert math.isnan(layer["travel3"])
    assert layer["displacement"] > 0 and math.isfinite(layer["mean_distance"])


# ---------------------------------------------------------------------------- bf16, ViT


def test_measure_a_bf16_model(images):
    """Bug 4: float32 images into a bf16 model: TypeError."""
    torch.manual_seed(0)
    m = attnconv.create_model("sa_quadratic", hidden_size=16, num_layers=2).bfloat16().eval()
    res = measure_model(m, images, mean=MEAN, std=STD)
    assert res.has_attention and all(torch.isfinite(d).all() for d in res.mean_distance)


def test_converted_vit_keeps_its_own_attention(images):
    """Bug 7: the view returned only the converted patch embedding (no ViT layers, no position
    similarity)."""
    torch.manual_seed(0)
    vit = attnconv.create_model("vit_tiny_cifar", depth=2, embed_dim=32, num_heads=4).eval()
    plain = measure_model(vit, images, mean=MEAN, std=STD)
    view = ConvertedAttentionView(convert_model(vit), (32, 32)).eval()
    res = measure_model(view, images, mean=MEAN, std=STD)
    assert res.layer_names == ["patch_embed", "layer 1", "layer 2"]
    assert res.layer_grids == [(32, 32), (8, 8), (8, 8)]
    assert res.position_similarity is not None
    for a, b in zip(res.mean_distance[1:], plain.mean_distance):  # the ViT's own, in pixels
        assert a.tolist() == pytest.approx(b.tolist(), rel=1e-4)


def test_converted_convs_between_attention_layers_give_the_converted_maps():
    """Bug 7: converted convs inside a model with its own attention have no known place in
    depth among its maps: the converted layers' maps alone, as before (a CNN's view)."""
    torch.manual_seed(0)
    kw = dict(widths=(8, 8, 8, 8), depths=(1, 1, 1, 1), num_heads=2, stem_heads=2, img_size=16)
    m = convert_model(attnconv.create_model("sasa_resnet26_convstem_cifar", **kw))
    view = ConvertedAttentionView(m, (16, 16)).eval()
    _, maps = view(torch.zeros(1, 3, 16, 16), return_attention=True)
    assert len(maps) == len(view.layers) and len(view.layer_names) == len(view.layers)


def test_rerun_into_the_same_folder_removes_only_its_own_stale_figures(images, tmp_path):
    """A second analysis into the same --out left the first one's figures it did not draw again
    beside the new index; now they go, and files the tool never listed stay."""
    torch.manual_seed(0)
    out = tmp_path / "out"
    m = attnconv.create_model("sa_learned_content", hidden_size=16, num_layers=2, num_heads=2)
    first = render_report(measure_model(m.eval(), images, mean=MEAN, std=STD), out)
    assert "attention_single" in first["figures"]
    (out / "notes.png").write_bytes(b"the user's")  # not the tool's
    listed = json.loads((out / "report.json").read_text())
    listed["figures"]["old_figure"] = "old_figure.png"  # as an older version drew it
    listed["figures"]["escape"] = "../outside.png"  # never followed out of the folder
    (out / "report.json").write_text(json.dumps(listed))
    (out / "old_figure.png").write_bytes(b"stale")
    (tmp_path / "outside.png").write_bytes(b"kept")
    quad = attnconv.create_model("sa_quadratic", hidden_size=16, num_layers=2).eval()
    second = render_report(measure_model(quad, images, mean=MEAN, std=STD), out)
    assert "attention_single" not in second["figures"]  # position only: one figure
    assert not (out / "attention_single.png").exists() and not (out / "old_figure.png").exists()
    assert (out / "notes.png").exists() and (tmp_path / "outside.png").exists()
    assert all((out / f).exists() for f in second["figures"].values())
