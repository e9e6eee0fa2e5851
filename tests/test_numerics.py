"""Extreme quadratic attention under bfloat16 *autocast* (how `train.bf16` trains), issue 8.

tests/test_positional.py::test_extreme_precision_and_far_centres_stay_finite casts the layer to
float32 / bfloat16; here the parameters stay float32 and autocast runs the matmuls in bfloat16,
for the layer and for a whole sa_quadratic model: alpha = 1e4 (Sigma^-1 ~ 2e4 I), centres up to
1e4 pixels outside the image, no NaN or inf in outputs, attention maps or any gradient.
"""

from __future__ import annotations

import pytest
import torch

from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.models import create_model

CENTERS = [[0.0, 1.0], [300.0, -500.0], [1e4, 1e4], [-2.4, 1.6]]


def _finite_grads(module: torch.nn.Module) -> bool:
    return all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("positional", ["quadratic", "quadratic_generalized"])
@pytest.mark.parametrize("content", [False, True])
@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_layer_under_bf16_autocast_stays_finite(positional, content, impl):
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(4, 8, 4, positional=positional, content=content, impl=impl)
    enc = layer.positional_encoding
    with torch.no_grad():
        enc.centers.copy_(torch.tensor(CENTERS))
        if positional == "quadratic":
            enc.set_alpha(1e4)
        else:
            enc.precision_factor.copy_(torch.eye(2) * 140.0)  # Sigma^-1 ~ 2e4 I
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
