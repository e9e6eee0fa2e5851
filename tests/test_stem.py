"""AttentionStem2d: spatially-aware values (SASA eq. 4-5), fast == reference == brute force."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.local import LocalSelfAttention2d, window_pad
from attnconv.layers.stem import AttentionStem2d


def _run(m, x, backend):
    m.backend = backend
    y, attn = m(x, return_attention=True)
    grads = torch.autograd.grad((y * torch.sin(y)).sum(), [x, *m.parameters()])
    return y, attn, grads


@given(
    b=st.integers(1, 2),
    heads=st.sampled_from([1, 2]),
    dh=st.integers(1, 4),
    h=st.integers(2, 8),
    w=st.integers(2, 8),
    k=st.integers(2, 6),
    mixtures=st.integers(1, 4),
    pool=st.sampled_from([1, 2]),
    padding=st.sampled_from(["mask", "zeros"]),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference(b, heads, dh, h, w, k, mixtures, pool, padding, seed):
    torch.manual_seed(seed)
    m = AttentionStem2d(3, heads * dh, heads, k, mixtures, pool, padding=padding).double()
    x = torch.randn(b, 3, h, w, dtype=torch.float64, requires_grad=True)
    y1, a1, g1 = _run(m, x, None)
    y2, a2, g2 = _run(m, x, "reference")
    assert y1.shape == (b, heads * dh, h // pool, w // pool)
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(a1, a2)
    for u, v in zip(g1, g2):
        torch.testing.assert_close(u, v)


def test_brute_force_equation():
    """Eq. 4-5 with explicit loops over pixels and window positions (mask borders)."""
    torch.manual_seed(0)
    k, nm, h, w = 3, 2, 4, 5
    m = AttentionStem2d(2, 4, 2, k, nm, pool=1, norm=False).double()
    x = torch.randn(1, 2, h, w, dtype=torch.float64)
    y = m(x)[0]
    wq, wk = m.query.weight[:, :, 0, 0], m.key.weight[:, :, 0, 0]
    wv = m.value.weight[:, :, 0, 0].view(2, nm, 2, 2)  # (head, m, dh, C_in)
    p = m.mixture_weights().view(k, k, nm)
    before, _ = window_pad(k)
    expect = torch.zeros(4, h, w, dtype=torch.float64)
    for n in range(2):
        for i in range(h):
            for j in range(w):
                q = wq[2 * n : 2 * n + 2] @ x[0, :, i, j] * m.scale
                logits, vals = [], []
                for di in range(k):
                    for dj in range(k):
                        a, b = i + di - before, j + dj - before
                        if not (0 <= a < h and 0 <= b < w):
                            continue
                        logits.append(q @ (wk[2 * n : 2 * n + 2] @ x[0, :, a, b]))
                        wv_ab = sum(p[di, dj, mm] * wv[n, mm] for mm in range(nm))
                        vals.append(wv_ab @ x[0, :, a, b])  # v_ab = (sum_m p W_V^m) x_ab
                att = torch.softmax(torch.stack(logits), 0)
                expect[2 * n : 2 * n + 2, i, j] = (att[:, None] * torch.stack(vals)).sum(0)
    torch.testing.assert_close(y, torch.relu(expect))


def test_one_mixture_is_plain_content_attention():
    torch.manual_seed(0)
    stem = AttentionStem2d(3, 8, 2, 5, mixtures=1, pool=1, norm=False)
    layer = LocalSelfAttention2d(3, 8, 2, 5, positional="none")
    layer.load_state_dict(
        {
            "query.weight": stem.query.weight,
            "key.weight": stem.key.weight,
            "value.weight": stem.value.weight,
        }
    )
    x = torch.randn(2, 3, 9, 7)
    torch.testing.assert_close(stem(x), torch.relu(layer(x)))


def test_mixture_weights_and_gradcheck():
    torch.manual_seed(0)
    m = AttentionStem2d(3, 4, 2, 4, 3, pool=2, norm=False).double()
    p = m.mixture_weights()
    assert p.shape == (16, 3)
    torch.testing.assert_close(p.sum(-1), torch.ones(16, dtype=torch.float64))
    x = torch.randn(1, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,), fast_mode=True)


def test_imagenet_shape_and_bad_input():
    m = AttentionStem2d(3, 64)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 64, 8, 8)
    with pytest.raises(ValueError, match=r"expected input \(B, 3, H, W\)"):
        m(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match="smaller than the stem pooling"):
        m(torch.randn(1, 3, 2, 32))
    with pytest.raises(ValueError, match="divisible"):
        AttentionStem2d(3, 64, num_heads=5)
