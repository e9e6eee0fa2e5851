"""Precision of content attention against a float64 dense reference (issue 17).

The fast quadratic + content path must be as exact as the plain dense path (SDPA + float bias):
its output and gradient errors against float64, in float32 and under bfloat16 autocast, at most
2x the dense path's error measured in the same test, at 32^2 and 64^2 and alpha up to 1e4.
The rank-3 coordinate fold it replaced had logits that were differences of large products and
failed this (its error grew with image size and alpha).
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.encodings.base import pixel_coords
from attnconv.layers.encodings.gaussian import shifted_axis
from attnconv.layers.functional import scaled_dot_product_attention
from attnconv.layers.kernels.content import folded_qkv
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.precision import hi


def _layers(hw_alpha: float, heads: int, seed: int = 0):
    torch.manual_seed(seed)
    fast = MultiHeadSelfAttention2d(16, 16, heads, positional="quadratic", content=True)
    with torch.no_grad():
        fast.positional_encoding.set_alpha(hw_alpha)
        fast.positional_encoding.centers.uniform_(-4.0, 4.0)  # off-centre heads, fractional
    plain = copy.deepcopy(fast)
    plain.backend = "reference"
    return fast, plain


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


def _forward_backward(layer, x, g, autocast=False):
    """Output and the gradients of <y, g> w.r.t. input, centres, spread and Wq."""
    x = x.clone().requires_grad_()
    enc = layer.positional_encoding
    params = [enc.centers, enc.spread, layer.query_proj.weight]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    grads = torch.autograd.grad((y.to(g.dtype) * g).sum(), [x, *params])
    return y, grads


SIZES = [(32, 4), pytest.param(64, 1, marks=pytest.mark.slow)]  # 64^2: 3-5 s a case
ALPHAS = [0.5, 10.0, 1e4]


@pytest.mark.parametrize("hw,heads", SIZES)
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("autocast", [False, True])
def test_quadratic_content_output_is_as_exact_as_dense(hw, heads, alpha, autocast):
    """fp32 and bf16-autocast outputs within 2x of the dense path's error against float64, for
    both kernels of the fast path: the exact fold (training: gradients on) and the shared-bias
    kernel (inference: no gradients)."""
    fast, plain = _layers(alpha, heads, seed=hw)
    x = torch.randn(1, 16, hw, hw)
    with torch.no_grad():
        y64 = copy.deepcopy(plain).double()(x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        e_fold = _rel(fast(x).detach(), y64)  # parameters require grad: the fold
        with torch.no_grad():
            e_shared, e_plain = _rel(fast(x), y64), _rel(plain(x), y64)
    assert e_plain < (2e-2 if autocast else 1e-5), e_plain
    assert e_fold <= 2 * e_plain and e_shared <= 2 * e_plain, (e_fold, e_shared, e_plain)


@given(n=st.integers(1, 12), heads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_shifted_axis_is_the_logits_less_their_row_maximum(n, heads, seed):
    """positional.shifted_axis == -alpha (d - c)^2 less each query's maximum over the keys."""
    torch.manual_seed(seed)
    alpha = torch.rand(heads, dtype=torch.float64) * 20
    c = (torch.rand(heads, dtype=torch.float64) - 0.5) * 4 * n
    r = torch.arange(n, dtype=torch.float64)
    plain = -alpha[:, None, None] * (r[None, None, :] - r[None, :, None] - c[:, None, None]) ** 2
    want = plain - plain.amax(-1, keepdim=True)
    torch.testing.assert_close(shifted_axis(alpha, c, n), want, rtol=1e-12, atol=1e-9)


def _abs(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref).abs().max().item()


GRAD_CASES = [(32, 4, alpha, autocast) for alpha in ALPHAS for autocast in (False, True)]
# 64^2 costs 5 s a case: the former spurious gradient
GRAD_CASES += [pytest.param(64, 1, 1e4, False, marks=pytest.mark.slow)]


@pytest.mark.parametrize("hw,heads,alpha,autocast", GRAD_CASES)
def test_quadratic_content_gradients_against_float64(hw, heads, alpha, autocast):
    """Gradients of the fold (fused SDPA) within 2x of the dense path's error against float64.
    The fold's row/column logits are shifted so that each query's maximum is 0, written without
    cancellation (positional.shifted_axis): unshifted, they measured 3-21x the dense error at
    alpha 10 (fp32), and at alpha 1e4 a spurious centre gradient (0.2 at 64^2, float64: 0)."""
    fast, plain = _layers(alpha, heads, seed=hw)
    x, g = torch.randn(1, 16, hw, hw), torch.randn(1, 16, hw, hw)
    _, g64 = _forward_backward(copy.deepcopy(plain).double(), x.double(), g.double())
    _, gf = _forward_backward(fast, x, g, autocast)
    _, gp = _forward_backward(plain, x, g, autocast)
    dense_tol = 2e-2 if autocast else 1e-4
    for name, a, p, r in zip(["x", "centers", "spread", "Wq"], gf, gp, g64):
        if alpha >= 1e4 and name != "x":
            # one-hot heads: the float64 gradients underflow (< 1e-30). Centres and spreads get
            # none (their gradient vanishes on the nearest offset); the content gradient gets
            # the fused backward's own rounding, dS = P (dP - rowsum(dO * O)) with O rounded
            # (dense: P one-hot, exact 0): float32 eps x the gradients' scale (dL/dx's, like
            # dL/dWq's at alpha 0.5-10), measured 1e-6 (fp32), 1e-7 (bf16) at |dL/dx| ~ 3
            # the blocked training kernel clamps logits at -60 before exp (no subnormals): a
            # neighbour keeps weight exp(-60) ~ 1e-26, centres/spreads a gradient measured
            # <= 2e-15 (the unshifted fold's spurious one was 0.2)
            assert r.abs().max() < 1e-30, (name, r.abs().max())
            atol = 2e-6 * gf[0].abs().max().item() if name == "Wq" else 1e-12
            assert _abs(a, r) <= atol, (name, _abs(a, r), atol)
            continue
        e_a, e_p = _rel(a, r), _rel(p, r)
        # the centres'/spreads' gradients are a few scalars, each a sum of T^2 cancelling terms:
        # both paths' errors on them scatter with the seed (fp32: 1e-7 to 2e-6; bf16: 2e-3 to
        # 5e-2, up to 0.5 for the dense path at 64^2), within conditioning x eps: at 64^2, alpha
        # 0.5, one seed's spread gradient 0.53 is a sum of terms of |.| 600 (bound 7e-5): fold
        # 9e-6, dense 1.3e-6
        few = name in ("centers", "spread")
        floor = 2e-6 if few and not autocast else 0.0
        assert few or e_p < dense_tol, (name, e_p)
        assert e_a <= 2 * max(e_p, floor), (name, e_a, e_p)


def _bias_rows(layer, q: torch.Tensor, rows: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The dense positional logits (1|B, Nh, n, T) of the query pixels ``rows`` only: quadratic
    eq. 9 -alpha ||delta - Delta||^2, or learned relative sec. 4.3 q . r_delta / sqrt(dk)."""
    enc, t = layer.positional_encoding, torch.arange(h * w)
    if enc.name == "quadratic":
        p = pixel_coords(h, w, dtype=hi(enc.alpha).dtype)  # (T, 2)
        diff = p[None, None] - p[None, rows, None] - hi(enc.centers)[:, None, None]  # (Nh,n,T,2)
        return (-hi(enc.alpha)[:, None, None] * diff.pow(2).sum(-1))[None]
    d1 = (t // w)[None, :] - (rows // w)[:, None] + h - 1  # (n, T) table rows of delta
    d2 = (t % w)[None, :] - (rows % w)[:, None] + w - 1
    r_row, r_col = enc.tables(h, w)
    qs, dr = q[:, :, rows], r_row.shape[1]
    bias = torch.einsum("bhqd,qkd->bhqk", qs[..., :dr], r_row[d1].to(q.dtype))
    return (bias + torch.einsum("bhqd,qkd->bhqk", qs[..., dr:], r_col[d2].to(q.dtype))) * enc.scale


def _attend_rows(layer, x, rows: torch.Tensor, fold: bool, autocast: bool) -> torch.Tensor:
    """Head outputs (B, Nh, n, Dv) of the query pixels ``rows`` against every key: the fold the
    layer runs in training, and in inference above 64^2 (``folded_qkv`` + fused SDPA, float32
    under autocast for large_logits, as the fold kernel), or the dense equations (SDPA
    reference with a float bias)."""
    _, _, h, w = x.shape
    term = layer.positional_encoding.term(h, w, content=layer.content)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        q, k, v = layer.project(x)
        if fold:
            q_aug, k_aug, v = folded_qkv(q, k, v, term, layer.scale)
            large = term.large_logits
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and not large):
                return scaled_dot_product_attention(q_aug[:, :, rows], k_aug, v, scale=1.0)
        return scaled_dot_product_attention(
            q[:, :, rows],
            k,
            v,
            bias=_bias_rows(layer, q, rows, h, w),
            scale=layer.scale,
            backend="reference",
        )


def _rows_grads(layer, x, rows, g, fold: bool, autocast: bool = False) -> list[torch.Tensor]:
    enc = layer.positional_encoding
    tabs = [enc.centers, enc.spread] if enc.name == "quadratic" else [*enc.tables.parameters()]
    x = x.clone().requires_grad_()
    y = _attend_rows(layer, x, rows, fold, autocast)
    loss = (y.to(g.dtype) * g).sum()
    return [y, *torch.autograd.grad(loss, [x, layer.query_proj.weight, *tabs])]


@pytest.mark.slow
@pytest.mark.parametrize("positional", ["quadratic", "relative_learned"])
@pytest.mark.parametrize("autocast", [False, True])
def test_content_attention_at_224_against_float64_rows(positional, autocast):
    """224^2 (50176 tokens; the dense (T, T) float64 reference would be 2.5e9 entries): 64
    sampled query pixels against every key, exactly. Output and gradients (input, Wq, the
    encoding's parameters) of the fold within 2x of the dense equations' error vs float64."""
    hw = 224
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(8, 8, 1, positional=positional, content=True, max_size=hw)
    if positional == "quadratic":
        with torch.no_grad():
            layer.positional_encoding.set_alpha(10.0)
            layer.positional_encoding.centers.uniform_(-4.0, 4.0)
    x, rows = torch.randn(1, 8, hw, hw), torch.randperm(hw * hw)[:64]
    g = torch.randn(1, 1, 64, 8)
    ref = _rows_grads(copy.deepcopy(layer).double(), x.double(), rows, g.double(), fold=False)
    fold = _rows_grads(layer, x, rows, g, True, autocast)
    dense = _rows_grads(layer, x, rows, g, False, autocast)
    names = ["y", "x", "Wq", "table0", "table1"]
    for name, a, p, r in zip(names, fold, dense, ref):
        e_a, e_p = _rel(a, r), _rel(p, r)
        floor = 2e-6 if positional == "quadratic" and name.startswith("table") else 0.0
        assert e_p < (5e-2 if autocast else 5e-5), (name, e_p)
        assert e_a <= 2 * max(e_p, floor), (name, e_a, e_p)


@given(
    b=st.integers(1, 2),
    heads=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_inference_shared_bias_kernel_equals_reference(b, heads, h, w, seed):
    """Inference (no gradient) takes the fused kernel with one shared (1, Nh, T, T) bias built
    from the row/column logits; it equals the dense reference (float64)."""
    torch.manual_seed(seed)
    fast = MultiHeadSelfAttention2d(5, 6, heads, positional="quadratic", content=True).double()
    with torch.no_grad():
        fast.positional_encoding.centers.uniform_(-3, 3)
    plain = copy.deepcopy(fast)
    plain.backend = "reference"
    x = torch.randn(b, 5, h, w, dtype=torch.float64)
    with torch.no_grad():
        assert fast.kernel(x, 0.0) == "shared_bias"
        torch.testing.assert_close(fast(x), plain(x), rtol=1e-9, atol=1e-11)
    assert fast.kernel(x, 0.0) != "shared_bias"  # grads: the fold


@pytest.mark.parametrize("positional", ["relative_learned", "quadratic"])
@pytest.mark.parametrize("backend", [None, "blocked", "fused"])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_backward_inside_autocast_as_exact_as_after_it(positional, backend, p):
    """``loss.backward()`` inside the autocast region (common in user code; on CPU the backward
    runs on the caller's thread, autocast on) runs and is as exact against float64 as a
    backward after the region. The blocked kernels' float32 products were cast to bfloat16
    there and raised a dtype error. key_proj.bias is left out: its true gradient is 0 (a
    key bias shifts every logit of a query alike). Not the fold: it is PyTorch's own ops, whose
    backward inside autocast follows PyTorch's rules (there with dropout, the positional
    gradients measured 3-4x less exact than after the region)."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(
        16, 16, 2, positional=positional, content=True, backend=backend, dropout=p, max_size=16
    )
    x = torch.randn(2, 16, 16, 16)

    def grads(module, inp, autocast, inside):
        module.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # one dropout mask for every run
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = (module(inp).double() ** 2).mean()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        return {n: q.grad.double() for n, q in module.named_parameters() if n != "key_proj.bias"}

    ref = grads(copy.deepcopy(layer).double(), x.double(), False, False)
    after, inside = (grads(layer, x, True, ins) for ins in (False, True))
    for name, want in ref.items():
        err_after = ((after[name] - want).abs().max() / want.abs().max()).item()
        err_inside = ((inside[name] - want).abs().max() / want.abs().max()).item()
        assert err_inside <= 2 * err_after + 1e-6, (name, err_inside, err_after)


@pytest.mark.parametrize("hw", [16, 32])
@pytest.mark.parametrize("autocast", [False, True])
def test_learned_content_inference_is_as_exact_as_dense(hw, autocast):
    """Inference of the learned relative content layer (the plan's fused kernel from 16x16, the
    blocked one where the extension is not built): fp32 and bf16-autocast outputs within 2x of
    the dense path's error against float64."""
    torch.manual_seed(hw)
    fast = MultiHeadSelfAttention2d(
        16, 16, 4, positional="relative_learned", content=True, max_size=hw
    ).eval()
    with torch.no_grad():
        for table in fast.positional_encoding.tables.parameters():
            table.normal_(0.0, 1.0)  # logits of a trained layer's size, not init's near-zero
    plain = copy.deepcopy(fast)
    plain.backend = "reference"
    x = torch.randn(2, 16, hw, hw)
    with torch.inference_mode():
        y64 = copy.deepcopy(plain).double()(x.double())
        assert fast.kernel(x) in ("fused", "blocked")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            e_fast, e_plain = _rel(fast(x), y64), _rel(plain(x), y64)
    assert e_plain < (2e-2 if autocast else 1e-5), e_plain
    assert e_fast <= 2 * e_plain, (e_fast, e_plain)
