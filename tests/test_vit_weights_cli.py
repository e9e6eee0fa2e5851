"""`attnconv analyze` / `explore` / `convert` with ``--model NAME --checkpoint PATH``: pretrained
Hugging Face DeiT weights (small random ones, saved with ``save_pretrained``)."""

from __future__ import annotations

import pytest
import torch

from pretrained_vits import DEPTH, HEADS, SMALL, hf_config, hf_save, images

transformers = pytest.importorskip("transformers")


@pytest.fixture
def micro_name(monkeypatch):
    """A registry name of the micro geometry (the real ones need 224 px forwards: slow here)."""
    from attnconv.models import registry, vit_zoo

    def vit_micro_test(num_classes: int = 1000, **overrides):
        geometry = dict(SMALL, patch_size=16, img_size=64, dist_token=True)
        return vit_zoo._vit("vit_micro_test", geometry, num_classes, overrides)

    monkeypatch.setitem(registry._MODELS, "vit_micro_test", vit_micro_test)
    return "vit_micro_test"


@pytest.mark.slow
def test_analyze_and_explore_take_pretrained_weights(tmp_path, micro_name):
    import json

    from attnconv.cli import main

    hf = tmp_path / "deit"
    cfg = hf_config("DeiTConfig", num_labels=3)
    cfg.image_size, cfg.patch_size = 64, 16
    hf_save(transformers.DeiTForImageClassificationWithTeacher(cfg), hf)
    out = tmp_path / "figs"
    argv = [
        "analyze",
        "--model",
        micro_name,
        "--checkpoint",
        str(hf),
        "--out",
        str(out),
        "--num-images",
        "4",
        "--batch-size",
        "3",
    ]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["image_size"] == [64, 64] and report["attention_grid"] == [4, 4]
    assert report["num_prefix_tokens"] == 2  # class + distillation token
    dist = report["mean_distance_px"]
    assert len(dist) == DEPTH and all(len(row) == HEADS for row in dist)
    for fig in ("mean_distance.png", "position_similarity.png", "patch_pcs.png"):
        assert (out / fig).stat().st_size > 1000, fig
    page = tmp_path / "page.html"
    argv = [
        "explore",
        "--model",
        micro_name,
        "--checkpoint",
        str(hf),
        "--out",
        str(page),
        "--images",
        "2",
        "--average",
        "3",
    ]
    assert main(argv) == 0 and page.stat().st_size > 1000
    assert main(["analyze", "--checkpoint", str(hf), "--out", str(out)]) == 2  # no --model
    assert main(["explore", str(hf), "--out", str(page)]) == 2  # a foreign folder, no --model


def test_convert_takes_pretrained_weights_and_saves_them_whole(tmp_path, micro_name):
    """`attnconv convert NAME --checkpoint PATH --out DIR`: DIR reloads without PATH, with the
    checkpoint's settings (LayerNorm eps 1e-12 from the Hugging Face config)."""
    from attnconv.cli import main
    from attnconv.train.checkpoint import load_model

    hf = tmp_path / "deit"
    cfg = hf_config("DeiTConfig", num_labels=3)
    cfg.image_size, cfg.patch_size = 64, 16
    src = hf_save(transformers.DeiTForImageClassificationWithTeacher(cfg), hf)
    out = tmp_path / "converted"
    argv = ["convert", micro_name, "--checkpoint", str(hf), "--out", str(out), "--num-images", "4"]
    assert main(argv) == 0
    for f in hf.iterdir():
        f.unlink()  # the converted checkpoint must not need the source any more
    converted, info = load_model(out)
    assert info["model_kwargs"]["norm_eps"] == 1e-12
    x = images(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), src(x).logits, atol=1e-4, rtol=0)


def test_images_are_resized_to_the_model_size_in_chunks():
    """CIFAR 32x32 -> 224x224 uint8, chunk by chunk, equal to one bilinear resize of all."""
    import torch.nn.functional as F

    from attnconv.analysis.inputs import resize_images

    x = torch.randint(0, 256, (70, 3, 32, 32), dtype=torch.uint8)  # more than one chunk
    got = resize_images(x, 224)
    want = F.interpolate(x.float(), size=(224, 224), mode="bilinear", antialias=True)
    assert got.dtype == torch.uint8 and got.shape == (70, 3, 224, 224)
    assert torch.equal(got, want.round().clamp(0, 255).to(torch.uint8))
    assert resize_images(x, 32) is x
