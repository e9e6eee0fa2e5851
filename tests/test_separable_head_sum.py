"""The separable head sum of the paper models' position-only layers (kernels/shared_position.py):
sum_h P_h x_h W_h^T + b with P_h = R_h (x) C_h, one head at a time, against its plain composition
(values, gradients, gradcheck, precision within 2x under bf16 autocast), its image blocks, and the
GPU plan's path trained as the CPU's."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnconv
from attnconv.layers import mhsa2d
from attnconv.layers.kernels import shared_position
from attnconv.layers.kernels.shared_position import (
    head_sum_linear,
    position_attention,
    separable_head_sum,
)
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from same_step import assert_same_training_step
from test_shared_position import F64, _operators, _step


@settings(max_examples=25, deadline=None)
@given(
    nh=st.integers(1, 4),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    b=st.integers(1, 4),
    d=st.integers(1, 4),
    dout=st.integers(1, 5),
    per_head=st.booleans(),
    bias=st.booleans(),
    block_images=st.sampled_from([1, 2, None]),
    seed=st.integers(0, 2**16),
)
def test_separable_head_sum_equals_its_plain_composition(
    nh, h, w, b, d, dout, per_head, bias, block_images, seed
):
    """One image block and one head at a time (no dropout) = position_attention then
    head_sum_linear: values and the gradients of R, C, the values, Wout and b (float64, random
    shapes; blocks of 1 or 2 images, or the whole batch in one)."""
    block = (block_images or b) * h * w * d * 8
    with patch.multiple(shared_position, BLOCK_BYTES=block, BLOCK_MAX_THREADS=1 << 10):
        _check_head_sum(nh, h, w, b, d, dout, per_head, bias, seed)


def _check_head_sum(nh, h, w, b, d, dout, per_head, bias, seed):
    torch.manual_seed(seed)
    r, c = _operators(nh, h, w)
    x = torch.randn(nh if per_head else 1, h, w, b, d, dtype=F64, requires_grad=True)
    weight = torch.randn(dout, nh * d, dtype=F64, requires_grad=True)
    bb = torch.randn(dout, dtype=F64, requires_grad=True) if bias else None
    inputs = [t for t in (r, c, x, weight, bb) if t is not None]
    fast = separable_head_sum(r, c, x, weight, bb)
    heads = position_attention(r, c, x).reshape(nh, h * w * b, d)
    plain = head_sum_linear(heads, weight, bb)
    torch.testing.assert_close(fast, plain)
    g = torch.randn_like(plain)
    for a, e in zip(torch.autograd.grad(fast, inputs, g), torch.autograd.grad(plain, inputs, g)):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("one_image_blocks", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
def test_separable_head_sum_gradcheck(per_head, one_image_blocks):
    """gradcheck in float64, the batch of 2 in one block or in two (BLOCK_BYTES 1)."""
    block = 1 if one_image_blocks else shared_position.BLOCK_BYTES
    torch.manual_seed(0)
    r, c = _operators(2, 3, 4)
    x = torch.randn(2 if per_head else 1, 3, 4, 2, 3, dtype=F64, requires_grad=True)
    weight = torch.randn(5, 6, dtype=F64, requires_grad=True)
    bias = torch.randn(5, dtype=F64, requires_grad=True)
    with patch.multiple(shared_position, BLOCK_BYTES=block, BLOCK_MAX_THREADS=1 << 10):
        assert torch.autograd.gradcheck(separable_head_sum, (r, c, x, weight, bias))
        assert torch.autograd.gradcheck(lambda *a: separable_head_sum(*a, None), (r, c, x, weight))


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize(
    "positional, alpha", [("quadratic", 0.5), ("quadratic", 20.0), ("relative_learned", None)]
)
@pytest.mark.parametrize("one_image_blocks", [False, True])
def test_no_dropout_precision_within_twice_the_composition(
    positional, alpha, bf16, one_image_blocks, monkeypatch
):
    """Attention dropout off (the one-head-at-a-time path): output, input and parameter
    gradients against float64 within 2x of the error of the composition it replaces
    (position_attention then head_sum_linear), in float32 and under bf16 autocast; the batch
    of 4 in one image block, or in four."""
    if one_image_blocks:
        monkeypatch.setattr(shared_position, "BLOCK_BYTES", 1)
        monkeypatch.setattr(shared_position, "BLOCK_MAX_THREADS", 1 << 10)
    torch.manual_seed(0)
    opts = {"init_alpha": alpha} if alpha else {}
    kw = dict(positional=positional, content=False, dropout=0.0, head_dim=8, **opts)
    fast = MultiHeadSelfAttention2d(32, 32, 9, **kw).train()
    truth = MultiHeadSelfAttention2d(32, 32, 9, backend="reference", **kw).double().train()
    truth.load_state_dict(fast.state_dict())
    x, g = torch.randn(16, 16, 4, 32), torch.randn(16, 16, 4, 32)

    def run(m, tokens, dtype):
        return _step(m, tokens, dtype, x, g, bf16, params=True)

    def composition(r, c, v, weight, bias):
        y = position_attention(r, c, v).reshape(r.shape[0], -1, v.shape[-1])
        return head_sum_linear(y, weight, bias)

    exact, got = run(truth, False, F64), run(fast, True, torch.float32)
    monkeypatch.setattr(shared_position, "separable_head_sum", composition)
    ref = run(fast, True, torch.float32)
    for a, e, t in zip(got, ref, exact):
        scale = t.abs().max().clamp_min(1e-30)
        err_fast = ((a - t).abs().max() / scale).item()
        err_ref = ((e - t).abs().max() / scale).item()
        assert err_fast <= 2 * err_ref + 1e-7, (err_fast, err_ref)


def test_separable_head_sum_double_backward_is_our_one_line_error():
    from attnconv.layers.first_order import HigherOrderGradError

    torch.manual_seed(0)
    r, c = _operators(2, 3, 4)
    x = torch.randn(1, 3, 4, 2, 3, dtype=F64, requires_grad=True)
    weight = torch.randn(5, 6, dtype=F64, requires_grad=True)
    y = separable_head_sum(r, c, x, weight, None)
    with pytest.raises(HigherOrderGradError, match=r"backend='reference'"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


@settings(max_examples=30, deadline=None)
@given(
    h=st.integers(1, 8),
    w=st.integers(1, 8),
    b=st.integers(1, 9),
    d=st.integers(1, 8),
    block=st.integers(1, 4096),
    threads=st.integers(1, 3),
)
def test_image_blocks_partition_the_batch(h, w, b, d, block, threads):
    """Consecutive ranges covering [0, B), each within BLOCK_BYTES unless a single image; one
    range (the batch) above BLOCK_MAX_THREADS threads."""
    x = torch.empty(1, h, w, b, d)
    with (
        patch.multiple(shared_position, BLOCK_BYTES=block, BLOCK_MAX_THREADS=2),
        patch.object(torch, "get_num_threads", lambda: threads),
    ):
        ranges = shared_position.image_blocks(x)
    assert [i0 for i0, _ in ranges] == [0] + [i1 for _, i1 in ranges[:-1]]
    assert ranges[-1][1] == b and all(i1 > i0 for i0, i1 in ranges)
    if threads > 2:
        assert ranges == [(0, b)]
    for i0, i1 in ranges[:-1]:
        assert i1 - i0 == 1 or (i1 - i0) * h * w * d * 4 <= block


def test_image_blocks_off_a_cpu_is_the_whole_batch():
    """A GPU runs the batch whole: the blocks are a CPU cache tiling, and on a GPU each block
    is Nh more kernel launches (grid_long's model trained at 2 steps/s on an H200 with them)."""
    x = torch.empty(1, 16, 16, 64, 64, device="meta")
    with patch.object(torch, "get_num_threads", lambda: 1):
        assert shared_position.image_blocks(x) == [(0, 64)]
        assert len(shared_position.image_blocks(torch.empty(1, 16, 16, 64, 64))) > 1


_LAYER_CASE = mhsa2d.plan.layer_case


def _on_cuda_plan(layer, x, term, p_drop, device=None, tokens=False):
    """plan.layer_case as on a GPU, for tensors on this CPU: the kernel a CUDA device gets."""
    return _LAYER_CASE(layer, x, term, p_drop, "cuda", tokens)


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned"])
def test_paper_position_only_model_on_a_gpu_plan_trains_as_on_a_cpu(name):
    """The plan a GPU follows (position-only attention: "shared", a few batched launches, not
    the CPU's per-head loop "separable") gives the CPU path's training step: the whole
    sa_quadratic (dense Gaussian logits) or sa_learned (its tables' row and column softmaxes)
    model in training mode, its output and the gradients of the input and of every parameter,
    float64."""
    kw = dict(hidden_size=16, num_layers=2, num_heads=4, ff_size=16, downsample=2)
    torch.manual_seed(0)
    model = attnconv.create_model(name, **kw).double().train()
    layer = next(m for m in model.modules() if isinstance(m, MultiHeadSelfAttention2d))
    assert layer.kernel(torch.randn(1, 16, 16, 16, dtype=F64), 0.0) == "separable"
    assert layer.kernel(torch.randn(1, 16, 16, 16, dtype=F64), 0.0, "cuda") == "shared"

    def on_gpu_plan(x):
        with patch.object(mhsa2d.plan, "layer_case", _on_cuda_plan):
            return model(x)

    assert_same_training_step(
        [(model, model), (model, on_gpu_plan)], torch.randn(3, 3, 32, 32, dtype=F64), seed=7
    )


@pytest.mark.parametrize(
    "positional, alpha, bf16",
    [
        ("quadratic", 0.5, False),
        ("quadratic", 0.5, True),
        ("quadratic", 20.0, False),
        ("quadratic", 20.0, True),
        ("relative_learned", None, False),
        ("relative_learned", None, True),
    ],
)
def test_gpu_plan_precision_within_1_5x_the_plain_path(positional, alpha, bf16, monkeypatch):
    """Attention dropout off, the kernel a GPU takes ("shared"): output, input and parameter
    gradients against float64 within 1.5x of the plain dense path's error, in float32 and under
    bf16 autocast. The error is the RMS relative to each tensor's RMS, pooled over five draws of
    weights and inputs: one draw's max error on a 9-element gradient (the spreads') is a noisy
    statistic (a ratio of 2.4 on one draw where the pooled one is 1.2)."""
    monkeypatch.setattr(mhsa2d.plan, "layer_case", _on_cuda_plan)
    sq_fast, sq_ref = {}, {}
    for seed in range(5):
        torch.manual_seed(seed)
        opts = {"init_alpha": alpha} if alpha else {}
        kw = dict(positional=positional, content=False, dropout=0.0, head_dim=8, **opts)
        fast = MultiHeadSelfAttention2d(32, 32, 9, **kw).train()
        plain = MultiHeadSelfAttention2d(32, 32, 9, backend="reference", **kw).train()
        plain.load_state_dict(fast.state_dict())
        truth = MultiHeadSelfAttention2d(32, 32, 9, backend="reference", **kw).double().train()
        truth.load_state_dict(fast.state_dict())
        assert fast.kernel(torch.randn(1, 32, 16, 16)) == "shared"
        x, g = torch.randn(16, 16, 4, 32), torch.randn(16, 16, 4, 32)
        exact = _step(truth, False, F64, x, g, bf16, params=True)
        got = _step(fast, False, torch.float32, x, g, bf16, params=True)
        ref = _step(plain, False, torch.float32, x, g, bf16, params=True)
        for i, (a, e, t) in enumerate(zip(got, ref, exact)):
            scale = t.pow(2).mean().sqrt().clamp_min(1e-30)
            sq_fast[i] = sq_fast.get(i, 0.0) + ((a - t) / scale).pow(2).mean().item()
            sq_ref[i] = sq_ref.get(i, 0.0) + ((e - t) / scale).pow(2).mean().item()
    for i in sq_fast:  # output, input gradient, then each parameter's
        err_fast, err_ref = sq_fast[i] ** 0.5, sq_ref[i] ** 0.5
        assert err_fast <= 1.5 * err_ref, (i, err_fast, err_ref)
