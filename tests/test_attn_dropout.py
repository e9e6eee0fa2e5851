"""Attention dropout with one (Nh, T, T) mask shared by the batch (dropout_mask="batch", the
reference code's Gaussian layer): the fast shared path against the plain dense equations at random
shapes (values, input and parameter gradients), and gradcheck in float64 with the mask fixed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.kernels import fused
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from same_step import assert_same_training_step

POSITIONALS = ["quadratic", "relative_learned", "quadratic_generalized"]


def _pair(
    positional: str,
    c: int,
    nh: int,
    value: str,
    p: float,
    content: bool = False,
    mask: str = "batch",
):
    """The layer's default path and its plain reference, float64, training, the same weights."""
    kw = dict(positional=positional, content=content, dropout=p, dropout_mask=mask, value=value)
    fast = MultiHeadSelfAttention2d(c, c, nh, **kw).double().train()
    ref = MultiHeadSelfAttention2d(c, c, nh, backend="reference", **kw).double().train()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


@settings(max_examples=12, deadline=None)
@given(
    positional=st.sampled_from(POSITIONALS),
    b=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    nh=st.integers(1, 3),
    value=st.sampled_from(["linear", "identity"]),
    p=st.sampled_from([0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_batch_mask_fast_equals_reference(positional, b, h, w, nh, value, p, seed):
    c = 2 * nh
    fast, ref = _pair(positional, c, nh, value, p)
    x = torch.randn(b, c, h, w, dtype=torch.float64, requires_grad=True)
    outs, grads = [], []
    for m in (fast, ref):
        torch.manual_seed(seed)  # the same mask for both paths
        y = m(x)
        params = [q for q in m.parameters() if q.requires_grad]
        g = torch.autograd.grad((y * y.detach().cos()).sum(), [x, *params])
        outs.append(y)
        grads.append(g)
    torch.testing.assert_close(outs[0], outs[1])
    for ga, gr in zip(*grads):
        torch.testing.assert_close(ga, gr)


@pytest.mark.parametrize("positional", POSITIONALS)
def test_batch_mask_gradcheck_float64(positional):
    """gradcheck of the fast shared path, input and positional parameters, mask fixed."""
    fast, _ = _pair(positional, 4, 2, "linear", 0.3)
    x = torch.randn(2, 4, 3, 4, dtype=torch.float64, requires_grad=True)
    names = [
        f"positional_encoding.{n}"
        for n, q in fast.positional_encoding.named_parameters()
        if q.requires_grad
    ]
    params = [fast.get_parameter(n).detach().clone().requires_grad_() for n in names]

    def f(inp, *ps):
        torch.manual_seed(3)  # the same mask at every evaluation
        return torch.func.functional_call(fast, dict(zip(names, ps)), (inp,))

    assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)


@settings(max_examples=10, deadline=None)
@given(
    positional=st.sampled_from(["quadratic", "relative_learned"]),
    b=st.integers(1, 3),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    nh=st.integers(1, 3),
    value=st.sampled_from(["linear", "identity"]),
    p=st.sampled_from([0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_content_dropout_kernel_equals_reference(positional, b, h, w, nh, value, p, seed):
    """Content attention in training on CPU (a mask per image): the fused C++ kernel (the plan's
    choice) and the dense dk-wide kernel (its fallback, forced by backend="blocked") remove the
    links the plain equations remove (functional.dropped_links), values and gradients."""
    c = 2 * nh
    fast, ref = _pair(positional, c, nh, value, p, content=True, mask="sample")
    x = torch.randn(b, c, h, w, dtype=torch.float64)
    kernels = [("dense_dropout", "blocked")] + ([("fused", None)] if fused.available() else [])
    for name, backend in kernels:
        fast.backend = backend
        assert fast.kernel(x, p) == name
        assert_same_training_step([(fast, fast), (ref, ref)], x, seed)


@settings(max_examples=8, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    nh=st.integers(1, 3),
    value=st.sampled_from(["linear", "identity"]),
    p=st.sampled_from([0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_generalized_content_dropout_equals_reference(b, h, w, nh, value, p, seed):
    """Generalized quadratic + content in training on CPU: the blocked Gaussian kernel removes
    the links the plain equations remove (functional.dropped_links), values and gradients."""
    c = 2 * nh
    fast, ref = _pair("quadratic_generalized", c, nh, value, p, content=True, mask="sample")
    x = torch.randn(b, c, h, w, dtype=torch.float64)
    assert fast.kernel(x, p) == "blocked_gaussian"
    assert_same_training_step([(fast, fast), (ref, ref)], x, seed)


def test_without_the_fused_kernel_the_plan_runs_dense_dropout():
    """ATTNCONV_NO_FUSED=1 (or no compiler): content training on CPU takes the dense kernel."""
    import os
    import subprocess
    import sys

    code = (
        "import torch; from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d as M; "
        "m = M(4, 4, 2, positional='relative_learned', dropout=0.1).train(); "
        "print(m.kernel(torch.randn(1, 4, 3, 3)))"
    )
    env = {**os.environ, "ATTNCONV_NO_FUSED": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "dense_dropout", out.stderr
