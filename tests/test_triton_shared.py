"""The Triton axis kernel (layers/kernels/triton_axis.py) on inputs the batch or the heads share,
read at stride 0: the paper models' values (value="identity", every head attends over the raw
input X) and one query set for the batch. The kernel reads the one copy (cast once to q's dtype,
not once per head) and the backward sums its gradient over the sharing axes in float32 before
rounding. Through Triton's interpreter where no GPU is (conftest)."""

from __future__ import annotations

import pytest
import torch

from attnconv.layers.kernels import triton_axis
from attnconv.layers.kernels.fused import axis_attention_reference
from attnconv.layers.kernels.triton_axis import axis_attention_triton
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from test_triton_axis import layer_errors  # the layer test's own measure

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_axis.INSTALLED or (DEVICE == "cpu" and not triton_axis.interpreted()),
    reason="needs triton (pip install triton) and a GPU or TRITON_INTERPRET=1",
)


def _spy(monkeypatch) -> list[tuple]:
    """The tensors each call hands the kernel's autograd function."""
    seen, real = [], triton_axis._TritonAxis.apply

    def apply(*args):
        seen.append(tuple(a for a in args if isinstance(a, torch.Tensor)))
        return real(*args)

    monkeypatch.setattr(triton_axis._TritonAxis, "apply", apply)
    return seen


@pytest.mark.parametrize("p", [0.0, pytest.param(0.3, marks=pytest.mark.slow)])
def test_queries_shared_by_the_batch_and_values_by_the_heads_equal_the_equations(monkeypatch, p):
    """float64: q, k of one image expanded over a batch of 3, v of one head over 4 heads; the
    values and every gradient equal the plain equations', and the kernel is given each shared
    tensor once."""
    seen = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    b, nh, h, w, dk, dv = 3, 4, 5, 7, 8, 6
    t = h * w
    q, k = (torch.randn(1, nh, t, dk, dtype=torch.float64, generator=gen) for _ in "qk")
    v = torch.randn(b, 1, t, dv, dtype=torch.float64, generator=gen)
    qa = torch.randn(b, nh, t, h + w, dtype=torch.float64, generator=gen) * 3
    xs = [x.to(DEVICE).requires_grad_() for x in (q, k, v, qa)]

    def run(f):
        q, k, v, qa = xs
        q, k = q.expand(b, -1, -1, -1), k.expand(b, -1, -1, -1)
        return f(q, k, v.expand(-1, nh, -1, -1), qa, h, w, 0.37, p, True, seed=3)

    y, ref = run(axis_attention_triton), run(axis_attention_reference)
    ((q_in, k_in, v_in, qa_in),) = seen
    assert q_in.shape[0] == k_in.shape[0] == 1 and v_in.shape[1] == 1 and qa_in.shape[:2] == (b, nh)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen).to(y.device)
    for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


def test_values_the_heads_share_are_cast_once(monkeypatch):
    """float32 values shared by 4 heads, bfloat16 q and k (as autocast hands them over): the
    kernel is given one bfloat16 copy, (B, 1, T, dv), not one a head."""
    seen = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    b, nh, h, w = 2, 4, 3, 5
    q, k = (torch.randn(b, nh, h * w, 8, generator=gen).bfloat16() for _ in "qk")
    v = torch.randn(b, 1, h * w, 16, generator=gen).expand(b, nh, -1, -1)
    qa = torch.randn(1, nh, h * w, h + w, generator=gen)
    axis_attention_triton(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), qa.to(DEVICE), h, w, 0.3)
    ((_, _, v_in, qa_in),) = seen
    assert v_in.shape == (b, 1, h * w, 16) and v_in.dtype == torch.bfloat16
    assert v_in.untyped_storage().nbytes() == b * h * w * 16 * 2
    assert qa_in.shape[0] == 1  # the quadratic's logits: one copy for the batch


def test_a_shared_gradient_is_summed_before_it_is_rounded():
    """bfloat16 values shared by 8 heads on a 1 x 2 image with equal logits (P = 1/2, so each
    head's dV, (dY_1 + dY_2) / 2, is exact in float32 and not a bfloat16): the values'
    gradient is the heads' sum rounded once to bfloat16, as the float64 sum rounds. Rounding
    each head's gradient to bfloat16 first and summing after (autograd's sum over an expanded
    input) leaves elements an ulp or more off."""
    gen = torch.Generator().manual_seed(4)
    b, nh, dv = 2, 8, 16
    q = k = torch.zeros(b, nh, 2, 8, dtype=torch.bfloat16, device=DEVICE)
    v = torch.randn(b, 1, 2, dv, generator=gen).bfloat16().to(DEVICE).requires_grad_()
    qa = torch.zeros(1, nh, 2, 3, device=DEVICE)
    y = axis_attention_triton(q, k, v.expand(-1, nh, -1, -1), qa, 1, 2, 0.3)  # (B, T, Nh, dv)
    dy = torch.randn(y.shape, generator=gen).bfloat16().to(DEVICE)
    (got,) = torch.autograd.grad(y, [v], dy)
    exact = dy.double().sum((1, 2)) / 2  # (B, dv): every key's, the same
    assert torch.equal(got, exact[:, None, None].expand(b, 1, 2, dv).bfloat16())


@pytest.mark.parametrize("value", ["linear", "identity"])
def test_layer_shares_values_as_tight_as_plain_under_bf16_autocast(monkeypatch, value):
    """The layer under bfloat16 autocast, backend="triton", its values projected per head or
    the raw input every head reads (the paper models'): within 2x of the plain path's
    (backend="reference" under the same autocast) distance to float64, output and gradients; the
    identity values reach the kernel as one copy."""
    seen = _spy(monkeypatch)
    torch.manual_seed(3)
    kw = dict(num_heads=3, positional="relative_learned", value=value, max_size=8)
    if value == "linear":
        kw["head_dim"] = 8
    lay = MultiHeadSelfAttention2d(16, 16, **kw).to(DEVICE)
    exact_lay = MultiHeadSelfAttention2d(16, 16, backend="reference", **kw).double().to(DEVICE)
    x = torch.randn(2, 16, 5, 7, device=DEVICE)
    errs = layer_errors(lay, exact_lay, x, torch.linalg.norm)
    assert len(seen) == 1
    if value == "identity":
        assert seen[0][2].shape[1] == 1
    for got, plain in zip(errs["triton"], errs["reference"]):
        assert got <= 2 * plain + 1e-6, (errs["triton"], errs["reference"])


def test_batch_and_heads_that_neither_broadcast_nor_match_are_one_line():
    """q of 2 images against v of 3: a ValueError naming the shapes, before any launch."""
    q = k = torch.zeros(2, 2, 6, 8, device=DEVICE)
    v, qa = torch.zeros(3, 2, 6, 8, device=DEVICE), torch.zeros(1, 2, 6, 5, device=DEVICE)
    with pytest.raises(ValueError, match="batch and heads must be 1 or alike"):
        axis_attention_triton(q, k, v, qa, 2, 3, 0.3)


def test_a_gradient_is_returned_only_where_an_input_asks_for_one(monkeypatch):
    """q, k without requires_grad: the backward hands autograd None for them (no batch sum
    of a gradient nobody reads), and v's is the plain equations'."""
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 2, 6, 8, dtype=torch.float64, generator=gen) for _ in "qk")
    v = torch.randn(3, 1, 6, 4, dtype=torch.float64, generator=gen)
    qa = torch.randn(1, 2, 6, 5, dtype=torch.float64, generator=gen)
    q, k, qa, v = (x.to(DEVICE) for x in (q, k, qa, v))
    v.requires_grad_()
    calls = []
    real = triton_axis.shared_sum
    monkeypatch.setattr(triton_axis, "shared_sum", lambda g, x: calls.append(x.shape) or real(g, x))
    args = (q.expand(3, -1, -1, -1), k.expand(3, -1, -1, -1), v.expand(-1, 2, -1, -1), qa)
    (got,) = torch.autograd.grad(axis_attention_triton(*args, 2, 3, 0.3).sum(), [v])
    (want,) = torch.autograd.grad(axis_attention_reference(*args, 2, 3, 0.3).sum(), [v])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert calls == [v.shape]


def test_an_input_not_4d_is_one_line():
    q = torch.zeros(2, 6, 8, device=DEVICE)  # heads missing
    qa = torch.zeros(1, 2, 6, 5, device=DEVICE)
    with pytest.raises(ValueError, match="must be 4-D"):
        axis_attention_triton(q, q, q, qa, 2, 3, 0.3)
