"""Fuzzing the public layers with hypothesis (issue 8, "input validation across the public API").

Every call either works -- and then the fast path (the plan's kernel) equals the plain reference
(backend="reference") in values and in the gradients of the input and of every parameter, float64 --
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

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.local import PADDINGS, LocalSelfAttention2d
from attnconv.layers.local import SASA_POSITIONALS as LOCAL_POSITIONALS
from attnconv.layers.mhsa2d import POSITIONALS, MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d
from fuzz_helpers import BAD_SIZE, F64, check_layer, fuzz, image, perturb, perturb_input

# --------------------------------------------------------------------- MultiHeadSelfAttention2d


@st.composite
def mhsa_config(draw):
    positional = draw(st.sampled_from(POSITIONALS))
    content = draw(st.booleans())
    value = draw(st.sampled_from(["linear", "identity"]))
    heads = draw(st.sampled_from([1, 2, 3, 5, 16, 64]))  # 64 heads on a 1x1 .. 5x5 image
    kw = dict(
        in_channels=draw(st.integers(1, 4)),
        num_heads=heads,
        positional=positional,
        content=content,
        value=value,
        max_size=5,
    )
    if value == "identity":
        kw["out_channels"] = draw(st.integers(1, 4))
    elif draw(st.booleans()):
        kw["out_channels"] = heads * draw(st.integers(1, 2))  # head_dim = out_channels // Nh
    else:
        kw["out_channels"] = draw(st.integers(1, 4))
        kw["head_dim"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        kw["qk_dim"] = draw(st.integers(1, 3))
    # relative_learned with content: the query's halves are its tables (no rel_dim to take)
    takes_rel_dim = positional == "relative" or (positional == "relative_learned" and not content)
    if takes_rel_dim and draw(st.booleans()):
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
    "backend": ["fast", "Auto"],
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
    "backend": ["cuda"],
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
    "backend": ["cuda"],
}


@fuzz(40)
@given(data=st.data())
def test_stem(data):
    """AttentionStem2d (spatially-aware values): kernels, mixtures, pooling, borders."""
    d = data.draw
    heads = d(st.integers(1, 4))
    pool = d(st.integers(1, 2))
    cfg = dict(
        in_channels=d(st.integers(1, 3)),
        out_channels=heads * d(st.integers(1, 3)),
        num_heads=heads,
        kernel_size=d(st.integers(1, 4)),
        mixtures=d(st.integers(1, 3)),
        pool=pool,
        padding=d(st.sampled_from(PADDINGS)),
        norm=d(st.booleans()),
    )
    kw, bad = d(perturb(cfg, STEM_BAD))
    seed = d(st.integers(0, 2**16))

    def build():
        torch.manual_seed(seed)
        return AttentionStem2d(**kw).double().eval()

    x = d(
        image(
            d(st.integers(1, 2)),
            cfg["in_channels"],
            d(st.integers(pool, 5)),
            d(st.integers(pool, 5)),
        )
    )
    x, bad_input = d(perturb_input(x))
    check_layer(build, x, bad, bad_input)
