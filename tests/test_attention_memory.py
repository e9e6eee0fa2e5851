"""Attention maps that cannot fit in memory are refused in one line, with the size needed and the
bound, before any of them is computed: a layer called with ``return_attention`` (MHSA, SASA's
window, the attention stem), a SASA ResNet's dense maps, and the maps of a converted network that
the analysis draws (its converted layers' maps, each over its padded input)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from attnconv.analysis.converted import ConvertedAttentionView
from attnconv.convert import convert_model
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d
from attnconv.memory import memory_bytes
from attnconv.models import create_model

HALF = f"({memory_bytes() // 2 / 2**30:.1f} GiB)"


def _refused(call, where: str, shape: str) -> str:
    with pytest.raises(ValueError) as e, torch.no_grad():
        call()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(where), msg
    assert re.search(r"needs at least [\d.]+ GiB", msg) and HALF in msg and shape in msg, msg
    return msg


def _ran(*modules: nn.Module) -> list[str]:
    """Records every forward of ``modules`` (a real hook: nothing replaced)."""
    calls: list[str] = []
    for m in modules:
        m.register_forward_pre_hook(lambda mod, args: calls.append(type(mod).__name__))
    return calls


def test_a_layer_refuses_its_map_before_projecting():
    layer = MultiHeadSelfAttention2d(2, 4, 2, positional="quadratic")
    calls = _ran(layer.value_proj, layer.out_proj)
    x = torch.zeros(1, 2, 1024, 1024)
    where = "MultiHeadSelfAttention2d on 1 image(s) of 1024x1024"
    _refused(lambda: layer(x, return_attention=True), where, "1 layer of 1x2x1048576x1048576")
    _refused(lambda: layer.attention_probs(x), where, "1x2x1048576x1048576")
    assert calls == []
    content = MultiHeadSelfAttention2d(2, 4, 2, positional="relative", content=True)
    x = torch.zeros(3, 2, 512, 512)
    _refused(lambda: content(x, return_attention=True), "MultiHeadSelfAttention2d on 3", "3x2x")
    y, probs = content(torch.zeros(3, 2, 4, 4), return_attention=True)  # small: as ever
    assert probs.shape == (3, 2, 16, 16)


@pytest.mark.parametrize("kind", ["local", "stem"])
def test_window_layers_refuse_their_maps_before_computing(kind):
    if kind == "local":
        layer = LocalSelfAttention2d(2, 4, 2, kernel_size=7)
        inner = layer.query
    else:
        layer = AttentionStem2d(2, 4, 2, kernel_size=4, pool=1)
        inner = layer.query
    calls = _ran(inner)
    kk = layer.kernel_size**2
    x = torch.zeros(1, 2, 1, 1).expand(1 << 20, 2, 64, 64)  # a view: no memory of its own
    where = f"{type(layer).__name__} on {1 << 20} image(s) of 64x64"
    _refused(lambda: layer(x, return_attention=True), where, f"{1 << 20}x2x4096x{kk}")
    assert calls == []


def test_sasa_refuses_dense_maps_before_any_layer():
    m = create_model(
        "sasa_resnet26_cifar", widths=(8, 16, 16, 32), num_heads=2, stem_heads=2
    ).eval()
    calls = _ran(m.stem)
    msg = _refused(
        lambda: m(torch.zeros(1, 3, 1024, 1024), return_attention=True),
        "sasa_resnet on 1 image(s) of 1024x1024",
        "9 layers, the largest 1x2x1048576x1048576",
    )
    assert "local_attention_maps" in msg and calls == []


def test_a_converted_networks_maps_are_refused_before_the_first():
    cnn = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.Flatten()
    )
    view = ConvertedAttentionView(convert_model(cnn), image_size=(512, 512)).eval()
    _refused(
        lambda: view(torch.zeros(1, 3, 512, 512), return_attention=True),
        "the converted layers on 1 image(s) of 512x512",  # not one layer's own refusal
        "2 layers of 1x9x262144x262144",
    )
    out, maps = view(torch.zeros(1, 3, 6, 6), return_attention=True)  # small: as ever
    assert [m.probs.shape for m in maps] == [(1, 9, 36, 36)] * 2
