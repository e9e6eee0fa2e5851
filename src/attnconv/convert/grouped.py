"""Grouped and depthwise convolutions kept cheap after conversion (Theorem 1, Lemma 1).

A grouped conv's W^(h) = Wval^(h) Wout_h is block-diagonal: output group j reads input group j
only. Stored dense, a converted 7x7 depthwise conv on C channels would hold 49 C^2 weights
instead of 49 C. ``GroupedHeadProjection`` stores, per head, only the diagonal blocks
(Nh, Cout, Cin/g), exactly the conv kernel's entries, and builds the dense (Cout, Nh*Cin) Wout on
access for the attention layer's plain paths; the hard fast path mixes channels with grouped
1x1 convolutions (``grouped_head_mix``), never densifying.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class GroupedHeadProjection(nn.Module):
    """Wout of a converted grouped conv: ``kernel`` (Nh, Cout, Cin/g) holds each head's
    diagonal blocks, ``weight`` the dense (Cout, Nh*Cin) matrix [W^(1) ... W^(Nh)]."""

    def __init__(self, kernel: torch.Tensor, groups: int, bias: torch.Tensor | None):
        super().__init__()
        self.groups = groups
        self.kernel = nn.Parameter(kernel.clone())  # (Nh, Cout, Cin/g)
        self.bias = nn.Parameter(bias.clone()) if bias is not None else None
        nh, cout, cin_g = kernel.shape
        self.in_features, self.out_features = nh * cin_g * groups, cout

    @property
    def weight(self) -> torch.Tensor:
        """Dense (Cout, Nh*Cin): zeros outside each head's diagonal blocks."""
        nh, cout, cin_g = self.kernel.shape
        g, og = self.groups, cout // self.groups
        blocks = self.kernel.reshape(nh, g, og, cin_g)  # (Nh, g, Cout/g, Cin/g)
        eye = torch.eye(g, dtype=blocks.dtype, device=blocks.device)  # group j -> group j
        dense = blocks[:, :, :, None, :] * eye[None, :, None, :, None]  # (Nh, g, og, g, Cin/g)
        return dense.reshape(nh, cout, g * cin_g).permute(1, 0, 2).reshape(cout, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        nh, cout, cin_g = self.kernel.shape
        return f"heads={nh}, out={cout}, in_per_group={cin_g}, groups={self.groups}"


CHUNK_FLOATS = 1 << 18  # depthwise inference works on (channels x padded image) blocks of
# about 1 MB, so the Nh passes of one block stay in L2 (not the whole tensor streamed Nh times)


def grouped_head_mix(xp: torch.Tensor, shift, proj: GroupedHeadProjection) -> torch.Tensor:
    """sum_h SA_h(X) W^(h) (+ b) for hard heads. xp (B, Cin, Hp, Wp) is the padded input and
    ``shift(t, h)`` slices head h's pixels out of t (..., Hp, Wp) -> (..., Ho, Wo). Each W^(h)
    runs as a grouped 1x1 convolution, or, depthwise, a per-channel scale accumulated block by
    block (inference) so that the heads' passes stay in cache."""
    nh, cout, cin_g = proj.kernel.shape
    depthwise = cin_g == 1 and proj.groups == cout == xp.shape[1]
    if depthwise and not torch.is_grad_enabled():
        b, c, hp, wp = xp.shape
        flat = xp.contiguous().view(b * c, hp, wp)  # (B*C, Hp, Wp), channel = row % C
        w = proj.kernel[:, :, 0].repeat(1, b)  # (Nh, B*C)
        y = xp.new_empty(b * c, *shift(flat[:1], 0).shape[-2:])
        cb = max(1, CHUNK_FLOATS // (hp * wp))
        for r0 in range(0, b * c, cb):
            xb, yb, wb = flat[r0 : r0 + cb], y[r0 : r0 + cb], w[:, r0 : r0 + cb, None, None]
            torch.mul(shift(xb, 0), wb[0], out=yb)
            for h in range(1, nh):
                yb.addcmul_(shift(xb, h), wb[h])
        y = y.view(b, c, *y.shape[-2:])
    else:
        y = None
        for h in range(nh):
            xs, wh = shift(xp, h), proj.kernel[h]  # (B, Cin, Ho, Wo), (Cout, Cin/g)
            if depthwise:
                t = xs * wh[None, :, 0, None, None]
            else:
                t = F.conv2d(xs, wh[:, :, None, None], groups=proj.groups)
            y = t if y is None else y + t
    if proj.bias is not None:
        y = y + proj.bias[None, :, None, None]
    return y
