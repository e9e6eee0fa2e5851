"""Fuzzing MultiHeadAttention, conv_to_attention and scaled_dot_product_attention with hypothesis
(the rules: test_fuzz.py's docstring)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from attnconv.convert import conv_to_attention
from attnconv.layers.functional import scaled_dot_product_attention
from attnconv.layers.mha import MultiHeadAttention
from fuzz_helpers import (
    BAD_SIZE,
    F64,
    MODES,
    assert_fast_equals_reference,
    attempt,
    check_layer,
    expect_error,
    fuzz,
    perturb,
    perturb_input,
)

# ---------------------------------------------------------------------------- MultiHeadAttention

MHA_BAD = {
    "embed_dim": [*BAD_SIZE, 3],
    "num_heads": [*BAD_SIZE, 3],
    "kdim": [0, -1, 2.0],
    "vdim": [0, -1, "3"],
    "dropout": [-0.5, 1.0],
    "backend": ["fast"],
}
MHA_FAULTS = ["dtype", "mask", "mask_dtype", "batch", "rank", "length", "list"]


@fuzz(60)
@given(data=st.data())
def test_mha(data):
    """MultiHeadAttention: self/cross attention, causal, key padding, huge head counts."""
    d = data.draw
    heads = d(st.sampled_from([1, 2, 4, 32]))
    cfg = dict(
        embed_dim=heads * d(st.integers(1, 2)),
        num_heads=heads,
        kdim=d(st.one_of(st.none(), st.integers(1, 3))),
        vdim=d(st.one_of(st.none(), st.integers(1, 3))),
    )
    kw, bad = d(perturb(cfg, MHA_BAD))
    seed = d(st.integers(0, 2**16))
    b, tq, tk = d(st.integers(1, 2)), d(st.integers(1, 5)), d(st.integers(1, 5))
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1)))
    kdim = cfg["kdim"] or cfg["embed_dim"]
    vdim = cfg["vdim"] or kdim
    query = torch.randn(b, tq, cfg["embed_dim"], generator=gen, dtype=F64)
    key = torch.randn(b, tk, kdim, generator=gen, dtype=F64)
    value = torch.randn(b, tk, vdim, generator=gen, dtype=F64)
    mask = torch.rand(b, tk, generator=gen) < 0.4 if d(st.booleans()) else None  # rows may be
    causal = d(st.booleans())  # fully padded: zeros, not NaN
    fault = d(st.sampled_from([None] * 7 + MHA_FAULTS))
    if fault == "dtype":
        query = query.float()
    elif fault == "mask":
        mask = torch.zeros(b, tk + 1, dtype=torch.bool)
    elif fault == "mask_dtype":
        mask = torch.zeros(b, tk)
    elif fault == "batch":
        key = key[:1].expand(b + 1, -1, -1)
    elif fault == "rank":
        query = query[0]
    elif fault == "length":
        value = value[:, :-1] if tk > 1 else value.repeat(1, 2, 1)
    elif fault == "list":
        query = query.tolist()

    def build():
        torch.manual_seed(seed)
        return _MHA(MultiHeadAttention(**kw).double(), key, value, mask, causal)

    check_layer(build, query, bad, fault)


class _MHA(nn.Module):
    """MultiHeadAttention with fixed key, value, mask and causal flag: query -> output."""

    def __init__(self, mha: MultiHeadAttention, key, value, mask, causal):
        super().__init__()
        self.mha, self.key, self.value, self.mask, self.causal = mha, key, value, mask, causal

    @property
    def backend(self):
        return self.mha.backend

    @backend.setter
    def backend(self, backend):
        self.mha.backend = backend

    def forward(self, query):
        return self.mha(query, self.key, self.value, key_padding_mask=self.mask, causal=self.causal)


# ------------------------------------------------------------------------ convert.conv_to_attention


@pytest.mark.filterwarnings("ignore:conv_to_attention. head_dim")  # rank-limited: expected
@fuzz(60)
@given(data=st.data())
def test_conv_to_attention(data):
    """Any Conv1d/Conv2d (1x1 kernels, 1xW and Hx1 images, images smaller than the kernel) with
    any alpha/head_dim: the converted module equals the conv, its fast shift path equals the
    layer's reference path, or a clear error."""
    d = data.draw
    ndim = d(st.sampled_from([1, 2]))
    groups = d(st.sampled_from([1, 2]))
    cin, cout = groups * d(st.integers(1, 2)), groups * d(st.integers(1, 2))
    cls = nn.Conv2d if ndim == 2 else nn.Conv1d
    conv = cls(
        cin,
        cout,
        tuple(d(st.integers(1, 3)) for _ in range(ndim)),
        stride=d(st.integers(1, 2)),
        padding=d(st.integers(0, 2)),
        dilation=d(st.integers(1, 2)),
        groups=groups,
        bias=d(st.booleans()),
        padding_mode=d(st.sampled_from(MODES)),
    ).double()
    cfg = dict(alpha=None, head_dim=None)
    if d(st.booleans()):
        cfg["alpha"] = d(st.sampled_from([1e4, 1e6]))
    if d(st.booleans()):
        cfg["head_dim"] = d(st.sampled_from([1, cin * 9]))  # rank-limited or exact
    kw, bad = d(
        perturb(
            cfg,
            {
                "alpha": [0.0, -1.0, float("inf"), float("nan"), "1"],
                "head_dim": [0, -2, 1.5, "1"],
                "backend": ["fast"],
            },
        )
    )
    target = conv
    if d(st.integers(0, 9)) == 0:
        target, bad = d(st.sampled_from([nn.Linear(2, 2), "conv", nn.Conv3d(1, 1, 1)])), "target"
    m, err = attempt(lambda: conv_to_attention(target, **kw), "build")
    if bad is None:
        assert err is None, err
    if m is None:
        return
    sizes = []
    for k, dil, pad in zip(conv.kernel_size, conv.dilation, conv.padding):
        need = max(1, dil * (k - 1) + 1 - 2 * pad, pad + 1)  # the conv's smallest input
        small = d(st.integers(0, 5)) == 0  # sometimes smaller than the kernel allows
        sizes.append(d(st.integers(1, 2)) if small else need + d(st.integers(0, 3)))
    x = torch.randn(d(st.integers(1, 2)), cin, *sizes, dtype=F64)
    x, bad_input = d(perturb_input(x))
    try:  # a perturbed input the conv itself takes (a batch of 0, an unbatched Conv1d's) is
        expected = conv(x)  # no bad input: its conversion must take it too
    except (RuntimeError, TypeError, ValueError, AttributeError):
        expected = None  # (PyTorch's own message: e.g. smaller than the (dilated) kernel)
    bad_input = None if expected is not None else bad_input
    y, err = attempt(lambda: m(x), "forward")
    if expected is not None:  # a valid input of the conv: the converted module must accept it
        assert err is None, err
    if err is not None:
        return
    assert bad_input is None, f"{bad_input} input accepted"
    assert expected is not None, "converted module accepted an image its conv refuses"
    if not expected.numel():  # an empty batch: an empty output of the conv's shape
        assert y.shape == expected.shape
        return
    scale = expected.abs().max().clamp_min(1.0)
    tol = 1e-9 if kw["alpha"] is None else 1e-5  # hard: exact; alpha >= 1e4: Lemma 2 converged
    if kw["head_dim"] in (None, cin * 9):  # head_dim >= rank: exact (Theorem 1)
        assert ((y - expected).abs().max() / scale).item() <= tol
    ref = copy.deepcopy(m)
    ref.attention.backend = "reference"
    assert_fast_equals_reference(m, ref, x)


# ------------------------------------------------- functional.scaled_dot_product_attention

SDPA_FAULTS = [
    "dtype",
    "int",
    "rank",
    "heads",
    "width",
    "length",
    "mask_dtype",
    "mask_shape",
    "bias_shape",
    "bias_int",
    "dropout",
    "backend",
    "list",
]


@fuzz(50)
@given(data=st.data())
def test_scaled_dot_product_attention(data):
    """The shared kernel: bias, boolean mask (rows may be fully masked), causal, dk != dv,
    broadcast batch/heads, dk = 0 (position-only); or one fault -> a clear error."""
    d = data.draw
    b, nh, tq, tk = (
        d(st.integers(1, 2)),
        d(st.sampled_from([1, 2, 16])),
        d(st.integers(1, 5)),
        d(st.integers(1, 5)),
    )
    dk, dv = d(st.integers(0, 4)), d(st.integers(1, 4))
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1)))

    def rnd(*shape, dtype=F64):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q, k, v = rnd(b, nh, tq, dk), rnd(d(st.sampled_from([1, b])), nh, tk, dk), rnd(b, nh, tk, dv)
    kw = dict(causal=d(st.booleans()), backend="sdpa")
    if d(st.booleans()):
        kw["bias"] = rnd(*d(st.sampled_from([(tq, tk), (1, nh, tq, tk), (b, 1, 1, tk)])))
    if d(st.booleans()):
        kw["mask"] = torch.rand(b, 1, tq, tk, generator=gen) < 0.6
    fault = d(st.sampled_from([None] * 13 + SDPA_FAULTS))
    if fault == "dtype":
        v = v.float()
    elif fault == "int":
        q = q.long()
    elif fault == "rank":
        q = q[0]
    elif fault == "heads":
        k = rnd(b, nh + 1, tk, dk)
    elif fault == "width":
        k = rnd(b, nh, tk, dk + 1)
    elif fault == "length":
        v = rnd(b, nh, tk + 1, dv)
    elif fault == "mask_dtype":
        kw["mask"] = torch.ones(tq, tk)
    elif fault == "mask_shape":
        kw["mask"] = torch.ones(tq + 1, tk, dtype=torch.bool)
    elif fault == "bias_shape":
        kw["bias"] = rnd(tq, tk + 2)
    elif fault == "bias_int":
        kw["bias"] = torch.zeros(tq, tk, dtype=torch.long)
    elif fault == "dropout":
        kw["dropout_p"] = d(st.sampled_from([-0.1, 1.0, 2.0]))
    elif fault == "backend":
        kw["backend"] = "flash"
    elif fault == "list":
        q = q.tolist()

    out, err = attempt(lambda: scaled_dot_product_attention(q, k, v, **kw), "call")
    if fault is None:
        assert err is None, err
    if err is not None:
        if fault != "backend":  # the plain path refuses the same arguments
            expect_error(
                lambda: scaled_dot_product_attention(q, k, v, **kw | {"backend": "reference"})
            )
        return
    ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    y = scaled_dot_product_attention(*ins, **kw)
    yr = scaled_dot_product_attention(*refs, **kw | {"backend": "reference"})
    torch.testing.assert_close(y, yr, rtol=1e-7, atol=1e-9)
    assert torch.isfinite(y).all()  # fully masked rows: zeros, not NaN
    g = torch.randn_like(yr)
    ga = torch.autograd.grad(y, ins, g, allow_unused=True)
    gr = torch.autograd.grad(yr, refs, g, allow_unused=True)
    for a, r, t in zip(ga, gr, ins):
        a, r = (torch.zeros_like(t) if x is None else x for x in (a, r))
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-8)
