"""Theorem 1 on model-zoo patterns: every convolution is converted exactly (checked against its
own forward, including TF-'SAME' padding at any size and weight standardization) or refused with
its path; never silently wrong."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from attnconv.convert import (
    ConvAttention,
    ConvAttention2d,
    UnsupportedConv,
    conv_spec,
    conv_to_attention,
    convert_model,
    register_conv_rule,
    unconverted_layers,
)
from attnconv.convert.rules import CONV_RULES, ConvSpec, plain_spec
from zoo_models import Conv2dSame, ScaledStdConv2d, ZooNet


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("size", [(224, 224), (37, 53)])
def test_zoo_network_converts_exactly(size):
    torch.manual_seed(0)
    net = ZooNet().eval()
    conv = convert_model(net).eval()
    assert unconverted_layers(conv) == []
    n_convs = sum(isinstance(m, nn.Conv2d | nn.Conv1d) for m in net.modules())
    n_attn = sum(isinstance(m, ConvAttention) for m in conv.modules())
    assert n_convs == n_attn == 21
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        assert _rel(conv(x), net(x)) <= 1e-5


@pytest.mark.parametrize(
    "k, stride, dilation, size",
    [(3, 2, 1, (17, 16)), (5, 2, 2, (31, 30)), (4, 3, 1, (20, 23)), (3, 1, 1, (9, 12))],
)
def test_tf_same_padding_stays_exact_at_every_size(k, stride, dilation, size):
    torch.manual_seed(0)
    m = Conv2dSame(3, 5, k, stride, dilation)
    a = conv_to_attention(m)
    assert a.geometry.dynamic_same is (stride > 1)  # stride 1: the same pad at every size
    for h, w in (size, (size[0] + 1, size[1] + 2), (64, 41)):  # not only the probe sizes
        x = torch.randn(1, 3, h, w)
        assert a(x).shape == m(x).shape
        torch.testing.assert_close(a(x), m(x), rtol=1e-5, atol=1e-5)


def test_weight_standardization_is_folded_for_inference():
    torch.manual_seed(0)
    m = ScaledStdConv2d(4, 6, 3, padding=1, eps=1e-4)
    spec = conv_spec(m)
    w = m.weight.reshape(6, -1)
    ref = (w - w.mean(1, keepdim=True)) / torch.sqrt(w.var(1, unbiased=False, keepdim=True) + 1e-4)
    ref = (ref * m.gain.reshape(6, 1) * m.scale).reshape_as(m.weight)
    torch.testing.assert_close(spec.weight, ref)
    x = torch.randn(2, 4, 15, 11)
    torch.testing.assert_close(conv_to_attention(m)(x), m(x))


def test_parametrized_weights():
    torch.manual_seed(0)
    m = nn.utils.parametrizations.weight_norm(nn.Conv2d(4, 6, 3, padding=1, stride=2))
    x = torch.randn(2, 4, 13, 10)
    torch.testing.assert_close(conv_to_attention(m)(x), m(x))
    torch.testing.assert_close(conv_to_attention(m, head_dim=6)(x), m(x), rtol=1e-4, atol=1e-4)


class _Scaled(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2  # not one convolution's output


class _Noisy(nn.Conv2d):
    def forward(self, x):
        return super().forward(x + 1)  # transforms the input


class _Weird(nn.Conv2d):
    def forward(self, x):  # padding that depends on the size and is not TF-SAME
        return super().forward(nn.functional.pad(x, (x.shape[-1] % 3, 0, 0, 0)))


@pytest.mark.parametrize("cls", [_Scaled, _Noisy, _Weird])
def test_unreadable_subclasses_are_refused_or_kept_with_their_path(cls):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.ReLU(), cls(4, 4, 3)))
    with pytest.raises(UnsupportedConv, match=rf"cannot convert 1\.1 \({cls.__name__}\)"):
        convert_model(net)
    with pytest.warns(UserWarning, match="kept as they are"):
        kept = convert_model(net, on_unsupported="keep")
    assert [(p, c) for p, c, _ in unconverted_layers(kept)] == [("1.1", cls.__name__)]
    assert isinstance(kept[0], ConvAttention2d) and isinstance(kept[1][1], cls)
    x = torch.randn(1, 3, 11, 12)
    torch.testing.assert_close(kept(x), net(x))
    with pytest.raises(ValueError, match="on_unsupported must be one of"):
        convert_model(net, on_unsupported="skip")


def test_a_wrong_rule_is_caught_by_the_check():
    """A registered rule that misreads its class (here: ignores the gain) never converts
    silently: the probe comparison refuses it."""

    class Gained(nn.Conv2d):
        def forward(self, x):
            return nn.functional.conv2d(x, self.weight * 3, self.bias, self.stride, self.padding)

    register_conv_rule(Gained, plain_spec)
    try:
        with pytest.raises(UnsupportedConv, match="differs from the module's own forward"):
            conv_to_attention(Gained(3, 3, 3, padding=1))
    finally:
        del CONV_RULES[Gained]

    @register_conv_rule(Gained)
    def gained(m: nn.Module) -> ConvSpec:
        s = plain_spec(m)
        return ConvSpec(s.weight * 3, s.bias, s.geometry)

    try:
        g = Gained(3, 3, 3, padding=1)
        x = torch.randn(1, 3, 9, 9)
        torch.testing.assert_close(conv_to_attention(g)(x), g(x))
    finally:
        del CONV_RULES[Gained]


def test_conv1d_subclass_with_same_padding():
    class Same1d(nn.Conv1d):
        def forward(self, x):
            return super().forward(nn.functional.pad(x, (1, 1)))

    torch.manual_seed(0)
    m = Same1d(2, 3, 3, padding=0)
    x = torch.randn(2, 2, 19)
    torch.testing.assert_close(conv_to_attention(m)(x), m(x))


def test_cli_convert_saves_a_model_that_loads_converted(tmp_path, capsys):
    from attnconv.cli import main
    from attnconv.models import create_model
    from attnconv.train.checkpoint import load_model

    out = tmp_path / "converted"
    assert main(["convert", "resnet18_cifar", "--num-images", "4", "--out", str(out)]) == 0
    assert "saved the converted model" in capsys.readouterr().out
    model, info = load_model(out)
    assert info["converted"]["alpha"] is None and info["model"] == "resnet18_cifar"
    assert sum(isinstance(m, ConvAttention) for m in model.modules()) == 20
    torch.manual_seed(0)  # the CLI's random weights for a registry name
    ref = create_model("resnet18_cifar").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "cin, cout, k, stride, groups",
    [(8, 8, 3, 1, 8), (8, 16, 5, 2, 8), (8, 16, 3, 1, 4), (6, 6, 7, 1, 6)],
)
def test_grouped_convs_stay_grouped_and_exact(cin, cout, k, stride, groups):
    """Depthwise / grouped: the converted layer stores the kernel's entries only (plus 3 numbers
    per head), its fast hard path equals the layer's own attention (reference path) and the conv,
    gradients included."""
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups).double()
    a = conv_to_attention(conv)
    n_conv = sum(p.numel() for p in conv.parameters())
    assert sum(p.numel() for p in a.parameters()) == n_conv + 3 * k * k
    x = torch.randn(2, cin, 13, 11, dtype=torch.float64, requires_grad=True)
    y = a(x)
    torch.testing.assert_close(y, conv(x))
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad((y * g).sum(), x)
    (gc,) = torch.autograd.grad((conv(x) * g).sum(), x)
    torch.testing.assert_close(gx, gc)
    torch.testing.assert_close(a.forward_layer(x), y)  # the layer's own path on every pixel
    with torch.no_grad():  # the cache-blocked inference path
        torch.testing.assert_close(a(x), conv(x))


def test_depthwise_heavy_networks_keep_their_size():
    from attnconv.bench.convnets import ConvNeXtStack, DepthwiseSeparableNet

    torch.manual_seed(0)
    for net in (DepthwiseSeparableNet(), ConvNeXtStack()):
        conv = convert_model(net.eval())
        n0, n1 = (sum(p.numel() for p in m.parameters()) for m in (net, conv))
        assert n1 <= 1.1 * n0
        x = torch.randn(1, 3, 45, 61)
        with torch.no_grad():
            assert _rel(conv(x), net(x)) <= 1e-5


def test_hooks_are_read_from_the_forward_they_change():
    """A forward pre-hook that recomputes the weight (the old hook-based weight_norm) is traced,
    not read from a stale attribute; a hook that changes the input is refused."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    g = nn.Parameter(torch.full((4, 1, 1, 1), 2.0))
    v = conv.weight.detach().clone()

    def recompute(mod, args):
        mod.weight = nn.Parameter(g * v / v.flatten(1).norm(dim=1)[:, None, None, None])

    conv.register_forward_pre_hook(recompute)
    with torch.no_grad():
        g.fill_(3.0)  # the attribute is stale until the next forward
    x = torch.randn(1, 3, 9, 10)
    torch.testing.assert_close(conv_to_attention(conv)(x), conv(x))
    bad = nn.Conv2d(3, 4, 3, padding=1)
    bad.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    with pytest.raises(UnsupportedConv, match="transforms the input"):
        conv_to_attention(bad)
