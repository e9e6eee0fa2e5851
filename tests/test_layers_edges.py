"""Edges of the public layers found by the layers audit: a documented argument that was silently
ignored, a window kernel that read past inputs of the wrong shape, an attention map's image
index that gave an empty map, and a gradient that lost its precision in a backward pass run
inside autocast."""

from __future__ import annotations

import copy

import pytest
import torch

from attnconv.layers.attention_map import AttentionMap
from attnconv.layers.encodings.relative import LearnedRelativeEncoding
from attnconv.layers.kernels.window import local_attention
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d


def test_relative_learned_read_by_the_query_refuses_a_rel_dim():
    """With content the query's two halves read the tables (Cordonnier sec. 4.3, the upstream
    ``query_positional_score``): they are qk_dim wide whatever rel_dim said (it was ignored)."""
    with pytest.raises(ValueError, match="rel_dim=8"):
        MultiHeadSelfAttention2d(16, 16, 4, positional="relative_learned", content=True, rel_dim=8)
    with pytest.raises(ValueError, match="rel_dim=3"):
        LearnedRelativeEncoding(2, 4, 3, content=True)
    layer = MultiHeadSelfAttention2d(16, 16, 4, positional="relative_learned", content=True)
    assert layer.positional_encoding.tables.rel_row.shape[-1] == 2  # qk_dim // 2
    keys = MultiHeadSelfAttention2d(  # per-head keys read tables of rel_dim
        16, 16, 4, positional="relative_learned", content=True, head_keys=True, rel_dim=3
    )
    assert keys.positional_encoding.tables.rel_row.shape[-1] == 3


def _qkv(b=1, nh=2, d=4, h=3, w=3):
    return (torch.randn(b, nh, d, h, w) for _ in range(3))


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda q, k, v: dict(k=torch.randn(1, 2, 2, 3, 3)), "k must be"),  # fewer channels
        (lambda q, k, v: dict(k=torch.randn(1, 2, 4, 3, 4)), "k must be"),  # wider
        (lambda q, k, v: dict(v=torch.randn(1, 2, 4, 2, 2)), "k must be"),  # smaller image
        (lambda q, k, v: dict(v=torch.randn(1, 2, 4, 5, 5)), "k must be"),  # larger image
        (lambda q, k, v: dict(k=torch.randn(2, 2, 4, 3, 3)), "k must be"),  # another batch
        (lambda q, k, v: dict(kernel_size=0), "kernel_size"),
        (lambda q, k, v: dict(rel_row=torch.randn(3, 2), rel_col=torch.randn(2, 2)), "rel_row"),
        (lambda q, k, v: dict(rel_row=torch.randn(3, 2)), "rel_row"),
    ],
)
def test_local_attention_refuses_tensors_that_do_not_agree(fused, bad, match):
    """The window kernel reads k, v and the tables by q's sizes: the C++ one read past a smaller
    tensor (garbage out, no error), the Python one broadcast or raised deep inside PyTorch."""
    q, k, v = _qkv()
    kw = dict(k=k, v=v, kernel_size=3) | bad(q, k, v)
    with pytest.raises(ValueError, match=match):
        local_attention(q, kw.pop("k"), kw.pop("v"), backend="fused" if fused else "window", **kw)


def test_attention_map_image_index():
    """image(i) of a batch of maps: a negative index counts from the end, one outside the batch
    is an error (a slice gave an empty map), a shared map (batch 1) is every image's."""
    probs = torch.rand(3, 2, 4, 4).softmax(-1)
    maps = AttentionMap(probs, (2, 2))
    assert torch.equal(maps.image(-1).probs, probs[2:3])
    assert torch.equal(maps.image(1).probs, probs[1:2])
    for index in (3, -4):
        with pytest.raises(ValueError, match="outside the batch of 3"):
            maps.image(index)
    shared = AttentionMap(probs[:1], (2, 2))
    assert torch.equal(shared.image(5).probs, probs[:1])


def test_generalized_position_only_backward_inside_autocast():
    """``backward()`` inside a bf16 autocast region (tests/test_precision.py's case) through the
    generalized encoding's shared position-only kernel: its float64 fold met S = A A^T made in
    float32, whose backward ran as a bf16 product there, and dA = (dS + dS^T) A lost the
    cancellation of dS's large terms (0.31 against 0.035 after the region, |dA| = 7.5)."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(8, 12, 4, positional="quadratic_generalized", content=False)
    x, gy = torch.randn(2, 8, 16, 16), torch.randn(2, 12, 16, 16)
    assert layer.kernel(x) == "shared"

    def grads(module, inp, autocast, inside):
        enc = module.positional_encoding
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = (module(inp) * gy.to(inp.dtype)).sum()
            if inside:
                return torch.autograd.grad(loss, [enc.centers, enc.spread])
        return torch.autograd.grad(loss, [enc.centers, enc.spread])

    ref = grads(copy.deepcopy(layer).double(), x.double(), False, False)
    after, inside = (grads(layer, x, True, ins) for ins in (False, True))
    for want, a, i in zip(ref, after, inside):
        err_after = (a.double() - want).abs().max().item()
        err_inside = (i.double() - want).abs().max().item()
        assert err_inside <= 2 * err_after + 1e-6, (err_inside, err_after)


@pytest.mark.parametrize("alpha", [torch.ones(5), torch.ones(2, 4), [1.0, 2.0]])
def test_set_alpha_of_the_wrong_shape_is_one_line(alpha):
    """set_alpha takes a number or one alpha per head (Nh,): another shape was a RuntimeError
    from expand_as deep inside."""
    layer = MultiHeadSelfAttention2d(4, 4, 4, positional="quadratic", content=False)
    with pytest.raises(ValueError, match=r"alpha must be a number or \(4,\)"):
        layer.positional_encoding.set_alpha(alpha)
    layer.positional_encoding.set_alpha([1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(layer.positional_encoding.alpha, torch.tensor([1.0, 2, 3, 4]))
