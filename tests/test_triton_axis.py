"""The Triton kernel of content attention with axis logits (layers/kernels/triton_axis.py)
against its plain equations (fused.axis_attention_reference: the dense logits, softmax,
functional.dropped_links' mask). Without a GPU the same kernel source runs through Triton's
interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1 there): values and every gradient
at random small odd shapes in float64, gradcheck, float32 and bfloat16 against a float64
reference within 2x the plain path's error, the dropout mask link for link, the layer end to end,
and the fallbacks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.functional import dropped_links
from attnconv.layers.kernels import plan, triton_axis
from attnconv.layers.kernels.fused import axis_attention_reference
from attnconv.layers.kernels.triton_axis import axis_attention_triton
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_axis.INSTALLED or (DEVICE == "cpu" and not triton_axis.interpreted()),
    reason="needs triton (pip install triton) and a GPU or TRITON_INTERPRET=1",
)

SLOW = pytest.mark.slow  # the cases that take seconds through the interpreter (CI runs them)


def _inputs(b, nh, h, w, dk, dv, dtype, shared=False, batch_axis=False, gen=None):
    t = h * w
    q, k = (torch.randn(b, nh, t, dk, dtype=dtype, generator=gen) for _ in "qk")
    v = torch.randn(b, 1 if shared else nh, t, dv, dtype=dtype, generator=gen)
    qa = torch.randn(1 if batch_axis else b, nh, t, h + w, dtype=dtype, generator=gen) * 3
    return [x.to(DEVICE).requires_grad_() for x in (q, k, v, qa)]


def _run(f, q, k, v, qa, h, w, p, per_image, seed, scale=0.37, **kw):
    v_all = v.expand(q.shape[0], q.shape[1], *v.shape[2:])  # shared values: stride 0 on heads
    return f(q, k, v_all, qa, h, w, scale, p, per_image, seed=seed, **kw)


def _equal_in_float64(xs, h, w, p, per_image, seed, gen, **kw):
    """The kernel's values and the gradients of every input equal the plain equations' (float64,
    the same dropout seed; a random output gradient from ``gen``)."""
    y = _run(axis_attention_triton, *xs, h, w, p, per_image, seed, **kw)
    ref = _run(axis_attention_reference, *xs, h, w, p, per_image, seed)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen).to(y.device)
    for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.slow  # 20 drawn shapes through the interpreter: the quick run's longest
@settings(max_examples=20 if DEVICE == "cpu" else 4, deadline=None)  # on a GPU: a compile each
@given(
    b=st.integers(1, 2),
    nh=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 11),
    dk=st.sampled_from([1, 4, 8, 17, 48]),
    dv=st.sampled_from([3, 8, 16]),
    p=st.sampled_from([0.0, 0.1, 0.5]),
    per_image=st.booleans(),
    shared=st.booleans(),
    batch_axis=st.booleans(),
    block_m=st.sampled_from([16, 64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_triton_equals_plain_equations(
    b, nh, h, w, dk, dv, p, per_image, shared, batch_axis, block_m, seed
):
    """float64: values and the gradients of q, k, v (shared by the heads or not) and the axis
    logits (per image or one for the batch), with and without dropout under one seed."""
    gen = torch.Generator().manual_seed(seed % 1000)
    xs = _inputs(b, nh, h, w, dk, dv, torch.float64, shared, batch_axis, gen)
    _equal_in_float64(xs, h, w, p, per_image, seed, gen, block_m=block_m)


@pytest.mark.parametrize(
    "h, w, dk",
    [pytest.param(2, 40, 8, marks=SLOW), pytest.param(3, 20, 48, marks=SLOW), (1, 100, 16)],
)
def test_triton_equals_plain_equations_on_wide_rows(h, w, dk):
    """Rows wider than 16 pixels take the tiles swept at rows of 32, 64 (and 128: 64's), a key
    step of whole rows: float64 values and every gradient, with dropout."""
    gen = torch.Generator().manual_seed(w)
    xs = _inputs(2, 2, h, w, dk, 8, torch.float64, gen=gen)
    _equal_in_float64(xs, h, w, 0.2, True, 5, gen)


@pytest.mark.parametrize("h, w, dk, block_m", [(5, 7, 8, 16), (3, 20, 17, 64), (9, 3, 4, 16)])
def test_every_output_element_is_written(poisoned_empty, h, w, dk, block_m):
    """The kernels' outputs (Y, the softmax statistics, dQ, dK, dV, the axis-logit gradient) are
    allocated empty: with that memory NaN beforehand, values and every gradient still equal the
    plain equations in float64, partial query and key blocks included."""
    gen = torch.Generator().manual_seed(h * w)
    xs = _inputs(2, 2, h, w, dk, 3, torch.float64, gen=gen)
    _equal_in_float64(xs, h, w, 0.2, True, 3, gen, block_m=block_m)


@pytest.mark.parametrize("p, per_image", [(0.0, True), (0.3, True), (0.3, False)])
def test_triton_gradcheck_float64(p, per_image):
    """gradcheck's fast mode (random projections of the Jacobian: the interpreter runs a forward
    in tens of ms, the full Jacobian would take ~1,800 of them)."""
    xs = _inputs(2, 2, 3, 4, 5, 3, torch.float64, shared=True)
    f = lambda *a: _run(axis_attention_triton, *a, 3, 4, p, per_image, seed=7)  # noqa: E731
    assert torch.autograd.gradcheck(f, xs, fast_mode=True)


PRECISION_CASES = [  # b, nh, h, w, dk, dv, p
    (2, 3, 5, 7, 8, 16, 0.0),
    (1, 1, 6, 10, 48, 16, 0.2),
    (2, 2, 1, 12, 8, 16, 0.0),
    (1, 2, 16, 16, 32, 16, 0.1),  # 16x16: float32's small tile, many programs (slow, below)
    (1, 2, 4, 6, 400, 400, 0.1),  # the paper's content heads: hidden 400 wide
    (1, 2, 2, 40, 16, 16, 0.1),  # rows padded to 64: the tiles swept at rows of 64
    (1, 1, 3, 20, 48, 16, 0.0),  # rows padded to 32
    (2, 8, 5, 7, 8, 16, 0.0),  # values shared by 8 heads: their gradient summed in float32
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "b, nh, h, w, dk, dv, p",
    [pytest.param(*c, marks=SLOW) if c[2] * c[3] == 256 else c for c in PRECISION_CASES],
)
def test_triton_precision_as_tight_as_plain(dtype, b, nh, h, w, dk, dv, p):
    """float32 inputs, or bfloat16 / float16 (as autocast hands them to the kernel: q, k, v
    rounded, the axis logits in float32): the kernel's distance to the float64 equations, values
    and every gradient, within 2x the plain equations' in float32, or in that dtype's autocast.
    In low precision both start from the same rounded q, k, v and output gradient (their
    rounding, 1e-2 here, is no kernel's error), so the distance measures each path's own
    arithmetic. The distance is the
    error's norm over the tensor (its max over a few hundred elements varies 2x between seeds).
    The backward must recompute the forward's logits to the bit: on an Intel Xeon, the forward
    loading K^T where the backward transposes K (two layouts the interpreter's BLAS rounds
    differently) put dV at 2-8x the plain path's error, the dominant probability of a peaked
    row no longer normalized away."""
    outs = axis_errors(dtype, b, nh, h, w, dk, dv, p)
    for got, plain in zip(outs["triton"], outs["plain"]):
        assert got <= 2 * plain, (outs["triton"], outs["plain"])


def axis_errors(dtype, b, nh, h, w, dk, dv, p) -> dict[str, list[float]]:
    """The kernel's ("triton") and its plain equations' ("plain") distance to the float64
    equations, output then the gradients of q, k, v (shared by the heads) and the axis logits
    (the error's norm); benchmarks/triton_precision_sweep.py --axis prints them."""
    low = dtype != torch.float32
    gen = torch.Generator().manual_seed(b + dk)
    xs = _inputs(b, nh, h, w, dk, dv, torch.float64, shared=True, gen=gen)
    if low:
        xs = [x.detach().to(dtype).double().requires_grad_() for x in xs[:3]] + xs[3:]
    exact = _run(axis_attention_reference, *xs, h, w, p, True, seed=11)
    g = torch.randn(exact.shape, dtype=exact.dtype, generator=gen).to(dtype).double()
    exact_g = torch.autograd.grad(exact, xs, g)
    outs = {}
    for name in ("triton", "plain"):
        x32 = [x.detach().float().requires_grad_() for x in xs]
        if name == "triton":  # the kernel's inputs as autocast gives them
            qkv = [x.to(dtype) for x in x32[:3]]
            y = _run(axis_attention_triton, *qkv, x32[3], h, w, p, True, seed=11)
        else:
            with torch.autocast(DEVICE, dtype=dtype, enabled=low):
                y = _run(axis_attention_reference, *x32, h, w, p, True, seed=11)
        grads = torch.autograd.grad(y, x32, g.to(y.dtype))
        outs[name] = [(y.double() - exact).norm().item()] + [
            (a.double() - e).norm().item() for a, e in zip(grads, exact_g)
        ]
    return outs


@pytest.mark.parametrize(
    "b, nh, h, w, dk, dv, p", [(1, 2, 1, 1, 8, 8, 0.0), (2, 1, 2, 1, 8, 8, 0.3)]
)
def test_triton_precision_with_one_or_two_keys(b, nh, h, w, dk, dv, p):
    """float32 on a 1 x 1 and a 2 x 1 image, as above: with one key the plain path's
    gradients are exact (P = 1, dS = 0) and the kernel's must be too. flash attention's delta,
    rowsum(dY o Y), left dQ, dK and the axis logits' gradients nonzero there (Y's rounding
    against the recomputed P); the dQ kernel's delta pass, rowsum(P o dP) / rowsum(P), is
    exact."""
    test_triton_precision_as_tight_as_plain(torch.float32, b, nh, h, w, dk, dv, p)


def test_the_backward_recomputes_the_forwards_logits_whatever_the_layout_rounding(
    monkeypatch,
):
    """Through an interpreter whose float32 products sum a transposed operand in reversed
    order (as some BLAS builds round the two layouts differently; an Intel Xeon's did): the
    backward's P still equals the forward's to the bit, so 400-wide heads, whose peaked rows put
    one key near probability 1, keep dV within 2x the plain path's error (7.4x here when the
    forward loaded K^T and the backward transposed K; 7.8x on the Xeon's own BLAS)."""
    if DEVICE == "cuda":
        pytest.skip("the interpreter's products")
    import numpy as np
    from triton.runtime import interpreter

    plain_dot = interpreter.InterpreterBuilder.create_dot

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        x, y = a.data, b.data
        if d.data.dtype == np.float32 and not (x.flags.c_contiguous and y.flags.c_contiguous):
            out = np.matmul(x[:, ::-1], y[::-1, :], dtype=np.float32) + d.data  # K reversed
            return interpreter.TensorHandle(out, d.dtype.scalar)
        return plain_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", dot)
    h, w, dk, p = 4, 6, 400, 0.1
    gen = torch.Generator().manual_seed(1 + dk)
    xs = _inputs(1, 2, h, w, dk, dk, torch.float64, shared=True, gen=gen)
    exact = _run(axis_attention_reference, *xs, h, w, p, True, seed=11)
    g = torch.randn(exact.shape, dtype=exact.dtype, generator=gen)
    exact_dv = torch.autograd.grad(exact, xs[2], g)[0]
    err = {}
    for f in (axis_attention_triton, axis_attention_reference):
        x32 = [x.detach().float().requires_grad_() for x in xs]
        y = _run(f, *x32, h, w, p, True, seed=11)
        err[f] = (torch.autograd.grad(y, x32[2], g.float())[0].double() - exact_dv).norm()
    assert err[axis_attention_triton] <= 2 * err[axis_attention_reference], err


@pytest.mark.parametrize("dk, dv", [(400, 400), (257, 130)])
def test_triton_takes_heads_wider_than_flash_attention(dk, dv):
    """Head widths over 256 (FlashAttention's limit) up to MAX_HEAD_DIM, the paper's content
    model's 400 among them: float64 values and every gradient equal the plain equations. Through
    the interpreter only: on a GPU float64 products are summed in registers (triton_parts._dot),
    which at these widths makes a slow compile and a kernel that spills most of them (compile
    ``Case(torch.float64, 3, 5, 400, 400)`` with triton_compile to see); the precision test runs
    400-wide heads in float32, bfloat16 and float16 there."""
    if DEVICE == "cuda":
        pytest.skip("float64 at head widths over 256 is an interpreter test (slow GPU compile)")
    gen = torch.Generator().manual_seed(dk)
    xs = _inputs(2, 2, 3, 5, dk, dv, torch.float64, gen=gen)
    y = _run(axis_attention_triton, *xs, 3, 5, 0.1, True, seed=3)
    ref = _run(axis_attention_reference, *xs, 3, 5, 0.1, True, seed=3)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen).to(DEVICE)
    for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)
    assert triton_axis.unsupported(xs[0][..., :1].expand(-1, -1, -1, 513), xs[2], 3, 5)


def test_triton_dropout_mask_is_dropped_links():
    """Uniform attention over one-hot values shows each link: y[i, j] > 0 exactly where
    dropped_links keeps (i, j), per image and one mask for the batch."""
    h, w, nh, b = 5, 7, 2, 2
    t = h * w
    q = torch.zeros(b, nh, t, 8, device=DEVICE)
    v = torch.eye(t, device=DEVICE).expand(b, nh, t, t)
    qa = torch.zeros(1, nh, t, h + w, device=DEVICE)
    for per_image in (True, False):
        y = axis_attention_triton(q, q, v, qa, h, w, 1.0, 0.3, per_image, seed=2024, block_m=16)
        kept = ~dropped_links(nh, t, b if per_image else None, 0.3, DEVICE, seed=2024)
        assert torch.equal(y.transpose(1, 2) > 0, kept.expand(b, nh, t, t))
        torch.testing.assert_close(
            y.transpose(1, 2)[kept.expand(b, nh, t, t)].unique(),
            torch.tensor([1 / (t * 0.7)], device=DEVICE),
        )


@pytest.mark.parametrize("positional", ["quadratic", "relative_learned"])
@pytest.mark.parametrize("dropout", [0.0, pytest.param(0.25, marks=SLOW)])
def test_layer_backend_triton_equals_reference(positional, dropout):
    """MultiHeadSelfAttention2d(backend="triton") against backend="reference" in float64 under one
    seed: the output and the gradients of the input and every parameter (projections, the
    positional encoding's)."""
    torch.manual_seed(0)
    lay = (
        MultiHeadSelfAttention2d(
            12, 12, num_heads=3, head_dim=8, positional=positional, dropout=dropout
        )
        .double()
        .to(DEVICE)
        .train()
    )
    x = torch.randn(2, 12, 5, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    res = []
    for backend in ("triton", "reference"):
        lay.backend = backend
        assert (lay.kernel(x) == "triton") == (backend == "triton")
        torch.manual_seed(5)
        y = lay(x)
        res.append((y, *torch.autograd.grad(y.square().sum(), [x, *lay.parameters()])))
    for a, r in zip(*res):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


def layer_errors(lay, exact_lay, x, measure) -> dict:
    """The layer under bfloat16 autocast, backend="triton" ("triton") and the plain path
    (backend="reference" under the same autocast, None): each one's distance to ``exact_lay``
    (the float64 layer, given lay's state), output then the gradients of x and every
    parameter, ``measure`` of the error tensor (its max, or its norm)."""
    exact_lay.load_state_dict(lay.state_dict())
    xd = x.double().requires_grad_()
    ye = exact_lay(xd)
    ge = torch.autograd.grad(ye.square().sum(), [xd, *exact_lay.parameters()])
    errs = {}
    for backend in ("triton", "reference"):
        lay.backend = backend
        xf = x.clone().requires_grad_()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            y = lay(xf)
        gs = torch.autograd.grad(y.float().square().sum(), [xf, *lay.parameters()])
        errs[backend] = [measure(y.double() - ye).item()] + [
            measure(a.double() - e).item() for a, e in zip(gs, ge)
        ]
    return errs


def test_layer_backend_triton_bf16_autocast_as_tight_as_plain():
    """The layer under bfloat16 autocast: backend="triton" within 2x of the plain path's
    (backend="reference" under the same autocast) distance to float64, output and gradients."""
    torch.manual_seed(1)
    lay = MultiHeadSelfAttention2d(16, 16, num_heads=2, head_dim=8, positional="quadratic").to(
        DEVICE
    )
    x = torch.randn(2, 16, 6, 10, device=DEVICE)
    exact_lay = (
        MultiHeadSelfAttention2d(
            16, 16, num_heads=2, head_dim=8, positional="quadratic", backend="reference"
        )
        .double()
        .to(DEVICE)
    )
    errs = layer_errors(lay, exact_lay, x, lambda e: e.abs().max())
    for got, plain in zip(errs["triton"], errs["reference"]):
        assert got <= 2 * plain + 1e-6, (errs["triton"], errs["reference"])


def test_unsupported_inputs_fall_back_with_one_line(monkeypatch):
    """Rows wider than the kernel takes (and a CPU without the interpreter): the plan's
    capability check (capability.triton_axis_fits) passes the Triton row over and the dense path
    runs, with a one-line warning naming why: the same result, never a wrong one."""
    lay = (
        MultiHeadSelfAttention2d(
            8, 8, num_heads=2, positional="relative_learned", backend="triton", max_size=160
        )
        .double()
        .to(DEVICE)
    )
    x = torch.randn(1, 8, 1, triton_axis.MAX_WIDTH + 3, dtype=torch.float64, device=DEVICE)
    why = r"the Triton GPU kernel cannot run here: .*rows up to .*; the fold \(the positional"
    with pytest.warns(UserWarning, match=why):
        y = lay(x)
    lay.backend = "reference"
    torch.testing.assert_close(y, lay(x), rtol=1e-12, atol=1e-12)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        why = triton_axis.unsupported(x.float(), x.float(), 1, 8)  # (float64: triton < 3.5's)
        assert why is not None and "CUDA" in why and "\n" not in why


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_kernels_run_on_the_tensors_gpu_not_the_current_one():
    """Triton launches on the current device: tensors on cuda:1 while cuda:0 is current run on
    cuda:1 (launch's device guard), equal to the plain equations."""
    gen = torch.Generator().manual_seed(3)
    xs = [
        x.detach().to("cuda:1").requires_grad_()
        for x in _inputs(2, 2, 5, 7, 8, 8, torch.float64, gen=gen)
    ]
    with torch.cuda.device(0):
        _equal_in_float64(xs, 5, 7, 0.0, True, 0, gen)


def test_sizes_past_int32_offsets_or_the_launch_grid_fall_back(monkeypatch):
    """The kernels' offsets are int32 and B x Nh is the grid's second dimension: shapes past
    either get a one-line reason (the dense path runs), checked on shapes alone (meta tensors,
    nothing allocated); the largest tensor is (B, Nh, T, max(d, H + W))."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def seq(b, nh, d, h=64, w=64):
        return torch.empty(b, nh, h * w, d, device="meta")

    # d = 64 < H + W = 128: 2^31 / (4096 * 128) = 4096 images of one head
    assert triton_axis.unsupported(seq(4095, 1, 64), seq(4095, 1, 64), 64, 64) is None
    why = triton_axis.unsupported(seq(4097, 1, 64), seq(4097, 1, 64), 64, 64)
    assert why is not None and "2^31" in why and "\n" not in why
    # a head of 256 > H + W: half as many images
    assert triton_axis.unsupported(seq(2047, 1, 256), seq(2047, 1, 8), 64, 64) is None
    assert "2^31" in triton_axis.unsupported(seq(2049, 1, 8), seq(2049, 1, 256), 64, 64)
    # q of one image, expanded over the batch (position-only queries): the batch is v's
    why = triton_axis.unsupported(seq(1, 8, 8, 1, 1), seq(8192, 8, 8, 1, 1), 1, 1)
    assert why is not None and "batch x heads up to 65535, not 65536" in why
    assert triton_axis.unsupported(seq(1, 5, 8, 1, 1), seq(13107, 5, 8, 1, 1), 1, 1) is None


def test_float64_falls_back_where_triton_compiles_no_float64_product(monkeypatch):
    """triton 3.4 (torch 2.8's) fails to compile a float64 tl.dot; its interpreter runs one. A
    compiled launch of float64 there gets a one-line reason (the dense path runs) instead of a
    CompilationError; bf16 is not refused for it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_axis, "VERSION", "3.4.0")
    monkeypatch.setattr(triton_axis, "FLOAT64_DOT", False)
    x = torch.empty(1, 2, 35, 8, device="meta", dtype=torch.float64)
    assert triton_axis.unsupported(x, x, 5, 7) == (
        "triton 3.4.0 compiles no float64 matrix product (3.5 does)"
    )
    assert "float64" not in triton_axis.unsupported(x.bfloat16(), x.bfloat16(), 5, 7)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter: float64 runs
    assert triton_axis.unsupported(x, x, 5, 7) is None


def test_the_version_is_read_from_either_triton_distribution(monkeypatch):
    """PyTorch nightlies install the module as ``pytorch-triton``: its version is read there; no
    distribution found is None (float64 then takes the dense path), never an import error."""
    import importlib.metadata

    def version(dists):
        def read(name):
            if name not in dists:
                raise importlib.metadata.PackageNotFoundError(name)
            return dists[name]

        return read

    monkeypatch.setattr(importlib.metadata, "version", version({"pytorch-triton": "3.5.0+git1"}))
    assert triton_axis._version() == "3.5.0+git1"
    monkeypatch.setattr(importlib.metadata, "version", version({}))
    assert triton_axis._version() is None


def test_a_version_of_any_form_is_read_without_error():
    """3.5 onwards compiles float64; release candidates, local builds and two-digit minors are
    read by their major.minor, a missing or odd version as "no" (never an import error)."""
    for v, want in [("3.5.0", True), ("3.6.0rc1", True), ("3.5.0+git1", True), ("3.10.0", True)]:
        assert triton_axis._at_least(v, 3, 5) is want
    for v in ("3.4.0", "3.4", "2.9.9", "3", "nightly", "", None):
        assert triton_axis._at_least(v, 3, 5) is False


def test_backend_triton_without_triton_names_the_install(monkeypatch):
    monkeypatch.setattr(triton_axis, "INSTALLED", False)
    with pytest.raises(ValueError, match="pip install triton"):
        MultiHeadSelfAttention2d(8, 8, num_heads=2, positional="quadratic", backend="triton")


def test_plan_picks_triton_only_for_content_axis_terms():
    lay = MultiHeadSelfAttention2d(
        8, 8, num_heads=2, positional="quadratic", content=False, backend="triton"
    )
    x = torch.randn(1, 8, 4, 4)
    assert lay.kernel(x) != "triton"  # position only: the shared/separable kernels
    lay.content = True
    assert lay.kernel(x) == "triton"
    assert "triton" in plan.BACKENDS


def test_the_backward_runs_at_the_forwards_query_block(monkeypatch):
    """One block shape a call: when the forward's launch settles on a smaller query block (a GPU
    whose shared memory refused its tile's), both backward kernels start from that block, not
    from their tiles' (their products would round the recomputed logits otherwise)."""
    real, seen = triton_axis.launch, []

    def launch(kernel, grid, args, meta):
        if kernel is triton_axis._fwd:  # as if Triton had refused the tile's block
            meta = dict(meta, BLOCK_M=16)
        seen.append((kernel.__name__, meta["BLOCK_M"]))
        return real(kernel, grid, args, meta)

    monkeypatch.setattr(triton_axis, "launch", launch)
    q, k, v, qa = _inputs(1, 2, 5, 7, 8, 8, torch.float64)
    y = _run(axis_attention_triton, q, k, v, qa, 5, 7, 0.0, True, 0, block_m=64)
    y.sum().backward()
    assert seen == [("_fwd", 16), ("_bwd_dq", 16), ("_bwd_dq", 16), ("_bwd_dkdv", 16)]
    monkeypatch.setattr(triton_axis, "launch", real)
    grads = [x.grad.clone() for x in (q, k, v, qa)]
    for x in (q, k, v, qa):
        x.grad = None
    _run(axis_attention_triton, q, k, v, qa, 5, 7, 0.0, True, 0, block_m=16).sum().backward()
    for g, x in zip(grads, (q, k, v, qa)):
        torch.testing.assert_close(g, x.grad, rtol=0, atol=0)


def test_k_and_v_that_do_not_match_q_are_one_line():
    """The kernel read past k or v (finite garbage, on a GPU a possible illegal access)."""
    q = torch.randn(1, 2, 35, 8, device=DEVICE)
    q_axis = torch.randn(1, 2, 35, 12, device=DEVICE)
    for k, v in [(q[..., :4], q), (q[:, :, :30], q), (q, q[:, :, :30])]:
        with pytest.raises(ValueError, match=r"q, k \(B, Nh, T, dk\) and v .* must agree"):
            axis_attention_triton(q, k, v, q_axis, 5, 7, 0.5)


@pytest.mark.parametrize("window", [0, pytest.param(3, marks=SLOW)])
def test_the_delta_pass_runs_again_where_the_dq_pass_steps_down(monkeypatch, window):
    """The dQ kernel's two passes at one query block: where the dQ pass's shared memory forces a
    smaller block than the delta pass ran at (a direct call on a small-shared-memory GPU, no
    block from triton_compile.fit), delta is computed again at that block and dQ after it, the
    window's partial row-logit slots cleared first; the gradients then equal a call at that
    block to the bit."""
    from attnconv.layers.kernels.triton_local import local_attention_triton

    real, seen = triton_axis.launch, []

    def launch(kernel, grid, args, meta):
        if meta.get("DELTA_PASS") is False and meta["BLOCK_M"] > 16:  # as if Triton refused it
            meta = dict(meta, BLOCK_M=16)
        seen.append((triton_axis.launch_name(kernel, meta), meta["BLOCK_M"]))
        return real(kernel, grid, args, meta)

    gen = torch.Generator().manual_seed(3)
    if window:
        xs = [torch.randn(1, 2, 8, 6, 9, dtype=torch.float64, generator=gen) for _ in "qkv"]
        xs += [torch.randn(window, 4, dtype=torch.float64, generator=gen) for _ in "rc"]
        xs = [x.requires_grad_() for x in xs]

        def call(block_m):
            return local_attention_triton(*xs[:3], window, *xs[3:], block_m=block_m)
    else:
        xs = list(_inputs(1, 2, 5, 7, 8, 8, torch.float64, gen=gen))

        def call(block_m):
            return _run(axis_attention_triton, *xs, 5, 7, 0.0, True, 0, block_m=block_m)

    monkeypatch.setattr(triton_axis, "launch", launch)
    g = torch.autograd.grad(call(64).square().sum(), xs)
    monkeypatch.setattr(triton_axis, "launch", real)
    names = [n for n, _ in seen]
    assert names == ["_fwd", "_bwd_dq_delta", "_bwd_dq", "_bwd_dq_delta", "_bwd_dq", "_bwd_dkdv"]
    assert [b for _, b in seen[1:5]] == [64, 16, 16, 16], seen
    for a, b in zip(g, torch.autograd.grad(call(16).square().sum(), xs)):
        torch.testing.assert_close(a, b, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("h, w", [(32, 2), pytest.param(24, 5, marks=SLOW)])
def test_a_first_key_block_all_at_minus_inf_stays_finite(h, w):
    """Every query's row logits at -inf for the first three quarters of the key rows: the first
    key blocks hold no finite logit (the running max is -inf), later ones do. The values and
    every gradient equal the plain equations' (finite), not NaN."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, qa = (x.detach() for x in _inputs(1, 2, h, w, 4, 3, torch.float64, gen=gen))
    qa[..., : 3 * h // 4] = float("-inf")  # (B, Nh, T, H + W): the row offsets come first
    xs = [x.requires_grad_() for x in (q, k, v, qa)]
    y = _run(axis_attention_triton, *xs, h, w, 0.0, True, 0)
    assert bool(torch.isfinite(y).all())
    _equal_in_float64(xs, h, w, 0.0, True, 0, gen)
