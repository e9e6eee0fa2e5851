"""The Triton kernel of SASA's window attention (layers/kernels/triton_local.py) against its plain
equations (window.local_attention(backend="reference"): unfolded keys, the plain softmax). Without
a GPU the kernel source runs through Triton's interpreter on CPU tensors (conftest sets
TRITON_INTERPRET=1): values and every gradient (q, k, v, the relative tables) in float64 at
random small shapes, windows of 3 to 7 and rows wider than a tile, gradcheck, float32 and
bfloat16 against float64 within 2x the plain path's error, the layer end to end, the
fallbacks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.kernels import plan, triton_axis, triton_local, triton_tiles
from attnconv.layers.kernels.triton_local import (
    local_attention_triton,
    window_attention_reference,
)
from attnconv.layers.kernels.window import local_attention
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_axis.INSTALLED or (DEVICE == "cpu" and not triton_axis.interpreted()),
    reason="needs triton (pip install triton) and a GPU or TRITON_INTERPRET=1",
)

SLOW = pytest.mark.slow  # the cases that take seconds through the interpreter (CI runs them)


def _inputs(b, nh, h, w, dk, dv, ks, dtype, keys=True, rel=True, gen=None):
    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, generator=gen).to(DEVICE).requires_grad_()

    q, v = rand(b, nh, dk, h, w), rand(b, nh, dv, h, w)
    k = rand(b, nh, dk, h, w) if keys else None
    rows, cols = (rand(ks, dk // 2), rand(ks, dk - dk // 2)) if rel else (None, None)
    return q, k, v, rows, cols


def _plain(q, k, v, ks, rows, cols):
    return local_attention(
        q, k, v, kernel_size=ks, rel_row=rows, rel_col=cols, padding="mask", backend="reference"
    )


def _leaves(*xs):
    return [x for x in xs if x is not None]


def _equal_in_float64(q, k, v, rows, cols, ks, block_m, gen):
    """The kernel's values and the gradients of every input equal the unfold kernel's."""
    y = local_attention_triton(q, k, v, ks, rows, cols, block_m=block_m)
    ref = _plain(q, k, v, ks, rows, cols)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen).to(DEVICE)
    xs = _leaves(q, k, v, rows, cols)
    for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.slow  # 20 drawn shapes through the interpreter: the quick run's longest
@settings(max_examples=20 if DEVICE == "cpu" else 4, deadline=None)
@given(
    b=st.integers(1, 2),
    nh=st.integers(1, 3),
    h=st.integers(1, 9),
    w=st.sampled_from([1, 2, 5, 8, 11, 20]),
    dk=st.sampled_from([2, 4, 8, 48]),
    dv=st.sampled_from([3, 8]),
    ks=st.sampled_from([3, 4, 5, 7, 9]),
    parts=st.sampled_from([(True, True), (True, False), (False, True)]),
    block_m=st.sampled_from([16, 64]),
    seed=st.integers(0, 999),
)
def test_triton_window_equals_plain_equations(b, nh, h, w, dk, dv, ks, parts, block_m, seed):
    """float64: values and the gradients of q, k, v and both relative tables; keys only, tables
    only, or both (SASA's qk+qr); even windows lean to +, as the plain kernel's."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, rows, cols = _inputs(b, nh, h, w, dk, dv, ks, torch.float64, *parts, gen=gen)
    _equal_in_float64(q, k, v, rows, cols, ks, block_m, gen)


TILED = [
    (24, 20, 7, 64),
    (17, 9, 9, 16),
    (3, 33, 5, 32),
    (12, 16, 3, 64),
    (7, 7, 7, 64),
    (2, 20, 3, 16),
]


def _shift(h, w, ks, block_m):  # the float64 launch's key grid (its tile: triton_tiles.FLOAT64)
    keys = triton_tiles.FLOAT64.keys
    return triton_tiles.window_shift(h, w, ks, block_m, keys, min(8, 1 << (w - 1).bit_length()))


def test_the_tiled_shapes_take_both_key_grids():
    """TILED runs the key grid from -(k-1)/2 and the one from 0 (window_shift's choice)."""
    assert {_shift(*c) == 0 for c in TILED} == {True, False}


def test_window_shift_walks_fewer_keys():
    """At SASA's 56x56 with k = 7 and 8 x 8 tiles of 64 keys, 2 x 2 key blocks a tile (256 keys a
    query, where the grid from 0 walks 3 x 3 inside the image); a 7x7 image in one block."""
    assert triton_tiles.window_shift(56, 56, 7, 64, 64, 8) == 3
    assert triton_tiles.walked_keys(56, 56, 7, 64, 64, 8, 3) == 256
    assert triton_tiles.walked_keys(56, 56, 7, 64, 64, 8, 0) > 256
    assert triton_tiles.window_shift(7, 7, 7, 64, 64, 8) == 0
    assert triton_tiles.walked_keys(7, 7, 7, 64, 64, 8, 0) == 64


# the three larger images: many query tiles through the interpreter
TILED_CASES = [pytest.param(*c, marks=SLOW) if c[0] * c[1] > 150 else c for c in TILED]


@pytest.mark.parametrize("h, w, ks, block_m", TILED_CASES)
def test_triton_window_tiles_cover_the_image(h, w, ks, block_m):
    """Images of several query tiles each way (8 columns wide, block_m // 8 rows), windows whose
    reach crosses key blocks on either key grid: float64 values and every gradient equal the
    unfold kernel's, so each (query, key of its window) pair is walked exactly once by every
    kernel and the row-logit gradient's per-column parts add up."""
    gen = torch.Generator().manual_seed(h * w + ks)
    q, k, v, rows, cols = _inputs(1, 2, h, w, 4, 3, ks, torch.float64, gen=gen)
    _equal_in_float64(q, k, v, rows, cols, ks, block_m, gen)


@pytest.mark.parametrize("h, w, ks, block_m", [TILED_CASES[0], TILED[2]])
def test_every_window_output_element_is_written(poisoned_empty, h, w, ks, block_m):
    """The outputs allocated empty (Y, the statistics, dQ, dK, dV) with that memory NaN
    beforehand: values and every gradient still equal the unfold kernel's (both key grids)."""
    gen = torch.Generator().manual_seed(h + w)
    q, k, v, rows, cols = _inputs(1, 2, h, w, 4, 3, ks, torch.float64, gen=gen)
    _equal_in_float64(q, k, v, rows, cols, ks, block_m, gen)


def test_triton_window_gradcheck_float64():
    q, k, v, rows, cols = _inputs(1, 2, 4, 5, 4, 3, 3, torch.float64)
    f = lambda *a: local_attention_triton(*a[:3], 3, *a[3:])  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, rows, cols), fast_mode=True)


def test_the_plain_equations_of_the_kernel_are_the_window_attention():
    """window_attention_reference (the window as axis logits, -inf off it, through the dense
    plain equations) equals the unfold kernel in float64: values and every gradient."""
    gen = torch.Generator().manual_seed(3)
    for ks, keys in ((3, True), (4, True), (7, False)):
        q, k, v, rows, cols = _inputs(2, 2, 5, 9, 6, 3, ks, torch.float64, keys, gen=gen)
        y = window_attention_reference(q, k, v, ks, rows, cols)
        ref = _plain(q, k, v, ks, rows, cols)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        xs = _leaves(q, k, v, rows, cols)
        g = torch.randn(y.shape, dtype=y.dtype, generator=gen).to(DEVICE)
        for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
            torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "b, nh, h, w, dk, dv, ks",
    [
        (2, 2, 6, 7, 8, 8, 3),
        pytest.param(1, 2, 9, 20, 16, 16, 7, marks=SLOW),
        (2, 3, 8, 8, 16, 8, 5),
        (1, 2, 1, 12, 8, 8, 3),  # one image row: every row-logit gradient an exact 0
        (2, 2, 1, 5, 8, 8, 3),
    ],
)
def test_triton_window_precision_as_tight_as_plain(dtype, b, nh, h, w, dk, dv, ks):
    """float32 inputs, or bfloat16 / float16 (as autocast hands them to the kernel): the
    kernel's distance to the float64 equations, values and every gradient, within 2x its plain
    equations' (window_attention_reference) in float32, or in that dtype's autocast; both from
    the same rounded q, k, v and output gradient (the error's norm over the tensor). On one
    image row the backward's delta from rowsum(dY o Y) put rel_row's gradient at 2.9x and 6.3x
    the plain path's error in float32; the dQ kernel's delta pass, rowsum(P o dP) / rowsum(P),
    cancels it."""
    errs = window_errors(dtype, b, nh, h, w, dk, dv, ks, torch.Generator().manual_seed(h * w))
    for got, plain in zip(errs["triton"], errs["plain"]):
        assert got <= 2 * plain, (errs["triton"], errs["plain"])


def window_errors(dtype, b, nh, h, w, dk, dv, ks, gen) -> dict[str, list[float]]:
    """The kernel's ("triton") and its plain equations' ("plain") distance to the float64
    equations, output then the gradients of q, k, v, rel_row, rel_col (the error's norm);
    benchmarks/triton_precision_sweep.py takes it over random cases."""
    xs = list(_inputs(b, nh, h, w, dk, dv, ks, torch.float64, gen=gen))
    low = dtype != torch.float32
    if low:  # both paths start from the same rounded q, k, v
        xs = [x.detach().to(dtype).double().requires_grad_() for x in xs[:3]] + xs[3:]
    exact = _plain(xs[0], xs[1], xs[2], ks, xs[3], xs[4])
    g = torch.randn(exact.shape, dtype=torch.float64, generator=gen).to(dtype).double()
    exact_g = torch.autograd.grad(exact, xs, g)
    errs = {}
    for name in ("triton", "plain"):
        x32 = [x.detach().float().requires_grad_() for x in xs]
        if name == "triton":  # the kernel's inputs as autocast gives them
            qkv = [x.to(dtype) for x in x32[:3]]
            y = local_attention_triton(*qkv, ks, x32[3], x32[4])
        else:
            with torch.autocast(DEVICE, dtype=dtype, enabled=low):
                y = window_attention_reference(x32[0], x32[1], x32[2], ks, x32[3], x32[4])
        grads = torch.autograd.grad(y, x32, g.to(y.dtype))
        errs[name] = [(y.double() - exact).norm().item()] + [
            (a.double() - e).norm().item() for a, e in zip(grads, exact_g)
        ]
    return errs


@pytest.mark.parametrize(
    "positional, logits", [("relative", "qk+qr"), ("absolute", "qk+qr"), ("relative", "qr")]
)
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.slow  # a whole layer through the interpreter; the compiled-layer test is quick
def test_layer_backend_triton_equals_reference(positional, logits, stride):
    torch.manual_seed(0)
    lay = LocalSelfAttention2d(6, 8, 2, 5, stride, positional, logits, backend="triton")
    lay = lay.double().to(DEVICE)
    assert lay.kernel(DEVICE) == "triton"
    x = torch.randn(2, 6, 7, 9, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = lay(x)
    g = torch.autograd.grad(y.square().sum(), [x, *lay.parameters()])
    lay.backend = "reference"
    y_ref = lay(x)
    g_ref = torch.autograd.grad(y_ref.square().sum(), [x, *lay.parameters()])
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


def test_the_table_takes_triton_only_where_it_can_run():
    lay = LocalSelfAttention2d(4, 4, 2, 3, backend="triton")
    assert lay.kernel("cuda") == "triton"
    assert lay.kernel("cuda", return_attention=True) != "triton"  # maps: the window function
    zeros = LocalSelfAttention2d(4, 4, 2, 3, padding="zeros", backend="triton")
    why = zeros.kernel("cuda", why=True).splitlines()
    assert why[1].startswith("passed over: triton (") and zeros.kernel("cuda") == "window"
    assert "triton" in plan.LOCAL_BACKENDS


@pytest.mark.parametrize("kind", [pytest.param("content", marks=SLOW), "window"])
def test_a_compiled_layer_runs_the_kernel_as_it_is(kind):
    """torch.compile around a layer on backend="triton": the kernel runs outside the graph
    (torch.compiler.disable: dynamo would trace a launch's rungs, or the interpreter's Python),
    values and every gradient equal to the uncompiled layer's."""
    torch.manual_seed(0)
    if kind == "content":
        lay = MultiHeadSelfAttention2d(
            8, 8, num_heads=2, positional="quadratic", content=True, backend="triton"
        )
    else:
        lay = LocalSelfAttention2d(8, 8, 2, 3, backend="triton")
    lay = lay.to(DEVICE)
    x = torch.randn(2, 8, 5, 6, device=DEVICE, requires_grad=True)
    y0 = lay(x)
    g0 = torch.autograd.grad(y0.sum(), [x, *lay.parameters()])
    torch._dynamo.reset()
    y = torch.compile(lay, backend="aot_eager")(x)
    g = torch.autograd.grad(y.sum(), [x, *lay.parameters()])
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    for a, b in zip(g, g0):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_window_sizes_past_int32_offsets_fall_back(monkeypatch):
    """The window kernel's largest tensor is the dQ kernel's row-logit scratch, (B, Nh, T,
    (P + 1) k) (triton_tiles.window_logits): 28 columns for k = 7 on 8-column tiles, more than a
    head of 8; past 2^31 elements, a one-line reason (shapes only: meta tensors)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_tiles.window_logits(7, 56) == 28
    limit = (2**31 - 1) // (56 * 56 * 28)

    def maps(b):
        return torch.empty(b, 1, 8, 56, 56, device="meta")

    assert triton_local.unsupported(maps(limit), maps(limit), 56, 56, "mask", 7) is None
    why = triton_local.unsupported(maps(limit + 1), maps(limit + 1), 56, 56, "mask", 7)
    assert why is not None and "2^31" in why and "\n" not in why


def test_unsupported_inputs_fall_back_with_one_line(monkeypatch):
    """Rows wider than the kernel takes: the plan passes the Triton row over
    (capability.triton_window_fits) and the window function runs, with a one-line warning naming
    why: the same result, never a wrong one."""
    torch.manual_seed(0)
    lay = LocalSelfAttention2d(4, 4, 2, 3, backend="triton").double().to(DEVICE)
    x = torch.randn(1, 4, 2, triton_axis.MAX_WIDTH + 3, dtype=torch.float64, device=DEVICE)
    why = "the Triton GPU kernel cannot run here: .*rows up to .*; the window function runs"
    with pytest.warns(UserWarning, match=why):
        y = lay(x)
    lay.backend = "reference"
    torch.testing.assert_close(y, lay(x), rtol=1e-12, atol=1e-12)


def test_backend_triton_without_triton_names_the_install(monkeypatch):
    monkeypatch.setattr(triton_axis, "INSTALLED", False)
    with pytest.raises(ValueError, match="pip install triton"):
        LocalSelfAttention2d(4, 4, 2, 3, backend="triton")
