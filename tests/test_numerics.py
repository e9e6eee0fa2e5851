"""Extreme quadratic attention under bfloat16 *autocast* (how `train.bf16` trains), issue 8.

tests/test_positional.py::test_extreme_precision_and_far_centres_stay_finite casts the layer to
float32 / bfloat16; here the parameters stay float32 and autocast runs the matmuls in bfloat16,
for the layer and for a whole sa_quadratic model: alpha = 1e4 (Sigma^-1 ~ 2e4 I), centres up to
1e4 pixels outside the image, no NaN or inf in outputs, attention maps or any gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch

from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.models import create_model

CENTERS = [[0.0, 1.0], [300.0, -500.0], [1e4, 1e4], [-2.4, 1.6]]


def _finite_grads(module: torch.nn.Module) -> bool:
    return all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("positional", ["quadratic", "quadratic_generalized"])
@pytest.mark.parametrize("content", [False, True])
@pytest.mark.parametrize("backend", [None, "reference"])
def test_layer_under_bf16_autocast_stays_finite(positional, content, backend):
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(
        4, 8, 4, positional=positional, content=content, backend=backend
    )
    enc = layer.positional_encoding
    with torch.no_grad():
        enc.centers.copy_(torch.tensor(CENTERS))
        if positional == "quadratic":
            enc.set_alpha(1e4)
        else:
            enc.spread.copy_(torch.eye(2) * 140.0)  # Sigma^-1 ~ 2e4 I
    x = torch.randn(2, 4, 12, 10, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, attn = layer(x, return_attention=True)
    y.float().square().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(attn).all()
    assert torch.isfinite(x.grad).all() and _finite_grads(layer)
    assert enc.centers.grad is not None  # the centres do receive a (finite) gradient


def test_sa_quadratic_model_under_bf16_autocast_stays_finite():
    torch.manual_seed(0)
    model = create_model("sa_quadratic", num_classes=10)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadSelfAttention2d)]
    assert layers
    with torch.no_grad():
        for m in layers:
            m.positional_encoding.set_alpha(1e4)
            m.positional_encoding.centers.mul_(1e3)  # far outside the 16x16 token grid
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randn(2, 3, 32, 32))
    torch.nn.functional.cross_entropy(logits.float(), torch.tensor([1, 7])).backward()
    assert torch.isfinite(logits).all() and _finite_grads(model)


@pytest.mark.parametrize("positional", ["quadratic", "quadratic_generalized", "relative_learned"])
@pytest.mark.parametrize("hw", [16, pytest.param(48, marks=pytest.mark.slow)])
def test_content_attention_under_bf16_autocast_is_as_exact_as_the_plain_path(positional, hw):
    """Against a float64 reference: the fast (folded) content path under bf16 autocast is within
    1.5x of the plain dense path's error under the same autocast (bf16's own rounding). The
    folded quadratic logits used to be cast back to bf16 inside SDPA (wrong outputs, worse
    with image size)."""
    torch.manual_seed(0)
    fast = MultiHeadSelfAttention2d(32, 32, 4, positional=positional, content=True).eval()
    if positional.startswith("quadratic"):  # heads off the query: larger folded logits
        with torch.no_grad():
            fast.positional_encoding.centers.mul_(2.0)
    plain = MultiHeadSelfAttention2d(
        32, 32, 4, positional=positional, content=True, backend="reference"
    ).eval()
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(2, 32, hw, hw)
    ref = copy.deepcopy(fast).double()(x.double())

    def err(y):
        return ((y.double() - ref).abs().max() / ref.abs().max()).item()

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        e_fast, e_plain = err(fast(x)), err(plain(x))
    assert e_plain < 0.1 and e_fast <= 1.5 * e_plain  # plain generalized: 6-9e-2, others 5e-3


@pytest.mark.parametrize("positional", ["quadratic", "quadratic_generalized", "relative_learned"])
def test_batch_dropout_path_against_float64(positional):
    """The shared-mask dropout path (training, dropout_mask="batch"), same mask drawn in every
    precision: fp32 within the plain path's tolerance of float64, and under bf16 autocast within
    1.5x of the plain path's error under the same autocast."""
    kw = dict(positional=positional, content=False, dropout=0.2, dropout_mask="batch")
    torch.manual_seed(0)
    fast = MultiHeadSelfAttention2d(16, 16, 4, **kw).train()
    plain = MultiHeadSelfAttention2d(16, 16, 4, backend="reference", **kw).train()
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(2, 16, 12, 10)
    ref64 = copy.deepcopy(fast).double()

    def run(m, inp, autocast=False):
        torch.manual_seed(7)  # the same mask for every run
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return m(inp).double()

    ref = run(ref64, x.double())

    def err(y):
        return ((y - ref).abs().max() / ref.abs().max()).item()

    assert err(run(fast, x)) < 1e-5 and err(run(plain, x)) < 1e-5
    assert err(run(fast, x, True)) <= 1.5 * err(run(plain, x, True)) + 1e-6


def test_converted_network_under_bf16_autocast_against_float64():
    """A converted zoo network (grouped, depthwise, TF-SAME, weight-standardized layers) under
    bf16 autocast is as close to the float64 original as the original CNN under the same
    autocast (within 1.5x), and in fp32 within 1e-5."""
    from attnconv.convert import convert_model
    from zoo_models import ZooNet

    torch.manual_seed(0)
    net = ZooNet().eval()
    conv = convert_model(net).eval()
    x = torch.randn(2, 3, 45, 53)
    with torch.no_grad():
        ref = copy.deepcopy(net).double()(x.double())

        def err(m, autocast):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = m(x).double()
            return ((y - ref).abs().max() / ref.abs().max()).item()

        assert err(conv, False) < 1e-5
        assert err(conv, True) <= 1.5 * err(net, True)
