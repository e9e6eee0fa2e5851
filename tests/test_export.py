"""Issue 15, item 8: ``torch.export.export`` works for every public layer and a converted network
in eval mode, with the batch size dynamic (image sizes / sequence lengths are static: the
positional tables and the converted convolution's geometry are specialised to them); the
exported program equals the eager module at another batch size. ``torch.jit.script`` on any of
them (or a model holding one) raises our one-line ScriptingUnsupported naming torch.export."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.export import Dim, export

from attnconv.convert import convert_model
from attnconv.layers.encodings import POSITIONALS
from attnconv.layers.feedforward import FeedForward
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mha import MultiHeadAttention, SinusoidalPositionalEncoding
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.scripting import ScriptingUnsupported
from attnconv.layers.stem import AttentionStem2d
from attnconv.models import create_model


def _cases():
    torch.manual_seed(0)
    img, seq = torch.randn(2, 8, 6, 6), torch.randn(2, 5, 8)
    out = [
        (f"mhsa2d-{p}", MultiHeadSelfAttention2d(8, 8, 2, positional=p, max_size=16), img)
        for p in POSITIONALS
    ]
    out += [
        ("local", LocalSelfAttention2d(8, 8, 2, 3), img),
        ("local-zeros-qr", LocalSelfAttention2d(8, 8, 2, 3, padding="zeros", logits="qr"), img),
        ("stem", AttentionStem2d(8, 8, 2, kernel_size=3, mixtures=2, pool=1), img),
        ("mha", MultiHeadAttention(8, 2), seq),
        ("feedforward", FeedForward(8, 16), seq),
        ("sinusoidal", SinusoidalPositionalEncoding(8), seq),
    ]
    net = create_model("tiny_cnn", num_classes=10, width=8)
    x = torch.randn(2, 3, 32, 32)
    out.append(("converted-hard", convert_model(net, inplace=False), x))
    out.append(("converted-soft", convert_model(net, alpha=4.0, inplace=False), x))
    return out


CASES = _cases()


@pytest.mark.parametrize("name, module, x", CASES, ids=[c[0] for c in CASES])
def test_export_with_dynamic_batch_equals_eager(name, module, x):
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = export(module, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=256)},))
    for b in (1, 3):
        xb = torch.cat([x] * 2)[:b]
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(xb), module(xb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, module, x", CASES, ids=[c[0] for c in CASES])
def test_torchscript_is_our_one_line_message(name, module, x):
    if name == "feedforward":  # plain Linear / activation / Dropout: TorchScript compiles it
        torch.jit.script(module)
        return
    with pytest.raises(ScriptingUnsupported, match=r"does not support torch.jit.script") as e:
        torch.jit.script(module)
    assert "torch.export.export" in str(e.value) and "\n" not in str(e.value)


def test_torchscript_of_a_model_holding_a_layer_is_our_message():
    model = create_model("sa_quadratic", num_classes=10, num_layers=1, hidden_size=16, num_heads=2)
    with pytest.raises(ScriptingUnsupported, match="MultiHeadSelfAttention2d does not support"):
        torch.jit.script(model)
