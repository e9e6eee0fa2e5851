"""Converter edge cases that once went wrong (each test failed before its fix): weights written
behind autograd's back, padding read from a traced forward, rank-limited grouped heads, frozen
convolutions, lazy / transposed / 3-D convolutions in convert_model, unbatched input, padding
wider than the kernel, a soft alpha the dtype cannot hold, the global RNG, the per-layer report
of a partly converted model. Every comparison is in float64 against the original convolution."""

from __future__ import annotations

import re
from contextlib import nullcontext

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import prune

from attnconv.convert import (
    ConvAttention2d,
    UnsupportedConv,
    attention_to_conv,
    conv_to_attention,
    convert_model,
    kernel_to_heads,
    low_rank_heads,
    unconverted_layers,
)
from attnconv.convert.attributes import head_matrices
from attnconv.convert.report import layer_report

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")

F64 = torch.float64
EXACT = {"rtol": 1e-12, "atol": 1e-12}


def _convs():
    return [
        nn.Conv2d(3, 4, 3, padding=1),
        nn.Conv2d(4, 6, 3, padding=1, groups=2),  # GroupedHeadProjection
        nn.Conv1d(3, 4, 3, padding=1),
    ]


def _input(conv: nn.Module, batch: int = 2) -> torch.Tensor:
    size = (9,) if isinstance(conv, nn.Conv1d) else (9, 8)
    return torch.randn(batch, conv.in_channels, *size, dtype=F64)


@pytest.mark.parametrize("conv", _convs(), ids=["dense", "grouped", "conv1d"])
def test_no_grad_forward_follows_weights_written_through_data(conv):
    """EMA / clipping code writes through ``p.data`` (no version bump), and
    ``vector_to_parameters`` swaps each parameter's storage: the next no-grad forward uses the
    new weights (the plan kept from an earlier call is checked against copies of the values,
    not a version counter)."""
    torch.manual_seed(0)
    conv = conv.double()
    attn = conv_to_attention(conv).eval()
    x = _input(conv)
    proj = attn.attention.out_proj
    with torch.no_grad():
        torch.testing.assert_close(attn(x), conv(x), **EXACT)  # a first inference call
        torch.testing.assert_close(attn(x), conv(x), **EXACT)  # the kept plan
        getattr(proj, "kernel", proj.weight).data.mul_(3.0)  # W^(h) = 3 x the kernel
        conv.weight.data.mul_(3.0)
        proj.bias.data.add_(1.0)
        conv.bias.data.add_(1.0)
        torch.testing.assert_close(attn(x), conv(x), **EXACT)
        for _ in range(2):  # another conv's parameters, twice: each call must follow
            other = type(conv)(**_args(conv)).double()
            vec = nn.utils.parameters_to_vector(conv_to_attention(other).parameters())
            nn.utils.vector_to_parameters(vec, attn.parameters())
            torch.testing.assert_close(attn(x), other(x), **EXACT)
            vec[-other.out_channels :] += 1.0  # the bias, in place in the shared storage
            torch.testing.assert_close(attn(x), other(x) + 1.0, **EXACT)


def _args(conv: nn.Module) -> dict:
    return {
        "in_channels": conv.in_channels,
        "out_channels": conv.out_channels,
        "kernel_size": conv.kernel_size,
        "padding": conv.padding,
        "groups": conv.groups,
    }


class _OwnForward(nn.Conv2d):  # any subclass with its own forward is traced (rules.py)
    def forward(self, x):
        return super().forward(x)


class _OwnForward1d(nn.Conv1d):
    def forward(self, x):
        return super().forward(x)


class _PadsItself(nn.Conv2d):
    """Pads with F.pad (``pad`` in F.pad order), then an unpadded F.conv2d."""

    def __init__(self, *args, pad=(0, 0, 0, 0), **kw):
        super().__init__(*args, **kw)
        self.pad = pad

    def forward(self, x):
        return F.conv2d(F.pad(x, self.pad), self.weight, self.bias, self.stride)


@pytest.mark.parametrize(
    "conv, padding",
    [
        (_OwnForward(3, 4, 3, padding=1, padding_mode="reflect"), (1, 1)),
        (_OwnForward(3, 4, (3, 5), padding=(1, 2), padding_mode="circular"), (1, 2)),
        (_OwnForward1d(3, 4, 3, padding=2, padding_mode="replicate"), (2,)),
        (_PadsItself(3, 4, 3, pad=(2, 2, 1, 1)), (1, 2)),
        (_PadsItself(3, 4, 2, pad=(0, 1, 0, 1)), "same"),  # nn.Conv2d's "same", odd pixel last
    ],
    ids=["reflect", "circular", "conv1d-replicate", "f-pad", "f-pad-same"],
)
def test_traced_padding_is_reported_and_round_trips(conv, padding):
    """The padding of a traced forward (padding_mode, or F.pad) is the converted module's
    ``padding`` and the round trip's: same output size and values as the original."""
    torch.manual_seed(0)
    conv = conv.double()
    attn = conv_to_attention(conv)
    assert attn.padding == padding and attn.padding_mode == conv.padding_mode
    back = attention_to_conv(attn)
    assert type(back) in (nn.Conv1d, nn.Conv2d) and back.padding == padding
    x = _input(conv)
    torch.testing.assert_close(back(x), conv(x), **EXACT)
    torch.testing.assert_close(attn(x), conv(x), **EXACT)


def test_asymmetric_traced_padding_has_no_conv_round_trip():
    torch.manual_seed(0)
    conv = _PadsItself(3, 4, 3, stride=2, pad=(0, 1, 0, 1)).double()
    attn = conv_to_attention(conv)
    x = _input(conv)
    torch.testing.assert_close(attn(x), conv(x), **EXACT)
    assert attn.padding == (0, 1, 0, 1)  # F.pad order: no nn.Conv2d padding says it
    with pytest.raises(ValueError, match=r"asymmetric padding \(0, 1, 0, 1\)"):
        attention_to_conv(attn)


def test_rank_limited_grouped_heads_stay_block_diagonal():
    """head_dim >= every head's rank: exact, W^(h)'s off-diagonal blocks exactly zero, so the
    layer has its kernel (``weight``) and a conv round trip."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, groups=2, padding=1).double()
    attn = conv_to_attention(conv, head_dim=4)
    assert attn.rank_error == 0.0
    heads, _ = head_matrices(attn.attention)
    assert heads[:, :4, 2:].abs().max() == 0 and heads[:, 4:, :2].abs().max() == 0
    assert hasattr(attn, "weight")
    torch.testing.assert_close(attn.weight, conv.weight, **EXACT)
    x = _input(conv)
    torch.testing.assert_close(attn(x), conv(x), **EXACT)
    torch.testing.assert_close(attention_to_conv(attn)(x), conv(x), **EXACT)
    with torch.no_grad():  # trained heads that left the blocks: no kernel, hasattr False
        attn.attention.value_proj.weight[0, 3] = 1.0  # head 0 reads group 1 into group 0
    assert not hasattr(attn, "weight")
    with pytest.raises(ValueError, match="not block-diagonal"):
        attention_to_conv(attn)


@pytest.mark.parametrize("rank", [1, 2, 3, 5])
def test_low_rank_of_block_diagonal_heads_is_the_truncated_svd(rank):
    """Per-group SVD keeps the blocks and is still Eckart-Young: the error is the dense
    truncated SVD's (the singular values of a block-diagonal matrix are its blocks')."""
    torch.manual_seed(0)
    weight = torch.randn(6, 2, 3, 3, dtype=F64)  # Cout 6, Cin 6, groups 3
    heads = kernel_to_heads(weight, 3)  # (9, 6, 6) block-diagonal
    val, out, err = low_rank_heads(heads, rank, groups=3)
    assert val.shape == (9, rank, 6) and out.shape == (9, 6, rank)
    approx = out @ val
    mask = kernel_to_heads(torch.ones_like(weight), 3) == 0
    assert approx[mask].abs().max() == 0  # off-diagonal blocks exactly zero
    s = torch.linalg.svdvals(heads)
    dense_err = (s[:, rank:].square().sum() / s.square().sum()).sqrt().item()
    assert err == pytest.approx(dense_err, rel=1e-12, abs=1e-15)
    assert ((heads - approx).norm() / heads.norm()).item() == pytest.approx(err, rel=1e-9)


def test_frozen_convs_stay_frozen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).double()
    model[0].requires_grad_(False)  # a frozen stem
    conv_model = convert_model(model)
    assert not any(p.requires_grad for p in conv_model[0].parameters())
    assert all(p.requires_grad for p in conv_model[2].parameters())
    x = torch.randn(2, 3, 9, 8, dtype=F64)
    torch.testing.assert_close(conv_model(x), model(x), **EXACT)
    bitfit = nn.Conv2d(4, 6, 3, groups=2)
    bitfit.weight.requires_grad_(False)  # only the bias trains
    attn = conv_to_attention(bitfit, head_dim=4)  # exact: rank <= 4
    trainable = {n for n, p in attn.named_parameters() if p.requires_grad}
    assert trainable == {"attention.out_proj.bias", "attention.value_proj.bias"}


def test_lazy_conv_is_kept_or_refused_with_its_path():
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.Sequential(nn.LazyConv2d(4, 3)))
    with pytest.raises(UnsupportedConv, match=r"cannot convert 1\.0 \(LazyConv2d\).*lazy"):
        convert_model(model)
    with pytest.warns(UserWarning, match="kept as they are"):
        kept = convert_model(model, on_unsupported="keep")
    assert [(p, c) for p, c, _ in unconverted_layers(kept)] == [("1.0", "LazyConv2d")]
    assert isinstance(kept[0], ConvAttention2d) and isinstance(kept[1][0], nn.LazyConv2d)


@pytest.mark.parametrize(
    "first, conv, x_shape",
    [
        (nn.Conv2d(3, 8, 3, padding=1), nn.ConvTranspose2d(8, 3, 2, stride=2), (2, 3, 6, 6)),
        (nn.Conv1d(3, 8, 3, padding=1), nn.ConvTranspose1d(8, 3, 2, stride=2), (2, 3, 6)),
        (nn.Identity(), nn.Conv3d(3, 2, 1), (2, 3, 4, 5, 6)),
    ],
    ids=["transpose2d", "transpose1d", "conv3d"],
)
def test_transposed_and_3d_convs_are_refused_or_kept(first, conv, x_shape):
    """Never left in place silently: refused with their path, or kept and listed."""
    torch.manual_seed(0)
    model = nn.Sequential(first, conv).double()
    name = type(conv).__name__
    with pytest.raises(UnsupportedConv, match=rf"cannot convert 1 \({name}\).*not supported"):
        convert_model(model)
    with pytest.warns(UserWarning, match="kept as they are"):
        kept = convert_model(model, on_unsupported="keep")
    assert [(p, c) for p, c, _ in unconverted_layers(kept)] == [("1", name)]
    assert type(kept[1]) is type(conv)
    x = torch.randn(*x_shape, dtype=F64)
    torch.testing.assert_close(kept(x), model(x), **EXACT)


@pytest.mark.parametrize("conv", _convs(), ids=["dense", "grouped", "conv1d"])
def test_unbatched_input_as_the_conv_accepts_it(conv):
    """(C, H, W) / (C, L) input, as nn.Conv2d / nn.Conv1d take it; a batch of 0 gives an empty
    output, as theirs does."""
    torch.manual_seed(0)
    conv = conv.double()
    attn = conv_to_attention(conv)
    x = _input(conv)[0]
    ref = conv(x)
    torch.testing.assert_close(attn(x), ref, **EXACT)
    torch.testing.assert_close(attn.forward_layer(x), ref, **EXACT)
    y, probs = attn(x, return_attention=True)
    torch.testing.assert_close(y, ref, **EXACT)
    _, batched = attn(x[None], return_attention=True)
    torch.testing.assert_close(probs, batched[0], **EXACT)
    empty = _input(conv, batch=0)
    torch.testing.assert_close(attn(empty), conv(empty), **EXACT)
    assert attn(empty).shape == (0, *ref.shape)
    with pytest.raises(ValueError, match="unbatched"):
        attn(x[0])


@pytest.mark.parametrize(
    "conv, size",
    [
        (nn.Conv2d(3, 4, 1, padding=7, padding_mode="reflect"), (16, 15)),
        (nn.Conv2d(3, 4, 3, padding=(1, 12), padding_mode="circular"), (12, 16)),
        (nn.Conv1d(3, 4, 1, stride=2, padding=9, padding_mode="reflect"), (13,)),
        (_OwnForward(3, 4, 1, padding=8, padding_mode="reflect"), (9, 10)),
    ],
    ids=["reflect", "circular", "conv1d-reflect", "traced-reflect"],
)
def test_padding_wider_than_the_kernel_converts(conv, size):
    """The probes are larger than the padding (reflect needs pad < size): such a conv was
    refused ("fails on every probe input size") though it runs on these inputs."""
    torch.manual_seed(0)
    conv = conv.double()
    attn = conv_to_attention(conv)
    x = torch.randn(2, 3, *size, dtype=F64)
    torch.testing.assert_close(attn(x), conv(x), **EXACT)


@pytest.mark.parametrize(
    "dtype, alpha, fine", [(torch.float16, 1e10, 1e9), (torch.float32, 1e39, 1e38)]
)
def test_soft_alpha_the_dtype_cannot_hold_is_refused(dtype, alpha, fine):
    """alpha beyond the dtype (the spread sqrt(2 alpha) or alpha itself overflows) gave NaN
    outputs silently (a soft layer is checked as the plain conv it is built from)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1).to(dtype)
    with pytest.raises(ValueError, match=re.escape(f"alpha={alpha:g} overflows {dtype}")):
        conv_to_attention(conv, alpha=alpha)
    x = torch.randn(2, 3, 7, 6).to(dtype)
    y = conv_to_attention(conv, alpha=fine)(x)  # the largest that fits: the conv, to rounding
    torch.testing.assert_close(y.float(), conv(x).float(), rtol=1e-2, atol=1e-2)


def test_conversion_leaves_the_global_rng_alone():
    """Probes and the layers' throw-away init used the global generator: a seeded run drew
    different numbers after a conversion."""
    model = nn.Sequential(_OwnForward(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3, groups=2))
    torch.manual_seed(0)
    expected = torch.randn(5)
    for kw in ({}, {"alpha": 3.0, "head_dim": 1}):
        torch.manual_seed(0)
        with pytest.warns(UserWarning) if kw else nullcontext():
            convert_model(model, **kw)
        assert torch.equal(torch.randn(5), expected)


class _Shifted(nn.Conv2d):  # its forward transforms the input: kept by on_unsupported="keep"
    def forward(self, x):
        return super().forward(x + 1)


def test_layer_report_of_a_partly_converted_model():
    """A conv kept by on_unsupported="keep" made layer_report raise TypeError ("expected a
    ConvAttention module"), so `attnconv convert --keep-unsupported` failed whenever it kept
    one; it is left out of the rows (unconverted_layers lists it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _Shifted(4, 4, 1)).double()
    with pytest.warns(UserWarning, match="kept as they are"):
        converted = convert_model(model, on_unsupported="keep")
    rows = layer_report(model, converted, torch.randn(2, 3, 8, 7, dtype=F64))
    assert [r["name"] for r in rows] == ["0"] and rows[0]["max_abs_diff"] == 0.0


@pytest.mark.filterwarnings("ignore:.*weight_norm")
def test_pruned_and_old_weight_norm_models_convert_as_a_copy():
    """torch.nn.utils.prune and the old weight_norm keep a computed (non-leaf) weight that
    copy.deepcopy refuses: convert_model (not inplace) raised a raw RuntimeError."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, groups=2)).double()
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    model[1] = nn.utils.weight_norm(model[1])
    x = torch.randn(2, 3, 9, 8, dtype=F64)
    converted = convert_model(model)
    assert all(isinstance(m, ConvAttention2d) for m in converted)
    torch.testing.assert_close(converted(x), model(x), **EXACT)
    assert hasattr(model[0], "weight_orig")  # the original is left as it was


@pytest.mark.parametrize("alpha", [True, "8", float("nan")])
def test_alpha_that_is_not_a_number_is_refused(alpha):
    """alpha=True was taken as alpha=1 (a bool is an int in Python)."""
    with pytest.raises(TypeError, match="alpha must be None \\(hard\\) or a finite number"):
        conv_to_attention(nn.Conv2d(3, 4, 3), alpha=alpha)
