"""The shared attention kernel: fused path == plain equation (values and gradients)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.functional import attention_probs, scaled_dot_product_attention


@given(
    b=st.integers(1, 3),
    nh=st.integers(1, 4),
    tq=st.integers(1, 17),
    tk=st.integers(1, 17),
    dk=st.integers(1, 9),
    dv=st.integers(1, 9),
    causal=st.booleans(),
    use_mask=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference(b, nh, tq, tk, dk, dv, causal, use_mask, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, nh, tq, dk, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, nh, tk, dk, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, nh, tk, dv, generator=g, dtype=torch.float64, requires_grad=True)
    mask = None
    if use_mask:
        mask = torch.rand(b, 1, 1, tk, generator=g) > 0.3
        mask[..., 0] = True  # every row keeps at least one key
    if causal and tk < tq:
        causal = False  # a causal row with no key is undefined; covered by reference tests
    outs = []
    for backend in ("sdpa", "reference"):
        y = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, backend=backend)
        gq, gk, gv = torch.autograd.grad((y * y.detach().cos()).sum(), (q, k, v))
        outs.append((y, gq, gk, gv))
    for a, r in zip(*outs):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)


def test_probs_rows_sum_to_one_and_causal_zeros():
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    p = attention_probs(q, k, causal=True)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3, 5))
    assert torch.all(p.triu(1) == 0)


def test_gradcheck_reference():
    q = torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 2, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, bias: scaled_dot_product_attention(q, k, v, bias=bias, backend="reference"),
        (q, k, v, bias),
    )


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="4-D"):
        scaled_dot_product_attention(torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(ValueError, match="backend"):
        scaled_dot_product_attention(
            torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), backend="x"
        )
    with pytest.raises(TypeError, match="impl= is gone, .* backend='reference'"):
        scaled_dot_product_attention(
            torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), impl="auto"
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "backend, dk, dv", [("flash", 44, 44), ("flash", 30, 17), ("efficient", 300, 300)]
)
def test_on_a_gpu_odd_head_widths_still_take_a_fused_kernel(backend, dk, dv):
    """On CUDA the heads are padded to a common width, a multiple of 8: FlashAttention takes
    widths to 256 (44 = 16 + 14 + 14: the fold's widened heads at 14x14 tokens), and past 256
    only the memory-efficient kernel runs, on 16-bit widths a multiple of 8 (300 padded to a
    multiple of 4 stays 300: the math kernel, (B, nh, Tq, Tk) in memory, would have run). With
    only that backend allowed the call runs and equals the plain equations."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    bf16 = torch.bfloat16
    q, k = (torch.randn(2, 3, 40, dk, device="cuda", generator=g, dtype=bf16) for _ in "qk")
    v = torch.randn(2, 3, 40, dv, device="cuda", generator=g, dtype=bf16)
    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    with sdpa_kernel(which[backend]):
        y = scaled_dot_product_attention(q, k, v)
    ref = scaled_dot_product_attention(q.float(), k.float(), v.float(), backend="reference")
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
