"""Fixed lists of faults must raise the clear one-line error (the rules: test_fuzz.py's
docstring): bad layer options, bad inputs to every layer, learned tables on larger images, bad
image batches and sizes to the models."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from attnconv.convert import conv_to_attention
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d
from attnconv.models import create_model
from fuzz_helpers import F64, expect_error

MHSA_FAULTS = [
    dict(in_channels=0),
    dict(in_channels=-1),
    dict(in_channels=2.0),
    dict(num_heads=0),
    dict(num_heads=True),
    dict(out_channels=None),
    dict(positional="rotary"),
    dict(value="conv"),
    dict(backend="cuda"),
    dict(dropout=1.0),
    dict(dropout=float("nan")),
    dict(head_dim=0),
    dict(qk_dim=-1),
    dict(max_size=0),
    dict(positional="relative", rel_dim=0),
    dict(positional="quadratic", content=True, hard=True),
    dict(positional="none", relative_terms=("content_position",)),
    dict(num_heads=3),  # 4 out channels, no head_dim
]


@pytest.mark.parametrize(
    "bad", MHSA_FAULTS, ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items())
)
def test_mhsa2d_fault_raises_clearly(bad):
    kw = dict(in_channels=2, out_channels=4, num_heads=2) | bad
    expect_error(lambda: MultiHeadSelfAttention2d(**kw))


FIXED_BAD_INPUTS = {
    "float32 into float64": lambda c: torch.randn(1, c, 3, 3),
    "int": lambda c: torch.ones(1, c, 3, 3, dtype=torch.long),
    "bool": lambda c: torch.ones(1, c, 3, 3, dtype=torch.bool),
    "complex": lambda c: torch.randn(1, c, 3, 3, dtype=torch.complex128),
    "3-D": lambda c: torch.randn(c, 3, 3, dtype=F64),
    "5-D": lambda c: torch.randn(1, c, 3, 3, 1, dtype=F64),
    "channels": lambda c: torch.randn(1, c + 1, 3, 3, dtype=F64),
    "empty H": lambda c: torch.randn(1, c, 0, 3, dtype=F64),  # (a batch of 0 runs: empty out)
    "empty W, no batch": lambda c: torch.randn(0, c, 3, 0, dtype=F64),
    "list": lambda c: [[0.0] * c],
    "numpy": lambda c: torch.randn(1, c, 3, 3, dtype=F64).numpy(),
}
LAYERS = {
    "mhsa2d": lambda: MultiHeadSelfAttention2d(2, 4, 2, positional="quadratic"),
    "mhsa2d-position-only": lambda: MultiHeadSelfAttention2d(
        2, 4, 2, positional="relative_learned", content=False, max_size=4
    ),
    "local": lambda: LocalSelfAttention2d(2, 4, 2, kernel_size=3),
    "stem": lambda: AttentionStem2d(2, 4, 2, kernel_size=3, pool=1),
    "conv_to_attention": lambda: conv_to_attention(nn.Conv2d(2, 4, 3, padding=1)),
}


@pytest.mark.parametrize("inp", FIXED_BAD_INPUTS)
@pytest.mark.parametrize("layer", LAYERS)
def test_bad_inputs_raise_clearly(layer, inp):
    m = LAYERS[layer]().double()
    for backend in (None, "reference"):
        target = m.attention if layer == "conv_to_attention" else m
        target.backend = backend
        x = FIXED_BAD_INPUTS[inp](2)
        if layer == "conv_to_attention" and inp == "3-D":  # unbatched, as nn.Conv2d takes it
            torch.testing.assert_close(m(x), m(x[None])[0], rtol=0, atol=0)
            continue
        expect_error(lambda x=x: m(x))
    empty = m(torch.randn(0, 2, 3, 3, dtype=F64))  # a batch of 0: an empty output, as nn.Conv2d
    assert empty.shape == (0, *m(torch.randn(1, 2, 3, 3, dtype=F64)).shape[1:])


def test_learned_tables_refuse_larger_images():
    m = MultiHeadSelfAttention2d(2, 4, 2, positional="absolute_learned", max_size=3).double()
    err = expect_error(lambda: m(torch.randn(1, 2, 4, 3, dtype=F64)))
    assert "max_size=3" in str(err)


MODELS = [
    "tiny_cnn",
    "resnet18_cifar",
    "sa_quadratic",
    "sa_learned_content",
    "vit_tiny_cifar",
    "sasa_resnet26_cifar",
    "resnet26_cifar",
]
MODEL_INPUTS = {
    "float64": lambda: torch.randn(1, 3, 32, 32, dtype=F64),
    "int": lambda: torch.ones(1, 3, 32, 32, dtype=torch.long),
    "3-D": lambda: torch.randn(3, 32, 32),
    "channels": lambda: torch.randn(1, 4, 32, 32),
    "empty H": lambda: torch.randn(1, 3, 0, 32),
    "list": lambda: [[1.0]],
}


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {name: create_model(name, num_classes=10).eval() for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_models_refuse_bad_images_clearly(models, name):
    """create_model(...) models: each bad image batch gives its one-line error; a good one runs."""
    m = models[name]
    for make in MODEL_INPUTS.values():
        x = make()
        expect_error(lambda x=x: m(x))
    with torch.no_grad():
        assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)
        assert m(torch.randn(0, 3, 32, 32)).shape == (0, 10)  # a batch of 0: empty logits


@pytest.mark.parametrize(
    "name,bad",
    [
        ("sa_quadratic", {"num_classes": 0}),
        ("sa_quadratic", {"num_heads": True}),
        ("vit_tiny_cifar", {"patch_size": 0}),
        ("vit_tiny_cifar", {"num_classes": -1}),
        ("vit_tiny_cifar", {"depth": 0}),
        ("resnet18_cifar", {"in_chans": 0}),
        ("tiny_cnn", {"width": 2.5}),
        ("transformer_small", {"num_heads": 0}),
        ("sasa_resnet26_cifar", {"kernel_size": 0}),
        ("sa_learned", {"no_such_option": 1}),
    ],
)
def test_create_model_refuses_bad_sizes_clearly(name, bad):
    err = expect_error(lambda: create_model(name, **bad))
    assert next(iter(bad)) in str(err)
