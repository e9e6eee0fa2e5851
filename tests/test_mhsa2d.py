"""MultiHeadSelfAttention2d: fast paths == the plain reference (values, gradients); API; errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.mhsa2d import POSITIONALS, MultiHeadSelfAttention2d

VARIANTS = [(p, c) for p in POSITIONALS for c in (True, False)]


def _run(layer, x, backend):
    layer.backend = backend
    y, attn = layer(x, return_attention=True)
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * y.detach().cos()).sum(), [x, *params], allow_unused=True)
    return y, attn, grads


def assert_fast_equals_reference(layer, x, rtol=1e-4, atol=1e-6):
    ya, aa, ga = _run(layer, x, None)
    yr, ar, gr = _run(layer, x, "reference")
    torch.testing.assert_close(ya, yr, rtol=rtol, atol=atol)
    torch.testing.assert_close(aa, ar, rtol=rtol, atol=atol)
    names = ["input"] + [n for n, p in layer.named_parameters() if p.requires_grad]
    for name, a, r in zip(names, ga, gr):
        assert (a is None) == (r is None), name
        if a is not None:
            torch.testing.assert_close(
                a, r, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
            )


@given(
    variant=st.sampled_from(VARIANTS),
    value=st.sampled_from(["linear", "identity"]),
    b=st.integers(1, 2),
    cin=st.integers(1, 6),
    heads=st.integers(1, 9),
    dh=st.integers(1, 4),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference_random_shapes(variant, value, b, cin, heads, dh, h, w, seed):
    positional, content = variant
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention2d(
        cin,
        5,
        heads,
        head_dim=dh if value == "linear" else None,
        positional=positional,
        content=content,
        value=value,
        max_size=8,
    ).double()
    x = torch.randn(b, cin, h, w, dtype=torch.float64, requires_grad=True)
    assert_fast_equals_reference(layer, x)


@pytest.mark.parametrize("positional,content", VARIANTS)
def test_fast_equals_reference_float32(positional, content, device):
    """On every device: on CUDA the row/column encodings take the FlexAttention backend."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(8, 12, 3, positional=positional, content=content, max_size=16)
    layer = layer.to(device)
    x = torch.randn(2, 8, 6, 9, device=device, requires_grad=True)
    assert_fast_equals_reference(layer, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["channels_last", "strided", "sliced"])
@pytest.mark.parametrize("positional,content", VARIANTS)
def test_fast_equals_reference_on_non_contiguous_inputs(positional, content, layout):
    """The fast paths reshape and permute their input: any memory layout must give the same."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(6, 6, 3, positional=positional, content=content).double()
    x = torch.randn(2, 12, 5, 7, dtype=torch.float64)
    x = {
        "channels_last": x[:, :6].contiguous(memory_format=torch.channels_last),
        "strided": x[:, :6].transpose(2, 3).contiguous().transpose(2, 3),
        "sliced": x[:, ::2],
    }[layout].requires_grad_()
    assert_fast_equals_reference(layer, x)


@pytest.mark.parametrize(
    "kw",
    [
        dict(positional="relative", content=False, relative_terms=("global_position",)),
        dict(
            positional="relative",
            content=True,
            relative_terms=("content_content", "global_content"),
        ),
        dict(positional="relative", content=False, relative_terms=("content_position",)),
        dict(positional="relative", content=True, learned_r=True, rel_dim=6),
        dict(positional="relative_learned", content=False, rel_dim=3),
        dict(positional="quadratic", content=False, hard=True),
    ],
)
def test_encoding_options(kw):
    torch.manual_seed(1)
    layer = MultiHeadSelfAttention2d(4, 6, 3, max_size=8, **kw).double()
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    assert_fast_equals_reference(layer, x)


def test_shapes_and_attention_contract():
    layer = MultiHeadSelfAttention2d(4, 10, 2, positional="quadratic", content=False)
    y, attn = layer(torch.randn(3, 4, 5, 6), return_attention=True)
    assert y.shape == (3, 10, 5, 6)
    assert attn.shape == (1, 2, 30, 30)  # input-independent: shared by the batch
    torch.testing.assert_close(attn.sum(-1), torch.ones(1, 2, 30))
    assert layer.attention_centers().shape == (2, 2)
    layer = MultiHeadSelfAttention2d(4, 10, 2, positional="relative_learned")
    _, attn = layer(torch.randn(3, 4, 5, 6), return_attention=True)
    assert attn.shape == (3, 2, 30, 30)


def test_identity_value_layout():
    layer = MultiHeadSelfAttention2d(
        5, 7, 9, positional="quadratic", content=False, value="identity"
    )
    assert layer.head_dim == 5 and not hasattr(layer, "value_proj")
    assert layer.out_proj.weight.shape == (7, 9 * 5)


@pytest.mark.parametrize(
    "build,x,match",
    [
        (dict(in_channels=4, out_channels=8, num_heads=3), None, "not divisible by num_heads"),
        (dict(in_channels=4, out_channels=8, num_heads=2, positional="bogus"), None, "positional"),
        (dict(in_channels=4, out_channels=8, num_heads=2), (2, 3, 5, 5), "input channels"),
        (dict(in_channels=4, out_channels=8, num_heads=2), (4, 5, 5), "4-D"),
        (
            dict(
                in_channels=4,
                out_channels=8,
                num_heads=2,
                positional="absolute_learned",
                max_size=8,
            ),
            (1, 4, 9, 4),
            "max_size=8",
        ),
        (
            dict(
                in_channels=4,
                out_channels=8,
                num_heads=2,
                positional="relative_learned",
                max_size=8,
            ),
            (1, 4, 4, 12),
            "max_size=8",
        ),
        (
            dict(in_channels=4, out_channels=8, num_heads=2, value="identity", head_dim=3),
            None,
            "head_dim",
        ),
        (dict(in_channels=4, out_channels=8, num_heads=2, hard=True), None, "hard"),
    ],
)
def test_bad_input_raises_value_error(build, x, match):
    with pytest.raises(ValueError, match=match):
        layer = MultiHeadSelfAttention2d(**build)
        layer(torch.randn(*x))


class _MaxNumel(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest tensor any aten op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


@pytest.mark.parametrize(
    "kw",
    [
        dict(positional="quadratic", content=False),
        dict(positional="quadratic", content=False, hard=True),
        dict(positional="relative_learned", content=False),
        dict(positional="quadratic", content=True),
        dict(positional="quadratic_generalized", content=True),
        dict(positional="relative_learned", content=True),
        dict(positional="relative", content=True),
    ],
)
def test_fast_paths_never_build_t_by_t(kw):
    """Separable and folded paths: no tensor of T*T elements (T = 24*24) in forward or backward;
    the reference path does build them."""
    layer = MultiHeadSelfAttention2d(2, 4, 2, **kw)
    x = torch.randn(1, 2, 24, 24, requires_grad=True)
    t = 24 * 24
    for backend, small in ((None, True), ("reference", False)):
        layer.backend = backend
        with _MaxNumel() as mode:
            layer(x).sum().backward()
        assert (mode.max_numel < t * t) == small, (backend, mode.max_numel)


@pytest.mark.parametrize("positional,content", VARIANTS)
def test_dropout_trains_and_eval_is_deterministic(positional, content):
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(4, 6, 2, positional=positional, content=content, dropout=0.5)
    x = torch.randn(2, 4, 5, 5)
    y = layer(x)
    y.sum().backward()
    assert torch.isfinite(y).all()
    layer.eval()
    y1, y2 = layer(x), layer(x)
    torch.testing.assert_close(y1, y2)
    layer.backend = "reference"
    torch.testing.assert_close(layer(x), y1, rtol=1e-4, atol=1e-5)


def test_hard_set_after_construction_on_a_content_layer_is_an_error():
    layer = MultiHeadSelfAttention2d(4, 8, 2, positional="quadratic", content=True)
    layer.positional_encoding.hard = True
    with pytest.raises(ValueError, match="hard"):
        layer(torch.randn(1, 4, 3, 3))


@given(h=st.integers(1, 6), w=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_returned_maps_are_the_fast_paths_own(h, w, seed):
    """return_attention gives the probabilities of the path that ran (separable factors, hard
    shifts, folded q/k), each equal to the dense reference maps."""
    torch.manual_seed(seed)
    x = torch.randn(2, 4, h, w, dtype=torch.float64)
    for kw in (
        dict(positional="quadratic", content=False, hard=True),
        dict(positional="quadratic", content=False),
        dict(positional="relative_learned", content=True),
        dict(positional="quadratic_generalized", content=False),
    ):
        layer = MultiHeadSelfAttention2d(4, 4, 2, **kw).double().eval()
        with torch.no_grad():
            if hasattr(layer.positional_encoding, "centers"):
                layer.positional_encoding.centers.uniform_(-3, 3)
        _, fast = layer(x, return_attention=True)
        layer.backend = "reference"
        _, ref = layer(x, return_attention=True)
        torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(fast.sum(-1), torch.ones_like(fast.sum(-1)))


def test_typed_encoding_equals_the_string_shorthand():
    """positional= takes a PositionalEncoding (the typed form) as well as its name; the layer
    asks it what it can do (no name comparison), so both give the same layer."""
    from attnconv.layers.encodings import PositionalEncoding, QuadraticEncoding
    from attnconv.layers.encodings.relative import LearnedRelativeEncoding

    torch.manual_seed(0)
    typed = MultiHeadSelfAttention2d(
        8, 8, 2, positional=QuadraticEncoding(2, init_alpha=2.0), content=False
    )
    named = MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", content=False)
    named.load_state_dict(typed.state_dict())
    x = torch.randn(2, 8, 5, 6)
    torch.testing.assert_close(typed(x), named(x))
    assert typed.positional == "quadratic" and typed.separable
    enc = LearnedRelativeEncoding(2, 4, 4, content=True, max_size=8)
    layer = MultiHeadSelfAttention2d(8, 8, 2, positional=enc)
    assert isinstance(layer.positional_encoding, PositionalEncoding) and layer.input_dependent
    assert layer(x).shape == (2, 8, 5, 6)
    with pytest.raises(ValueError, match="the encoding has 3 heads, the layer 2"):
        MultiHeadSelfAttention2d(8, 8, 2, positional=QuadraticEncoding(3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'alpha'"):
        MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", alpha=3.0)


def test_typed_encoding_refuses_what_the_layer_cannot_serve():
    """A typed encoding is checked against the layer as its name is: a query-read table or a
    q.k term without content, no term at all, or widths built for another layer is one clear
    error at construction (each once ran: a crash in forward, or a fast path that added a term
    the reference left out)."""
    from attnconv import AbsolutePositionalEncoding2d, LearnedRelativeEncoding, RelativeEncoding

    def refused(enc, match, content=False):
        with pytest.raises(ValueError, match=match):
            MultiHeadSelfAttention2d(4, 6, 3, positional=enc(), content=content)

    refused(lambda: LearnedRelativeEncoding(3, 2, 2, content=True), "needs content=True")
    refused(lambda: RelativeEncoding(3, qk_dim=2, rel_dim=4, terms=("content_content",)), "q.k")
    refused(lambda: RelativeEncoding(3, qk_dim=2, rel_dim=4, terms=()), "non-empty subset")
    refused(lambda: RelativeEncoding(3, qk_dim=2, rel_dim=4, terms=("qr",)), "non-empty subset")
    refused(lambda: AbsolutePositionalEncoding2d(1, learned=True), "1 channels, the layer's")
    refused(lambda: AbsolutePositionalEncoding2d(8, learned=False), "8 channels")
    terms = ("content_content", "content_position")
    enc = lambda: RelativeEncoding(3, qk_dim=16, rel_dim=4, terms=terms)  # noqa: E731
    refused(enc, "qk_dim 16, the layer 2", content=True)
    enc = lambda: LearnedRelativeEncoding(3, 4, 4, content=True, head_keys=False)  # noqa: E731
    refused(enc, "4 wide, the layer's queries 2", content=True)


@pytest.mark.parametrize(
    "terms, content",
    [
        (("global_position",), False),
        (("global_content", "global_position"), False),
        (("content_position",), False),
        (("content_content",), True),
        (("content_content", "global_position"), True),
    ],
)
def test_typed_relative_terms_fast_equals_reference(terms, content):
    """Each term a typed RelativeEncoding turns on reaches both paths alike (float64; the
    position-only AxisTerm once added v^T What_k r even when global_position was off)."""
    from attnconv import RelativeEncoding

    torch.manual_seed(0)
    enc = RelativeEncoding(3, qk_dim=2, rel_dim=4, terms=terms)
    layer = MultiHeadSelfAttention2d(4, 6, 3, positional=enc, content=content).double()
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    layer.backend = "reference"
    yr = layer(x)
    (gr,) = torch.autograd.grad(yr.square().sum(), x)
    layer.backend = None
    ya = layer(x)
    (ga,) = torch.autograd.grad(ya.square().sum(), x)
    torch.testing.assert_close(ya, yr, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ga, gr, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hw", [(5, 6), (16, 16)])
def test_head_keys_with_content_in_a_low_precision_layer(dtype, hw):
    """A bf16/fp16 layer (not autocast) of learned relative tables read by per-head keys, with
    content: the fast kernels (fold; fused from 16x16) computed in float32 and once fed the
    layer's low-precision head keys a float32 table (a dtype error). Now within 2x of the plain
    path's error against float64, output and input gradient."""
    torch.manual_seed(0)
    kw = dict(positional="relative_learned", content=True, head_keys=True)
    exact = MultiHeadSelfAttention2d(4, 6, 3, **kw).double()
    layer = MultiHeadSelfAttention2d(4, 6, 3, **kw).to(dtype)
    layer.load_state_dict(exact.state_dict())
    exact.load_state_dict(layer.state_dict())  # the same rounded weights on both sides
    x = torch.randn(2, 4, *hw).to(dtype)
    x64 = x.double().requires_grad_()
    y64 = exact(x64)
    (g64,) = torch.autograd.grad(y64.square().sum(), x64)

    def error(backend):
        layer.backend = backend
        xi = x.clone().requires_grad_()
        y = layer(xi)
        (g,) = torch.autograd.grad(y.float().square().sum(), xi)
        return (y.double() - y64).abs().max(), (g.double() - g64).abs().max()

    (ry, rg), (fy, fg) = error("reference"), error(None)
    assert layer.kernel(x) != "reference"
    assert fy <= 2 * ry and fg <= 2 * rg, (fy, ry, fg, rg)


@pytest.mark.parametrize("positional", ["quadratic", "relative_learned", "quadratic_generalized"])
def test_batch_dropout_mask_is_shared_and_fast_equals_reference(positional):
    """dropout_mask="batch" (the reference code's Gaussian layer): one (Nh, T, T) mask for the
    whole batch: identical images get identical outputs; the fast path draws the same mask as
    the reference path (same seed: same values and gradients)."""
    kw = dict(positional=positional, content=False, dropout=0.3, dropout_mask="batch")
    fast = MultiHeadSelfAttention2d(8, 8, 2, **kw).double().train()
    ref = MultiHeadSelfAttention2d(8, 8, 2, backend="reference", **kw).double().train()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(1, 8, 5, 6, dtype=torch.float64).repeat(3, 1, 1, 1).requires_grad_()
    torch.manual_seed(1)
    ya = fast(x)
    torch.manual_seed(1)
    yr = ref(x)
    torch.testing.assert_close(ya, yr)
    torch.testing.assert_close(ya[0], ya[2])  # one mask for the batch
    ga, gr = (torch.autograd.grad(y.sin().sum(), x)[0] for y in (ya, yr))
    torch.testing.assert_close(ga, gr)
    sample = MultiHeadSelfAttention2d(8, 8, 2, **{**kw, "dropout_mask": "sample"}).double()
    sample.load_state_dict(fast.state_dict())
    ys = sample.train()(x)
    assert not torch.allclose(ys[0], ys[2])  # a mask per image
    with pytest.raises(ValueError, match="dropout_mask='batch' needs position-only"):
        MultiHeadSelfAttention2d(8, 8, 2, positional=positional, dropout_mask="batch")
    with pytest.raises(ValueError, match="dropout_mask must be one of"):
        MultiHeadSelfAttention2d(8, 8, 2, positional=positional, dropout_mask="head")
