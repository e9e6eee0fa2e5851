"""A batch of 0 gives an empty output of the right shape, as PyTorch's layers do: every layer
(every positional encoding, with and without content, each dropout mask, the plain equations),
the converted convolutions and a converted network, and a model of every registry family, in
eval and in training (a backward runs: every parameter gets a zero gradient, the input an empty
one). Any other size 0 (channels, height) is still refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from attnconv.convert import conv_to_attention, convert_model
from attnconv.layers.encodings.registry import POSITIONALS
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mha import MultiHeadAttention
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d
from attnconv.models import create_model
from fuzz_helpers import expect_error


def _empty_step(module: nn.Module, x: torch.Tensor, shape: tuple, **kw) -> torch.Tensor:
    """forward and backward on the empty batch x; checks the output's shape and the gradients."""
    x = x.detach().requires_grad_(True)
    out = module(x, **kw)
    y = out[0] if isinstance(out, tuple) else out
    assert tuple(y.shape) == shape and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name, p in module.named_parameters():
        assert p.grad is None or not p.grad.any(), name  # nothing to learn from no images
    return out


def _mhsa_cases():
    for pos in POSITIONALS:
        for content in (True, False):
            try:
                MultiHeadSelfAttention2d(4, 8, 2, positional=pos, content=content, max_size=6)
            except ValueError:
                continue  # a combination the encoding does not define
            yield pos, content


@pytest.mark.parametrize("pos, content", list(_mhsa_cases()))
@pytest.mark.parametrize("mode", ["eval", "train sample", "train batch", "reference"])
def test_mhsa2d_runs_an_empty_batch(pos, content, mode):
    kw = dict(positional=pos, content=content, max_size=6, dropout=0.1)
    if mode == "train batch":
        kw["dropout_mask"] = "batch"  # one mask for every image
        try:
            MultiHeadSelfAttention2d(4, 8, 2, **kw)
        except ValueError:
            pytest.skip("a batch-shared mask is for attention that reads no input")
    m = MultiHeadSelfAttention2d(4, 8, 2, **kw).train(mode.startswith("train"))
    if mode == "reference":
        m.backend = "reference"
    _empty_step(m, torch.randn(0, 4, 5, 6), (0, 8, 5, 6))
    y, probs = m.eval()(torch.randn(0, 4, 5, 6), return_attention=True)
    assert y.shape == (0, 8, 5, 6) and probs.shape[1:] == (2, 30, 30)
    assert probs.shape[0] in (0, 1)  # position only: one map for every image
    assert m.forward_tokens(torch.randn(5, 6, 0, 4)).shape == (5, 6, 0, 8)


@pytest.mark.parametrize("backend", [None, "reference"])
def test_local_layers_run_an_empty_batch(backend):
    local = LocalSelfAttention2d(4, 8, 2, kernel_size=3).train()
    local.backend = backend
    _empty_step(local, torch.randn(0, 4, 5, 6), (0, 8, 5, 6))
    _, probs = local.eval()(torch.randn(0, 4, 5, 6), return_attention=True)
    assert probs.shape == (0, 2, 30, 9)
    stem = AttentionStem2d(4, 8, 2, kernel_size=3, pool=1).train()
    _empty_step(stem, torch.randn(0, 4, 5, 6), (0, 8, 5, 6))


def test_sequence_attention_runs_an_empty_batch():
    mha = MultiHeadAttention(8, 2).train()
    x = torch.randn(0, 7, 8, requires_grad=True)
    y = mha(x, x, x)
    y = y[0] if isinstance(y, tuple) else y
    assert y.shape == (0, 7, 8)
    y.sum().backward()


@pytest.mark.parametrize(
    "conv, shape",
    [
        (nn.Conv2d(4, 8, 3, padding=1), (0, 4, 5, 6)),
        (nn.Conv2d(4, 8, 3, padding=1, groups=2), (0, 4, 5, 6)),
        (nn.Conv2d(4, 8, 3, stride=2), (0, 4, 7, 7)),
        (nn.Conv1d(4, 8, 3, padding=1), (0, 4, 9)),
    ],
    ids=["dense", "grouped", "strided", "conv1d"],
)
def test_converted_convolutions_run_an_empty_batch(conv, shape):
    x = torch.randn(*shape)
    want = tuple(conv(x).shape)
    attn = conv_to_attention(conv).train()
    _empty_step(attn, x, want)
    y, _ = attn(x, return_attention=True)
    assert tuple(y.shape) == want


def test_a_converted_network_runs_an_empty_batch():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    _empty_step(convert_model(net).train(), torch.randn(0, 3, 8, 8), (0, 10))


FAMILIES = {  # a model of every registry family (create_model name: image size)
    "tiny_cnn": 32,
    "resnet18_cifar": 32,
    "resnet26_cifar": 32,
    "sa_quadratic": 32,
    "sa_quadratic_generalized": 32,
    "sa_learned": 32,
    "sa_learned_content": 32,
    "sasa_resnet26_cifar": 32,
    "sasa_resnet26_convstem_cifar": 32,
    "vit_tiny_cifar": 32,
    "deit_tiny_distilled_patch16_224": 224,
}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_model_family_runs_an_empty_batch(name):
    torch.manual_seed(0)
    m = create_model(name, num_classes=10)
    size = FAMILIES[name]
    for mode in (True, False):
        m.zero_grad(set_to_none=True)
        _empty_step(m.train(mode), torch.randn(0, 3, size, size), (0, 10))
    if name.startswith(("sa_", "vit")):
        _, maps = m.eval()(torch.randn(0, 3, size, size), return_attention=True)
        assert maps  # a map per layer (their batch empty)


def test_the_transformer_runs_an_empty_batch():
    m = create_model("transformer_small").train()
    src = torch.randint(4, 1000, (0, 5))
    logits = m(src, torch.randint(4, 1000, (0, 6)))
    assert logits.shape == (0, 6, 1000)
    logits.sum().backward()


@pytest.mark.parametrize(
    "make",
    [
        lambda: MultiHeadSelfAttention2d(4, 8, 2, positional="quadratic"),
        lambda: LocalSelfAttention2d(4, 8, 2, kernel_size=3),
        lambda: AttentionStem2d(4, 8, 2, kernel_size=3, pool=1),
        lambda: conv_to_attention(nn.Conv2d(4, 8, 3, padding=1)),
    ],
    ids=["mhsa2d", "local", "stem", "converted"],
)
def test_other_empty_sizes_are_refused_in_one_line(make):
    m = make()
    for shape in [(2, 4, 0, 5), (2, 4, 5, 0), (0, 4, 0, 5)]:
        err = expect_error(lambda shape=shape: m(torch.randn(*shape)))
        assert "empty" in str(err) or "smaller" in str(err) or "expected" in str(err)
    expect_error(lambda: create_model("tiny_cnn")(torch.randn(2, 3, 0, 32)))
