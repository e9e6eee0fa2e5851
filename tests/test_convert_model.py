"""convert_model on a CIFAR ResNet18 and `attnconv convert` on a real checkpoint + real CIFAR."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn as nn

from attnconv.cli import main
from attnconv.convert import ConvAttention, ConvAttention2d, convert_model, converted_layers
from attnconv.convert.report import compare_predictions, layer_report, lemma2_sweep
from attnconv.data import Loader, load_dataset
from attnconv.models import create_model
from attnconv.train.checkpoint import save_checkpoint

NARROW = {"widths": (8, 16, 16, 32)}  # resnet18_cifar's structure at test-friendly widths


def _trained_bn(model: nn.Module) -> nn.Module:
    """Give every BatchNorm non-trivial running statistics and affine weights (as training does)."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


def test_convert_model_resnet18_identical_predictions(cifar_zip):
    torch.manual_seed(0)
    model = _trained_bn(create_model("resnet18_cifar", **NARROW))
    conv_count = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    converted = convert_model(model).eval()
    plain = [m for m in converted.modules() if isinstance(m, nn.Conv2d)]
    assert all(isinstance(m, ConvAttention) for m in plain)  # all-attention
    assert len(converted_layers(converted)) == conv_count == 20
    assert any(isinstance(m, nn.Conv2d) for m in model.modules())  # original untouched
    ds = load_dataset(str(cifar_zip), "test", max_per_class=6)  # 60 real test images
    loader = Loader(ds, 30, shuffle=False)
    res = compare_predictions(model, converted, loader.batches(0))
    assert res["images"] == 60 and res["predictions_differ"] == 0
    assert res["accuracy_before"] == res["accuracy_after"]
    assert res["max_abs_logit_diff"] < 1e-4
    x = next(loader.batches(0))[0]
    rows = layer_report(model, converted, x)
    assert len(rows) == 20 and all(r["hard"] and r["rank_error"] == 0 for r in rows)
    for r in rows:
        assert r["max_abs_diff"] <= 1e-5 * max(1.0, r["max_abs_out"]), r


def test_convert_model_float64_exact_and_shared_convs():
    shared = nn.Conv2d(3, 3, 3, padding=1)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Conv1d(3, 2, 1)).double()
    model = nn.Sequential(*list(model)[:3])  # Conv2d twice (shared), same object
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64)
    conv = convert_model(model)
    assert conv[0] is conv[2] and isinstance(conv[0], ConvAttention2d)
    torch.testing.assert_close(conv(x), model(x), rtol=1e-12, atol=1e-12)
    inplace = convert_model(model, inplace=True)
    assert inplace is model and isinstance(model[0], ConvAttention2d)


def test_convert_model_soft_and_rank_limited_warn_once():
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)).double()
    with pytest.warns(UserWarning, match="worst relative kernel error") as rec:
        conv = convert_model(model, head_dim=1)
    assert len([w for w in rec if "kernel error" in str(w.message)]) == 1
    assert all(m.rank_error > 0 for _, m in converted_layers(conv))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        soft = convert_model(model, alpha=1e4)
    x = torch.randn(1, 4, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(soft(x), model(x), rtol=1e-10, atol=1e-10)
    with pytest.raises(TypeError, match="nn.Module"):
        convert_model("resnet18")


def test_lemma2_sweep_reaches_float_precision():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    rows = lemma2_sweep(conv, torch.randn(2, 3, 8, 8), [0.5, 2, 10, 100, 1e4])
    errs = [r["rel_err"] for r in rows]
    assert errs[0] > 0.1 and errs[-2] < 1e-6 and rows[-1]["alpha"] == float("inf")
    assert all(b <= a for a, b in zip(errs[:-1], errs[1:-1]))  # finite alphas, float32
    assert errs[-1] < 1e-6  # the hard limit: float32 rounding only


def test_cli_convert_checkpoint_with_real_data(tmp_path, cifar_zip, capsys):
    torch.manual_seed(0)
    model = _trained_bn(create_model("resnet18_cifar", **NARROW))
    ck = save_checkpoint(tmp_path / "ck", model, "resnet18_cifar", NARROW)
    out = tmp_path / "report.json"
    argv = [
        "convert",
        str(ck),
        "--data",
        str(cifar_zip),
        "--max-per-class",
        "3",
        "--num-images",
        "8",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "20 convolutions -> self-attention" in text and "layers.1.0.shortcut.0" in text
    assert "30 images: accuracy" in text and "predictions differ on 0 images" in text
    rep = json.loads(out.read_text())
    assert len(rep["layers"]) == 20 and rep["test_set"]["predictions_differ"] == 0
    assert rep["end_to_end"]["same_prediction"] == 8


def test_cli_convert_bad_inputs(tmp_path, capsys):
    assert main(["convert", "resnet18_cifa"]) == 2
    assert "did you mean resnet18_cifar" in capsys.readouterr().err
    assert main(["convert", "tiny_cnn", "--head-dim", "0"]) == 2
    assert "--head-dim must be >= 1" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing")]) == 2
