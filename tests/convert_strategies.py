"""Hypothesis strategies for random Conv1d/Conv2d configurations (shared by tests/test_convert*)."""

from __future__ import annotations

import torch
import torch.nn as nn
from hypothesis import assume
from hypothesis import strategies as st

MODES = ("zeros", "reflect", "replicate", "circular")


@st.composite
def conv_and_input(draw, ndim: int | None = None, dtype=torch.float64, max_channels: int = 3):
    """A random nn.Conv1d/Conv2d (every option) and an input it accepts, in ``dtype``."""
    ndim = draw(st.sampled_from([1, 2])) if ndim is None else ndim
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cin = groups * draw(st.integers(1, max_channels))
    cout = groups * draw(st.integers(1, max_channels))
    kernel = tuple(draw(st.integers(1, 7)) for _ in range(ndim))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    kind = draw(st.sampled_from(["int", "tuple", "same", "valid"]))
    if kind == "same":
        stride = (1,) * ndim  # PyTorch forbids padding="same" with stride > 1
        padding = "same"
    elif kind == "valid":
        padding = "valid"
    elif kind == "int":
        padding = draw(st.integers(0, 4))
    else:
        padding = tuple(draw(st.integers(0, 4)) for _ in range(ndim))
    mode = draw(st.sampled_from(MODES))
    bias = draw(st.booleans())
    cls = nn.Conv2d if ndim == 2 else nn.Conv1d
    conv = cls(
        cin,
        cout,
        kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=bias,
        padding_mode=mode,
    )
    conv = conv.to(dtype)
    # an odd-ish spatial size the conv accepts
    pads = conv._reversed_padding_repeated_twice  # (left, right[, top, bottom]) reversed dims
    sizes = []
    for i in range(ndim):
        d, k = dilation[i], kernel[i]
        lo, hi = pads[2 * (ndim - 1 - i)], pads[2 * (ndim - 1 - i) + 1]
        need = max(1, d * (k - 1) + 1 - lo - hi, max(lo, hi) + 1)  # reflect needs pad < size
        sizes.append(need + draw(st.integers(0, 6)))
    assume(all(s <= 24 for s in sizes))
    batch = draw(st.integers(1, 2))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype))
    x = torch.randn(batch, cin, *sizes, generator=gen, dtype=dtype)
    return conv, x
