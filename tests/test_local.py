"""LocalSelfAttention2d (SASA): fast path == unfold reference, centred windows, border masking."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.kernels import fused
from attnconv.layers.kernels.window import (
    _LocalAttention,
    local_attention,
    local_to_dense,
    window_pad,
    window_valid,
)
from attnconv.layers.local import LocalSelfAttention2d

MODES = [
    ("relative", "qk+qr"),
    ("relative", "qr"),
    ("absolute", "qk+qr"),
    ("absolute", "qr"),
    ("none", "qk"),
]


def _run(m, x, backend):
    m.backend = backend
    y, attn = m(x, return_attention=True)
    grads = torch.autograd.grad((y * torch.cos(y)).sum(), [x, *m.parameters()])
    return y, attn, grads


@given(
    b=st.integers(1, 2),
    cin=st.integers(1, 5),
    heads=st.sampled_from([1, 2]),
    dh=st.sampled_from([4, 8]),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    k=st.integers(3, 11),
    stride=st.sampled_from([1, 2]),
    mode=st.sampled_from(MODES),
    padding=st.sampled_from(["mask", "zeros"]),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference(b, cin, heads, dh, h, w, k, stride, mode, padding, seed):
    torch.manual_seed(seed)
    h, w = max(h, stride), max(w, stride)
    pos, logits = mode
    m = LocalSelfAttention2d(cin, heads * dh, heads, k, stride, pos, logits, padding).double()
    x = torch.randn(b, cin, h, w, dtype=torch.float64, requires_grad=True)
    y1, a1, g1 = _run(m, x, None)
    y2, a2, g2 = _run(m, x, "reference")
    assert y1.shape == (b, heads * dh, -(-h // stride), -(-w // stride))
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(a1, a2)
    for u, v in zip(g1, g2):
        torch.testing.assert_close(u, v)


@pytest.mark.parametrize("mode", MODES)
def test_float32_close_to_reference(mode, device):
    """Values and gradients on every device (on CUDA the window runs through FlexAttention)."""
    torch.manual_seed(0)
    m = LocalSelfAttention2d(16, 32, 4, 7, 1, *mode).to(device)
    x = torch.randn(2, 16, 12, 10, device=device, requires_grad=True)
    out = {}
    for backend in (None, "reference"):  # no return_attention: it would leave the Flex path
        m.backend = backend
        y = m(x)
        out[backend] = y, torch.autograd.grad((y * torch.cos(y)).sum(), [x, *m.parameters()])
    (y1, g1), (y2, g2) = out[None], out["reference"]
    torch.testing.assert_close(y1, y2, atol=1e-5, rtol=1e-5)
    for u, v in zip(g1, g2):
        torch.testing.assert_close(u, v, atol=1e-4, rtol=1e-4)


def test_bfloat16_computes_in_float32():
    torch.manual_seed(0)
    m = LocalSelfAttention2d(8, 16, 2, 5)
    x = torch.randn(2, 8, 9, 7)
    y = m(x)
    mb = m.to(torch.bfloat16)
    yb = mb(x.to(torch.bfloat16))
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.float(), y, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("ks", [3, 4])
@pytest.mark.parametrize("masked", [True, False])
def test_gradcheck_fused_kernel(ks, masked):
    """The fused autograd function: every input (q, keys, values, mixture, relative logits)."""
    torch.manual_seed(0)
    opts = dict(dtype=torch.float64, requires_grad=True)
    h, w = 3, 4
    q = torch.randn(1, 2, 2, h, w, **opts)
    kp = torch.randn(1, 2, 2, h + ks - 1, w + ks - 1, **opts)
    vp = torch.randn(1, 2, 2, 2, h + ks - 1, w + ks - 1, **opts)  # M = 2 value maps
    mix = torch.randn(ks * ks, 2, **opts)
    qr_row = torch.randn(1, 2, ks, h, w, **opts)
    qr_col = torch.randn(1, 2, ks, h, w, **opts)
    valid = window_valid(ks, h, w) if masked else None

    def f(*a):
        return _LocalAttention.apply(*a, valid, ks)[0]

    assert torch.autograd.gradcheck(f, (q, kp, vp, mix, qr_row, qr_col), fast_mode=True)
    v1 = vp[:, :, :1].detach().clone().requires_grad_()  # plain values, position-only logits
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: f(a, None, b, None, c, d), (q, v1, qr_row, qr_col)
    )


@pytest.mark.parametrize("padding", ["mask", "zeros"])
def test_gradcheck_layer(padding):
    torch.manual_seed(0)
    m = LocalSelfAttention2d(3, 8, 2, 3, 2, padding=padding).double()
    x = torch.randn(1, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,), fast_mode=True)


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("padding", ["mask", "zeros"])
def test_window_is_centred_one_nonzero_value(k, padding):
    """Uniform attention (W_Q = 0) and one non-zero value pixel at (a, b): output (i, j) is
    non-zero exactly when |i - a| <= c and |j - b| <= c, and equals 1 / (#keys in the window)."""
    h, w, a, b = 9, 11, 2, 7
    m = LocalSelfAttention2d(1, 2, 1, k, positional="none", padding=padding).double()
    with torch.no_grad():
        m.query.weight.zero_()
        m.value.weight.fill_(1.0)
    x = torch.zeros(1, 1, h, w, dtype=torch.float64)
    x[0, 0, a, b] = 1.0
    c = (k - 1) // 2
    ii, jj = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    inside = ((ii - a).abs() <= c) & ((jj - b).abs() <= c)
    nrow = (ii + c).clamp(max=h - 1) - (ii - c).clamp(min=0) + 1
    ncol = (jj + c).clamp(max=w - 1) - (jj - c).clamp(min=0) + 1
    count = nrow * ncol if padding == "mask" else torch.full_like(nrow, k * k)
    expected = torch.where(inside, 1.0 / count.double(), torch.zeros(h, w, dtype=torch.float64))
    for backend in (None, "reference"):
        m.backend = backend
        y = m(x)[0, 0]
        torch.testing.assert_close(y, expected)


def test_window_is_centred_one_nonzero_key():
    """One key pixel with a large logit: the queries that put most mass on it are exactly the
    centred k x k square around it, and they put it at offset (a - i, b - j)."""
    k, h, w, a, b = 5, 8, 9, 3, 6
    q = torch.ones(1, 1, 1, h, w, dtype=torch.float64)
    key = torch.zeros(1, 1, 1, h, w, dtype=torch.float64)
    key[..., a, b] = 20.0
    v = torch.randn(1, 1, 2, h, w, dtype=torch.float64)
    for backend in ("window", "reference"):
        _, maps = local_attention(q, key, v, kernel_size=k, backend=backend, return_attention=True)
        dense = local_to_dense(maps, h, w, k)[0, 0]  # (T, T)
        col = dense[:, a * w + b].reshape(h, w)
        ii, jj = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        inside = ((ii - a).abs() <= 2) & ((jj - b).abs() <= 2)
        assert torch.equal(col > 0.99, inside)
        assert torch.all(col[~inside] == 0)
        i, j = 1, 4  # (a - i, b - j) = (2, 2): the last offset of the window
        assert maps[0, 0, i * w + j].argmax().item() == k * k - 1


def test_border_masking():
    torch.manual_seed(0)
    k, h, w = 7, 6, 6
    m = LocalSelfAttention2d(4, 8, 2, k)
    x = torch.randn(2, 4, h, w)
    _, maps = m(x, return_attention=True)  # (B, nh, T, k^2)
    valid = window_valid(k, h, w).reshape(k * k, h * w).t()  # (T, k^2)
    assert torch.all(maps[..., ~valid] == 0)
    assert torch.all(maps[..., valid] > 0)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, h * w))
    assert valid[0].sum() == 16  # corner query: a 4 x 4 part of the window is inside
    m.padding = "zeros"  # padded zero keys take part in the softmax
    _, maps_z = m(x, return_attention=True)
    assert torch.all(maps_z[..., ~valid] > 0)
    torch.testing.assert_close(maps_z.sum(-1), torch.ones(2, 2, h * w))


def test_local_to_dense_rows_sum_to_one():
    torch.manual_seed(0)
    m = LocalSelfAttention2d(3, 8, 2, 5)
    _, maps = m(torch.randn(1, 3, 7, 6), return_attention=True)
    dense = local_to_dense(maps, 7, 6, 5)
    assert dense.shape == (1, 2, 42, 42)
    torch.testing.assert_close(dense.sum(-1), torch.ones(1, 2, 42))


def test_parameter_count_independent_of_k():
    def count(k, **kw):
        return sum(p.numel() for p in LocalSelfAttention2d(64, 64, 8, k, **kw).parameters())

    assert count(3, positional="none") == count(11, positional="none") == 3 * 64 * 64
    # relative: only the k x d_h/2 row and column tables grow with k
    assert count(11) - count(3) == 2 * (11 - 3) * 4
    assert count(7, logits="qr") == 2 * 64 * 64 + 2 * 7 * 4  # no W_K


def test_even_kernel_window():
    assert window_pad(4) == (1, 2)
    assert window_pad(7) == (3, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(positional="rel"), "positional"),
        (dict(logits="qq"), "logits"),
        (dict(positional="none", logits="qk+qr"), "needs a positional"),
        (dict(positional="relative", logits="qk"), "has no positional term"),  # it added q^T r
        (dict(positional="absolute", logits="qk"), "has no positional term"),
        (dict(padding="reflect"), "padding"),
        (dict(backend="cuda"), "backend"),
        (dict(num_heads=3), "divisible"),
        (dict(kernel_size=0), "kernel_size"),
    ],
)
def test_bad_options(kwargs, match):
    args = dict(in_channels=4, out_channels=8, num_heads=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        LocalSelfAttention2d(**args)


def test_bad_input_shape():
    m = LocalSelfAttention2d(4, 8, 2, 3, stride=2)
    with pytest.raises(ValueError, match=r"expected input \(B, 4, H, W\)"):
        m(torch.randn(1, 3, 5, 5))
    assert m(torch.randn(1, 4, 3, 5)).shape == (1, 8, 2, 3)  # ceil(H / s), like a strided conv
    with pytest.raises(ValueError, match="smaller than the stride"):
        m(torch.randn(1, 4, 1, 5))


def test_positional_vocabulary_is_typed_once():
    """SASA's names map to one SasaPositional each at construction; the layer's forward reads
    its fields (tables, absolute keys), never the name."""
    from attnconv.layers.local import SASA_POSITIONALS, SasaPositional

    assert SASA_POSITIONALS == ("relative", "absolute", "none")
    rel, ab, none = (
        LocalSelfAttention2d(4, 8, 2, 3, positional=p).encoding for p in SASA_POSITIONALS
    )
    assert rel == SasaPositional.from_name("relative") and rel.tables and not rel.absolute_keys
    assert ab.absolute_keys and not ab.tables and not none.encodes
    with pytest.raises(ValueError, match="an even head dim, got 3"):
        LocalSelfAttention2d(4, 6, 2, 3, positional="relative")
    with pytest.raises(ValueError, match="head dim divisible by 4, got 2"):
        LocalSelfAttention2d(4, 4, 2, 3, positional="absolute")


def test_kernel_table_and_backend_override():
    """One table picks the local kernel: reference for backend="reference", Flex on CUDA with
    masked borders and no returned maps, the C++ window kernel on CPU where it built, else the
    window function; ``backend`` overrides the default."""
    m = LocalSelfAttention2d(4, 8, 2, 3)
    assert m.backend is None
    cpu = "fused" if fused.available() else "window"
    assert m.kernel("cpu") == cpu and m.kernel("cuda") == "flex"
    assert m.kernel("cpu", return_attention=True) == cpu
    assert m.kernel("cuda", return_attention=True) == "window"
    m.backend = "flex"
    assert m.kernel("cpu") == "flex"
    m.padding = "zeros"
    assert m.kernel("cpu") == "window"
    m.padding, m.backend = "mask", "window"
    assert m.kernel("cuda") == "window"
    m.backend = "reference"
    assert m.backend == "reference" and m.kernel("cuda") == "reference"
    m.backend = None
    assert m.kernel("cuda") == "flex"
    with pytest.raises(TypeError, match="LocalSelfAttention2d: impl= is gone"):
        m.impl = "auto"
    with pytest.raises(ValueError, match="backend must be None or one of"):
        LocalSelfAttention2d(4, 8, 2, 3, backend="fold")
