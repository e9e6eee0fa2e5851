"""Hidden dropout with the counter-hash mask (layers/dropout.py): the fused CPU kernel against the
plain equations at random shapes, dtypes and counter offsets (values and gradients, bit for bit),
gradcheck in float64, the mask's law (the dropped share and pairs of neighbours), float32 and
bfloat16 against float64, and the paper model's training forward on either path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.dropout import HashDropout, hash_dropout, hash_dropout_reference
from attnconv.layers.functional import dropped_elements
from attnconv.layers.kernels import fused
from attnconv.models import create_model

needs_fused = pytest.mark.skipif(not fused.available(), reason="the fused kernel did not build")
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _h32(x: int) -> int:  # kernels/hash.h's mixer in Python integers
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & m
    x ^= x >> 15
    x = (x * 0x735A2D97) & m
    return x ^ (x >> 15)


def test_the_mask_is_the_documented_hash_of_each_counter():
    """Element i dropped iff h32(h32(n mod 2^32 ^ seed) ^ n >> 32) < p 2^32, n = offset + i,
    written out in Python integers, across the 2^32 boundary."""
    seed, p, offset = 987654321, 0.3, 2**32 - 40
    want = [
        _h32(_h32(((offset + i) & 0xFFFFFFFF) ^ seed) ^ ((offset + i) >> 32)) < int(p * 2**32)
        for i in range(80)
    ]
    assert dropped_elements(80, p, "cpu", seed, offset).tolist() == want


@needs_fused
@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    dtype=st.sampled_from(DTYPES),
    p=st.sampled_from([0.1, 0.5, 0.9, 0.0001]),
    seed=st.integers(0, 2**32 - 1),
    offset=st.sampled_from([0, 17, 2**32 - 50, 2**33 + 3]),
)
def test_fused_equals_the_plain_equations(shape, dtype, p, seed, offset):
    """Values and input gradients bit for bit (both round x / (1 - p) once from the opmath type);
    the gradient of the plain path is autograd's."""
    x = torch.randn(shape, dtype=torch.float64).to(dtype)
    xf, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = hash_dropout(xf, p, seed=seed, offset=offset)
    y_ref = hash_dropout_reference(xr, p, seed, offset)
    assert torch.equal(y, y_ref)
    g = torch.randn(shape, dtype=torch.float64).to(dtype)
    y.backward(g)
    y_ref.backward(g)
    assert torch.equal(xf.grad, xr.grad)


@needs_fused
def test_large_tensors_split_over_threads_equal_the_plain_equations():
    """Several parallel tasks (grain 2^15) on two threads: the same mask as one plain pass."""
    x = torch.randn(3, 70_001)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        y = hash_dropout(x, 0.1, seed=5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(y, hash_dropout_reference(x, 0.1, 5))


def test_non_finite_inputs_follow_nn_dropout():
    """A dropped inf or nan gives nan (x * 0), as nn.Dropout; kept ones scale."""
    x = torch.tensor([float("inf"), float("nan"), -float("inf"), 2.0] * 64)
    dropped = dropped_elements(x.numel(), 0.5, "cpu", 11)
    for y in (hash_dropout(x, 0.5, seed=11), hash_dropout_reference(x, 0.5, 11)):
        assert torch.isnan(y[dropped & ~torch.isfinite(x)]).all()
        kept = ~dropped
        torch.testing.assert_close(y[kept], x[kept] * 2.0, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("path", ["fused", "plain"])
def test_gradcheck_float64(path):
    if path == "fused" and not fused.available():
        pytest.skip("the fused kernel did not build")
    if path == "fused":
        fn = hash_dropout
    else:
        fn = lambda x, p, seed: hash_dropout_reference(x, p, seed)  # noqa: E731
    x = torch.randn(4, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fn(t, 0.4, seed=3), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fn(t, 0.4, seed=3), (x,))


@pytest.mark.parametrize("dtype, rel", [(torch.float32, 2.0**-23), (torch.bfloat16, 2.0**-8)])
def test_low_precision_against_float64(dtype, rel):
    """The same mask; the kept values within the plain path's two roundings of the float64
    result (1 / (1 - p) to float32, the product to the dtype): 2^-24 + 2^-24 in float32,
    2^-24 + 2^-9 in bfloat16."""
    x64 = torch.randn(5000, dtype=torch.float64).to(dtype).double()
    y64 = hash_dropout(x64, 0.1, seed=42)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        y = hash_dropout(x64.to(dtype), 0.1, seed=42)
    assert y.dtype == dtype
    assert torch.equal(y == 0, y64 == 0)
    assert ((y.double() - y64).abs() <= rel * y64.abs()).all()


def test_the_mask_has_nn_dropouts_law():
    """Dropped share within 5 standard deviations of p; neighbours (i, i+1) and (i, i+T) dropped
    together at rate p^2, as independent draws; two seeds give different masks."""
    n = 1 << 20
    for p in (0.1, 0.5):
        d = dropped_elements(n, p, "cpu", 1234)
        assert abs(d.float().mean().item() - p) < 5 * (p * (1 - p) / n) ** 0.5
        for lag in (1, 256):
            both = (d[:-lag] & d[lag:]).double().mean().item()
            sd = (p * p * (1 - p * p) / (n - lag)) ** 0.5
            assert abs(both - p * p) < 6 * sd, (p, lag, both)
    a, b = dropped_elements(n, 0.5, "cpu", 1), dropped_elements(n, 0.5, "cpu", 2)
    assert abs((a == b).float().mean().item() - 0.5) < 0.01


def test_module_is_a_drop_in_dropout():
    m = HashDropout(0.1)
    assert isinstance(m, torch.nn.Dropout) and m.state_dict() == {}
    x = torch.randn(8, 16)
    assert torch.equal(m.eval()(x), x)
    assert torch.equal(HashDropout(0.0).train()(x), x)
    torch.manual_seed(0)
    y = m.train()(x)
    torch.manual_seed(0)
    assert torch.equal(m(x), y)  # the seed comes from the default generator
    assert not torch.equal(m(x), y)  # and the next call draws another


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"p": 1.0}, r"\[0, 1\)"),
        ({"p": -0.1}, r"\[0, 1\)"),
        ({"p": 0.1, "inplace": True}, "in place"),
    ],
)
def test_bad_arguments_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        HashDropout(**kw)


@needs_fused
def test_paper_model_trains_the_same_on_either_path(monkeypatch):
    """sa_quadratic in training mode (hidden dropout 0.1): the fused and the plain path give the
    same logits and gradients under one seed."""
    torch.manual_seed(0)
    model = create_model(
        "sa_quadratic", num_classes=10, hidden_size=16, num_layers=2, num_heads=4, ff_size=32
    ).train()
    x = torch.randn(2, 3, 32, 32)

    def run():
        torch.manual_seed(1)
        model.zero_grad()
        y = model(x)
        y.square().sum().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y1, g1 = run()
    monkeypatch.setattr(fused, "available", lambda: False)
    y2, g2 = run()
    assert torch.equal(y1, y2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_module_runs_torchs_dropout_on_cuda():
    """Off the CPU the module is nn.Dropout: its share of zeros is p, the rest scaled."""
    x = torch.ones(1 << 20, device="cuda")
    y = HashDropout(0.1).train()(x)
    assert abs((y == 0).float().mean().item() - 0.1) < 0.003
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
