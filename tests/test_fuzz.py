"""Fuzzing the public layers with hypothesis (issue 8, "input validation across the public API").

Every call either works -- and then the fast path (impl="auto") equals the plain reference
(impl="reference") in values and in the gradients of the input and of every parameter, float64 --
or raises a ValueError/TypeError whose message is one non-empty line. Any other exception
(RuntimeError, IndexError, ZeroDivisionError, AttributeError from deep inside PyTorch) fails.

One hypothesis test per layer draws a valid configuration and input (degenerate sizes 1x1, 1xW,
Hx1, huge head counts, windows larger than the image, channels-last and non-contiguous inputs),
then, half of the time, replaces one argument by a bad value (zero, negative, float, str, None,
bool sizes; unknown options) and, a third of the time, breaks the input (wrong dtype, integer,
bool, complex, rank, channels, empty, list, numpy). Untouched: it must work and match. Touched:
work and match, or a clear error, refused by the reference path too. Fixed lists of faults
(``test_*_fault*``, ``test_bad_inputs_*``, ``test_models_*``) must raise the clear error.
The examples per test are set below (``fuzz(n)``): 400 in all.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from attnconv.convert import conv_to_attention
from attnconv.layers.functional import scaled_dot_product_attention
from attnconv.layers.local import PADDINGS, LocalSelfAttention2d
from attnconv.layers.local import SASA_POSITIONALS as LOCAL_POSITIONALS
from attnconv.layers.mha import MultiHeadAttention
from attnconv.layers.mhsa2d import POSITIONALS, MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d
from attnconv.models import create_model

ERRORS = (ValueError, TypeError)
F64 = torch.float64


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------ helpers


def _event(label: str) -> None:
    if currently_in_test_context():
        event(label)


def attempt(fn, what: str = "call"):
    """fn() -> (result, None), or (None, error) for a ValueError/TypeError with a one-line
    message. Any other exception propagates and fails the test. ``what`` labels the outcome in
    hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    try:
        out = fn()
        _event(f"{what}: ok")
        return out, None
    except ERRORS as e:
        _event(f"{what}: {type(e).__name__}")
        msg = str(e).strip()
        assert msg, f"{type(e).__name__} without a message"
        assert "\n" not in msg, f"{type(e).__name__} message is not one line: {msg!r}"
        return None, e


def expect_error(fn) -> BaseException:
    out, err = attempt(fn)
    assert err is not None, f"expected a ValueError/TypeError, the call returned {type(out)}"
    return err


def _grads(layer: nn.Module, x: torch.Tensor, out: torch.Tensor, g: torch.Tensor):
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [x, *params], g, allow_unused=True)
    return [torch.zeros_like(t) if gr is None else gr for t, gr in zip([x, *params], grads)]


def assert_fast_equals_reference(fast: nn.Module, ref: nn.Module, x: torch.Tensor, **kw) -> None:
    """Same outputs and same gradients (input and every parameter) of two copies of a layer."""
    xf = x.detach().clone().requires_grad_(x.is_floating_point())
    xr = x.detach().clone().requires_grad_(x.is_floating_point())
    yf, yr = fast(xf, **kw), ref(xr, **kw)
    torch.testing.assert_close(yf, yr, rtol=1e-7, atol=1e-9)
    assert torch.isfinite(yf).all()
    g = torch.randn_like(yr)
    names = ["input"] + [n for n, p in ref.named_parameters() if p.requires_grad]
    for name, a, b in zip(names, _grads(fast, xf, yf, g), _grads(ref, xr, yr, g)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=lambda m, n=name: f"{n}: {m}")


def reference_copy(layer: nn.Module) -> nn.Module:
    ref = copy.deepcopy(layer)
    ref.impl = "reference"
    return ref


@st.composite
def image(draw, b, c, h, w, dtype=F64):
    """A (b, c, h, w) tensor in one of four memory layouts (the values do not depend on it)."""
    layout = draw(st.sampled_from(["contiguous", "channels_last", "transposed", "strided"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if layout == "transposed":
        return torch.randn(b, c, w, h, generator=gen, dtype=dtype).transpose(2, 3)
    if layout == "strided":
        return torch.randn(b, c, 2 * h, w, generator=gen, dtype=dtype)[:, :, ::2]
    x = torch.randn(b, c, h, w, generator=gen, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x


@st.composite
def perturb(draw, kw: dict, bad: dict) -> tuple[dict, str | None]:
    """kw unchanged half of the time, else with one argument replaced by a value from ``bad``."""
    if draw(st.booleans()):
        return kw, None
    name = draw(st.sampled_from(sorted(bad)))
    return kw | {name: draw(st.sampled_from(bad[name]))}, name


@st.composite
def perturb_input(draw, x: torch.Tensor):
    """x unchanged 2 times in 3, else a wrong type, dtype, rank, channel count or an empty one."""
    kind = draw(st.sampled_from([None] * 12 + list(BAD_INPUTS)))
    return (x, None) if kind is None else (BAD_INPUTS[kind](x), kind)


BAD_INPUTS = {
    "float32": lambda x: x.float(),
    "float16": lambda x: x.half(),
    "int": lambda x: x.long(),
    "bool": lambda x: x > 0,
    "complex": lambda x: x.to(torch.complex128),
    "rank-": lambda x: x[0],
    "rank+": lambda x: x[..., None],
    "channels": lambda x: torch.cat([x, x], 1),
    "empty": lambda x: x[:0],
    "empty-last": lambda x: x[..., :0],
    "list": lambda x: x.tolist(),
    "numpy": lambda x: x.detach().numpy(),
}
MODES = ["zeros", "replicate", "circular", "reflect"]
BAD_SIZE = [0, -1, 2.0, "2", None, True]


def check_layer(build, x, bad: str | None, bad_input: str | None, **kw) -> None:
    """The contract: a valid layer on a valid input works and fast == reference; otherwise it
    works and fast == reference, or the build/forward raises a clear error (and the reference
    path refuses the same input)."""
    layer, err = attempt(build, "build")
    if bad is None:
        assert err is None, f"valid configuration refused: {err}"
    if layer is None:
        return
    ref = reference_copy(layer)
    out, err = attempt(lambda: layer(x, **kw), "forward")
    if bad is None and bad_input is None:
        assert err is None, f"valid input refused: {err}"
    if err is not None:
        expect_error(lambda: ref(x, **kw))
        return
    assert_fast_equals_reference(layer, ref, x, **kw)


# --------------------------------------------------------------------- MultiHeadSelfAttention2d


@st.composite
def mhsa_config(draw):
    positional = draw(st.sampled_from(POSITIONALS))
    content = draw(st.booleans())
    value = draw(st.sampled_from(["linear", "identity"]))
    heads = draw(st.sampled_from([1, 2, 3, 5, 16, 64]))  # 64 heads on a 1x1 .. 5x5 image
    kw = dict(in_channels=draw(st.integers(1, 4)), num_heads=heads, positional=positional,
              content=content, value=value, max_size=5)  # fmt: skip
    if value == "identity":
        kw["out_channels"] = draw(st.integers(1, 4))
    elif draw(st.booleans()):
        kw["out_channels"] = heads * draw(st.integers(1, 2))  # head_dim = out_channels // Nh
    else:
        kw["out_channels"] = draw(st.integers(1, 4))
        kw["head_dim"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        kw["qk_dim"] = draw(st.integers(1, 3))
    if positional in ("relative", "relative_learned") and draw(st.booleans()):
        kw["rel_dim"] = draw(st.integers(1, 4))
    if positional == "relative":
        kw["learned_r"] = draw(st.booleans())
        terms = ["content_position", "global_content", "global_position"]
        terms += ["content_content"] if content else []
        kw["relative_terms"] = tuple(
            draw(st.lists(st.sampled_from(terms), min_size=1, max_size=4, unique=True))
        )
    if positional == "quadratic" and not content:
        kw["hard"] = draw(st.booleans())
    return kw


MHSA_BAD = {
    "in_channels": BAD_SIZE,
    "out_channels": BAD_SIZE,
    "num_heads": [*BAD_SIZE, 7],
    "positional": ["quadratc", "", None, "QUADRATIC"],
    "value": ["conv", None],
    "head_dim": [0, -1, 1.5, "2"],
    "qk_dim": [0, -3, 2.0],
    "dropout": [-0.1, 1.0, float("nan"), "0.1"],
    "impl": ["fast", None, "Auto"],
    "max_size": [0, -1, 1],
    "hard": [True],
    "rel_dim": [0, -1, 2.5],
    "relative_terms": [("content",), ()],
    "learned_r": [True],
}


@st.composite
def quadratic_params(draw, heads: int):
    """Centres up to 40 pixels outside a 5x5 image, precisions 1e-3 .. 1e3."""
    centers = draw(st.lists(st.floats(-40, 40), min_size=2 * heads, max_size=2 * heads))
    alpha = draw(st.lists(st.floats(1e-3, 1e3), min_size=heads, max_size=heads))
    return torch.tensor(centers, dtype=F64).view(heads, 2), torch.tensor(alpha, dtype=F64)


@fuzz(120)
@given(cfg=mhsa_config(), data=st.data())
def test_mhsa2d(cfg, data):
    """MultiHeadSelfAttention2d: every positional option x content x value layout."""
    d = data.draw
    kw, bad = d(perturb(cfg, MHSA_BAD))
    quad = d(quadratic_params(cfg["num_heads"])) if d(st.booleans()) else None
    seed = d(st.integers(0, 2**16))

    def build():
        torch.manual_seed(seed)
        layer = MultiHeadSelfAttention2d(**kw).double().eval()
        if quad is not None and layer.positional == "quadratic":
            with torch.no_grad():
                layer.positional_encoding.centers.copy_(quad[0])
                layer.positional_encoding.set_alpha(quad[1])
        return layer

    b, h, w = d(st.integers(1, 2)), d(st.integers(1, 5)), d(st.integers(1, 5))
    x, bad_input = d(perturb_input(d(image(b, cfg["in_channels"], h, w))))
    check_layer(build, x, bad, bad_input)
    if bad is None and bad_input is None:
        y, attn = build()(x, return_attention=True)
        assert y.shape == (b, cfg["out_channels"], h, w)
        assert attn.shape[1:] == (cfg["num_heads"], h * w, h * w)
        torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)))


# -------------------------------------------------------------------------- LocalSelfAttention2d


@st.composite
def local_config(draw):
    positional = draw(st.sampled_from(LOCAL_POSITIONALS))
    logits = "qk" if positional == "none" else draw(st.sampled_from(["qk+qr", "qr"]))
    heads = draw(st.sampled_from([1, 2, 8, 32]))
    dh = draw(st.sampled_from([4, 8] if positional == "absolute" else [2, 4]))
    return dict(
        in_channels=draw(st.integers(1, 3)),
        out_channels=heads * dh,
        num_heads=heads,
        kernel_size=draw(st.integers(1, 6)),  # windows larger than the image too
        stride=draw(st.integers(1, 2)),
        positional=positional,
        logits=logits,
        padding=draw(st.sampled_from(PADDINGS)),
    )


LOCAL_BAD = {
    "in_channels": BAD_SIZE,
    "out_channels": [*BAD_SIZE, 3],
    "num_heads": [*BAD_SIZE, 3],
    "kernel_size": [*BAD_SIZE, 2.5],
    "stride": [*BAD_SIZE, 9],
    "positional": ["learned", None],
    "logits": ["kq", ""],
    "padding": ["reflect", None],
    "impl": ["cuda", None],
}


@fuzz(70)
@given(cfg=local_config(), data=st.data())
def test_local(cfg, data):
    """LocalSelfAttention2d: every positional x logits x padding, windows larger than the image."""
    d = data.draw
    kw, bad = d(perturb(cfg, LOCAL_BAD))
    seed, s = d(st.integers(0, 2**16)), cfg["stride"]

    def build():
        torch.manual_seed(seed)
        return LocalSelfAttention2d(**kw).double()

    b, h, w = d(st.integers(1, 2)), d(st.integers(s, 5)), d(st.integers(s, 5))
    x, bad_input = d(perturb_input(d(image(b, cfg["in_channels"], h, w))))
    check_layer(build, x, bad, bad_input)
    if bad is None and bad_input is None:
        assert build()(x).shape == (b, cfg["out_channels"], -(-h // s), -(-w // s))  # ceil


# ------------------------------------------------------------------------------- AttentionStem2d

STEM_BAD = {
    "in_channels": BAD_SIZE,
    "out_channels": [*BAD_SIZE, 3],
    "num_heads": BAD_SIZE,
    "kernel_size": BAD_SIZE,
    "mixtures": BAD_SIZE,
    "pool": [*BAD_SIZE, 9],
    "padding": ["same", None],
    "impl": ["cuda"],
}


@fuzz(40)
@given(data=st.data())
def test_stem(data):
    """AttentionStem2d (spatially-aware values): kernels, mixtures, pooling, borders."""
    d = data.draw
    heads = d(st.integers(1, 4))
    pool = d(st.integers(1, 2))
    cfg = dict(in_channels=d(st.integers(1, 3)), out_channels=heads * d(st.integers(1, 3)),
               num_heads=heads, kernel_size=d(st.integers(1, 4)), mixtures=d(st.integers(1, 3)),
               pool=pool, padding=d(st.sampled_from(PADDINGS)), norm=d(st.booleans()))  # fmt: skip
    kw, bad = d(perturb(cfg, STEM_BAD))
    seed = d(st.integers(0, 2**16))

    def build():
        torch.manual_seed(seed)
        return AttentionStem2d(**kw).double().eval()

    x = d(image(d(st.integers(1, 2)), cfg["in_channels"], d(st.integers(pool, 5)),
                d(st.integers(pool, 5))))  # fmt: skip
    x, bad_input = d(perturb_input(x))
    check_layer(build, x, bad, bad_input)


# ---------------------------------------------------------------------------- MultiHeadAttention

MHA_BAD = {
    "embed_dim": [*BAD_SIZE, 3],
    "num_heads": [*BAD_SIZE, 3],
    "kdim": [0, -1, 2.0],
    "vdim": [0, -1, "3"],
    "dropout": [-0.5, 1.0],
    "impl": ["fast"],
}
MHA_FAULTS = ["dtype", "mask", "mask_dtype", "batch", "rank", "length", "list"]


@fuzz(60)
@given(data=st.data())
def test_mha(data):
    """MultiHeadAttention: self/cross attention, causal, key padding, huge head counts."""
    d = data.draw
    heads = d(st.sampled_from([1, 2, 4, 32]))
    cfg = dict(embed_dim=heads * d(st.integers(1, 2)), num_heads=heads,
               kdim=d(st.one_of(st.none(), st.integers(1, 3))),
               vdim=d(st.one_of(st.none(), st.integers(1, 3))))  # fmt: skip
    kw, bad = d(perturb(cfg, MHA_BAD))
    seed = d(st.integers(0, 2**16))
    b, tq, tk = d(st.integers(1, 2)), d(st.integers(1, 5)), d(st.integers(1, 5))
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1)))
    kdim = cfg["kdim"] or cfg["embed_dim"]
    vdim = cfg["vdim"] or kdim
    query = torch.randn(b, tq, cfg["embed_dim"], generator=gen, dtype=F64)
    key = torch.randn(b, tk, kdim, generator=gen, dtype=F64)
    value = torch.randn(b, tk, vdim, generator=gen, dtype=F64)
    mask = torch.rand(b, tk, generator=gen) < 0.4 if d(st.booleans()) else None  # rows may be
    causal = d(st.booleans())  # fully padded: zeros, not NaN
    fault = d(st.sampled_from([None] * 7 + MHA_FAULTS))
    if fault == "dtype":
        query = query.float()
    elif fault == "mask":
        mask = torch.zeros(b, tk + 1, dtype=torch.bool)
    elif fault == "mask_dtype":
        mask = torch.zeros(b, tk)
    elif fault == "batch":
        key = key[:1].expand(b + 1, -1, -1)
    elif fault == "rank":
        query = query[0]
    elif fault == "length":
        value = value[:, :-1] if tk > 1 else value.repeat(1, 2, 1)
    elif fault == "list":
        query = query.tolist()

    def build():
        torch.manual_seed(seed)
        return _MHA(MultiHeadAttention(**kw).double(), key, value, mask, causal)

    check_layer(build, query, bad, fault)


class _MHA(nn.Module):
    """MultiHeadAttention with fixed key, value, mask and causal flag: query -> output."""

    def __init__(self, mha: MultiHeadAttention, key, value, mask, causal):
        super().__init__()
        self.mha, self.key, self.value, self.mask, self.causal = mha, key, value, mask, causal

    @property
    def impl(self):
        return self.mha.impl

    @impl.setter
    def impl(self, impl):
        self.mha.impl = impl

    def forward(self, query):
        return self.mha(query, self.key, self.value, key_padding_mask=self.mask, causal=self.causal)


# ------------------------------------------------------------------------ convert.conv_to_attention


@pytest.mark.filterwarnings("ignore:conv_to_attention. head_dim")  # rank-limited: expected
@fuzz(60)
@given(data=st.data())
def test_conv_to_attention(data):
    """Any Conv1d/Conv2d (1x1 kernels, 1xW and Hx1 images, images smaller than the kernel) with
    any alpha/head_dim: the converted module equals the conv, its fast shift path equals the
    layer's reference path, or a clear error."""
    d = data.draw
    ndim = d(st.sampled_from([1, 2]))
    groups = d(st.sampled_from([1, 2]))
    cin, cout = groups * d(st.integers(1, 2)), groups * d(st.integers(1, 2))
    cls = nn.Conv2d if ndim == 2 else nn.Conv1d
    conv = cls(cin, cout, tuple(d(st.integers(1, 3)) for _ in range(ndim)),
               stride=d(st.integers(1, 2)), padding=d(st.integers(0, 2)),
               dilation=d(st.integers(1, 2)), groups=groups, bias=d(st.booleans()),
               padding_mode=d(st.sampled_from(MODES))).double()  # fmt: skip
    cfg = dict(alpha=None, head_dim=None)
    if d(st.booleans()):
        cfg["alpha"] = d(st.sampled_from([1e4, 1e6]))
    if d(st.booleans()):
        cfg["head_dim"] = d(st.sampled_from([1, cin * 9]))  # rank-limited or exact
    kw, bad = d(perturb(cfg, {"alpha": [0.0, -1.0, float("inf"), float("nan"), "1"],
                              "head_dim": [0, -2, 1.5, "1"], "impl": ["fast"]}))  # fmt: skip
    target = conv
    if d(st.integers(0, 9)) == 0:
        target, bad = d(st.sampled_from([nn.Linear(2, 2), "conv", nn.Conv3d(1, 1, 1)])), "target"
    m, err = attempt(lambda: conv_to_attention(target, **kw), "build")
    if bad is None:
        assert err is None, err
    if m is None:
        return
    sizes = []
    for k, dil, pad in zip(conv.kernel_size, conv.dilation, conv.padding):
        need = max(1, dil * (k - 1) + 1 - 2 * pad, pad + 1)  # the conv's smallest input
        small = d(st.integers(0, 5)) == 0  # sometimes smaller than the kernel allows
        sizes.append(d(st.integers(1, 2)) if small else need + d(st.integers(0, 3)))
    x = torch.randn(d(st.integers(1, 2)), cin, *sizes, dtype=F64)
    x, bad_input = d(perturb_input(x))
    try:
        expected = conv(x) if bad_input is None else None
    except RuntimeError:  # PyTorch's own message: image smaller than the (dilated) kernel
        expected = None
    y, err = attempt(lambda: m(x), "forward")
    if expected is not None:  # a valid input of the conv: the converted module must accept it
        assert err is None, err
    if err is not None:
        return
    assert bad_input is None, f"{bad_input} input accepted"
    assert expected is not None, "converted module accepted an image its conv refuses"
    scale = expected.abs().max().clamp_min(1.0)
    tol = 1e-9 if kw["alpha"] is None else 1e-5  # hard: exact; alpha >= 1e4: Lemma 2 converged
    if kw["head_dim"] in (None, cin * 9):  # head_dim >= rank: exact (Theorem 1)
        assert ((y - expected).abs().max() / scale).item() <= tol
    ref = copy.deepcopy(m)
    ref.attention.impl = "reference"
    assert_fast_equals_reference(m, ref, x)


# ------------------------------------------------- functional.scaled_dot_product_attention

SDPA_FAULTS = ["dtype", "int", "rank", "heads", "width", "length", "mask_dtype", "mask_shape",
               "bias_shape", "bias_int", "dropout", "impl", "list"]  # fmt: skip


@fuzz(50)
@given(data=st.data())
def test_scaled_dot_product_attention(data):
    """The shared kernel: bias, boolean mask (rows may be fully masked), causal, dk != dv,
    broadcast batch/heads, dk = 0 (position-only); or one fault -> a clear error."""
    d = data.draw
    b, nh, tq, tk = (d(st.integers(1, 2)), d(st.sampled_from([1, 2, 16])), d(st.integers(1, 5)),
                     d(st.integers(1, 5)))  # fmt: skip
    dk, dv = d(st.integers(0, 4)), d(st.integers(1, 4))
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1)))

    def rnd(*shape, dtype=F64):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q, k, v = rnd(b, nh, tq, dk), rnd(d(st.sampled_from([1, b])), nh, tk, dk), rnd(b, nh, tk, dv)
    kw = dict(causal=d(st.booleans()), impl="auto")
    if d(st.booleans()):
        kw["bias"] = rnd(*d(st.sampled_from([(tq, tk), (1, nh, tq, tk), (b, 1, 1, tk)])))
    if d(st.booleans()):
        kw["mask"] = torch.rand(b, 1, tq, tk, generator=gen) < 0.6
    fault = d(st.sampled_from([None] * 13 + SDPA_FAULTS))
    if fault == "dtype":
        v = v.float()
    elif fault == "int":
        q = q.long()
    elif fault == "rank":
        q = q[0]
    elif fault == "heads":
        k = rnd(b, nh + 1, tk, dk)
    elif fault == "width":
        k = rnd(b, nh, tk, dk + 1)
    elif fault == "length":
        v = rnd(b, nh, tk + 1, dv)
    elif fault == "mask_dtype":
        kw["mask"] = torch.ones(tq, tk)
    elif fault == "mask_shape":
        kw["mask"] = torch.ones(tq + 1, tk, dtype=torch.bool)
    elif fault == "bias_shape":
        kw["bias"] = rnd(tq, tk + 2)
    elif fault == "bias_int":
        kw["bias"] = torch.zeros(tq, tk, dtype=torch.long)
    elif fault == "dropout":
        kw["dropout_p"] = d(st.sampled_from([-0.1, 1.0, 2.0]))
    elif fault == "impl":
        kw["impl"] = "flash"
    elif fault == "list":
        q = q.tolist()

    out, err = attempt(lambda: scaled_dot_product_attention(q, k, v, **kw), "call")
    if fault is None:
        assert err is None, err
    if err is not None:
        if fault != "impl":  # the plain path refuses the same arguments
            expect_error(
                lambda: scaled_dot_product_attention(q, k, v, **kw | {"impl": "reference"})
            )
        return
    ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    y = scaled_dot_product_attention(*ins, **kw)
    yr = scaled_dot_product_attention(*refs, **kw | {"impl": "reference"})
    torch.testing.assert_close(y, yr, rtol=1e-7, atol=1e-9)
    assert torch.isfinite(y).all()  # fully masked rows: zeros, not NaN
    g = torch.randn_like(yr)
    ga = torch.autograd.grad(y, ins, g, allow_unused=True)
    gr = torch.autograd.grad(yr, refs, g, allow_unused=True)
    for a, r, t in zip(ga, gr, ins):
        a, r = (torch.zeros_like(t) if x is None else x for x in (a, r))
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------- faults

MHSA_FAULTS = [
    dict(in_channels=0),
    dict(in_channels=-1),
    dict(in_channels=2.0),
    dict(num_heads=0),
    dict(num_heads=True),
    dict(out_channels=None),
    dict(positional="rotary"),
    dict(value="conv"),
    dict(impl="cuda"),
    dict(dropout=1.0),
    dict(dropout=float("nan")),
    dict(head_dim=0),
    dict(qk_dim=-1),
    dict(max_size=0),
    dict(positional="relative", rel_dim=0),
    dict(positional="quadratic", content=True, hard=True),
    dict(positional="none", relative_terms=("content_position",)),
    dict(num_heads=3),  # 4 out channels, no head_dim
]


@pytest.mark.parametrize(
    "bad", MHSA_FAULTS, ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items())
)
def test_mhsa2d_fault_raises_clearly(bad):
    kw = dict(in_channels=2, out_channels=4, num_heads=2) | bad
    expect_error(lambda: MultiHeadSelfAttention2d(**kw))


FIXED_BAD_INPUTS = {
    "float32 into float64": lambda c: torch.randn(1, c, 3, 3),
    "int": lambda c: torch.ones(1, c, 3, 3, dtype=torch.long),
    "bool": lambda c: torch.ones(1, c, 3, 3, dtype=torch.bool),
    "complex": lambda c: torch.randn(1, c, 3, 3, dtype=torch.complex128),
    "3-D": lambda c: torch.randn(c, 3, 3, dtype=F64),
    "5-D": lambda c: torch.randn(1, c, 3, 3, 1, dtype=F64),
    "channels": lambda c: torch.randn(1, c + 1, 3, 3, dtype=F64),
    "empty batch": lambda c: torch.randn(0, c, 3, 3, dtype=F64),
    "empty H": lambda c: torch.randn(1, c, 0, 3, dtype=F64),
    "list": lambda c: [[0.0] * c],
    "numpy": lambda c: torch.randn(1, c, 3, 3, dtype=F64).numpy(),
}
LAYERS = {
    "mhsa2d": lambda: MultiHeadSelfAttention2d(2, 4, 2, positional="quadratic"),
    "mhsa2d-position-only": lambda: MultiHeadSelfAttention2d(
        2, 4, 2, positional="relative_learned", content=False, max_size=4
    ),  # fmt: skip
    "local": lambda: LocalSelfAttention2d(2, 4, 2, kernel_size=3),
    "stem": lambda: AttentionStem2d(2, 4, 2, kernel_size=3, pool=1),
    "conv_to_attention": lambda: conv_to_attention(nn.Conv2d(2, 4, 3, padding=1)),
}


@pytest.mark.parametrize("inp", FIXED_BAD_INPUTS)
@pytest.mark.parametrize("layer", LAYERS)
def test_bad_inputs_raise_clearly(layer, inp):
    m = LAYERS[layer]().double()
    for impl in ("auto", "reference"):
        target = m.attention if layer == "conv_to_attention" else m
        target.impl = impl
        expect_error(lambda: m(FIXED_BAD_INPUTS[inp](2)))


def test_learned_tables_refuse_larger_images():
    m = MultiHeadSelfAttention2d(2, 4, 2, positional="absolute_learned", max_size=3).double()
    err = expect_error(lambda: m(torch.randn(1, 2, 4, 3, dtype=F64)))
    assert "max_size=3" in str(err)


MODELS = ["tiny_cnn", "resnet18_cifar", "sa_quadratic", "sa_learned_content", "vit_tiny_cifar",
          "sasa_resnet26_cifar", "resnet26_cifar"]  # fmt: skip
MODEL_INPUTS = {
    "float64": lambda: torch.randn(1, 3, 32, 32, dtype=F64),
    "int": lambda: torch.ones(1, 3, 32, 32, dtype=torch.long),
    "3-D": lambda: torch.randn(3, 32, 32),
    "channels": lambda: torch.randn(1, 4, 32, 32),
    "empty": lambda: torch.randn(0, 3, 32, 32),
    "list": lambda: [[1.0]],
}


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {name: create_model(name, num_classes=10).eval() for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_models_refuse_bad_images_clearly(models, name):
    """create_model(...) models: each bad image batch gives its one-line error; a good one runs."""
    m = models[name]
    for make in MODEL_INPUTS.values():
        x = make()
        expect_error(lambda x=x: m(x))
    with torch.no_grad():
        assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize(
    "name,bad",
    [("sa_quadratic", {"num_classes": 0}), ("sa_quadratic", {"num_heads": True}),
     ("vit_tiny_cifar", {"patch_size": 0}), ("vit_tiny_cifar", {"num_classes": -1}),
     ("vit_tiny_cifar", {"depth": 0}), ("resnet18_cifar", {"in_chans": 0}),
     ("tiny_cnn", {"width": 2.5}), ("transformer_small", {"num_heads": 0}),
     ("sasa_resnet26_cifar", {"kernel_size": 0}), ("sa_learned", {"no_such_option": 1})],
)  # fmt: skip
def test_create_model_refuses_bad_sizes_clearly(name, bad):
    err = expect_error(lambda: create_model(name, **bad))
    assert next(iter(bad)) in str(err)
