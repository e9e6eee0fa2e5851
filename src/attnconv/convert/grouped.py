"""Grouped and depthwise convolutions kept cheap after conversion (Theorem 1, Lemma 1).

A grouped conv's W^(h) = Wval^(h) Wout_h is block-diagonal: output group j reads input group j
only. Stored dense, a converted 7x7 depthwise conv on C channels would hold 49 C^2 weights
instead of 49 C. ``GroupedHeadProjection`` stores, per head, only the diagonal blocks
(Nh, Cout, Cin/g), exactly the conv kernel's entries, and builds the dense (Cout, Nh*Cin) Wout on
access for the attention layer's plain paths; the hard fast path (``grouped_head_mix``) never
densifies: depthwise heads accumulate channels-last, grouped heads are batched matmuls over
the groups on the flattened image, each beside the plain loop it equals
(``grouped_head_mix_reference``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnconv.layers.precision import autocast_dtype, no_autocast

from .head_conv import one_step, take


class GroupedHeadProjection(nn.Module):
    """Wout of a converted grouped conv: ``kernel`` (Nh, Cout, Cin/g) holds each head's
    diagonal blocks (contiguous, so ``parameters_to_vector`` can view it), ``weight`` the dense
    (Cout, Nh*Cin) matrix [W^(1) ... W^(Nh)]."""

    def __init__(self, kernel: torch.Tensor, groups: int, bias: torch.Tensor | None):
        super().__init__()
        self.groups = groups
        self.kernel = nn.Parameter(kernel.clone(memory_format=torch.contiguous_format))
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


def grouped_head_mix(xp: torch.Tensor, rows: list, cols: list, proj) -> torch.Tensor:
    """sum_h SA_h(X) W^(h) (+ b) for hard heads (Lemma 1), the fast kernels.

    xp (B, Cin, Hp, Wp) is the padded input; head h attends to pixel (rows[h][o], cols[h][p]) of
    it for output (o, p): rows[h] / cols[h] are slices (a strided view) or index lists (a
    clamped border). Returns (B, Cout, Ho, Wo), channels_last from the fast kernels (as the
    dense hard path's). Equals ``grouped_head_mix_reference`` (values and gradients).
    """
    nh, cout, cin_g = proj.kernel.shape
    slices = one_step(rows) and one_step(cols)  # strided views with the conv's stride
    if cin_g == 1 and proj.groups == cout == xp.shape[1]:  # depthwise: W^(h) diagonal
        y = depthwise_mix(xp, rows, cols, proj.kernel[:, :, 0])
    elif nh > 1 and slices:
        y = grouped_flat_mix(xp, rows, cols, proj.kernel, proj.groups)
    else:  # one head (a grouped 1x1 conv) or clamped borders: the plain loop
        return grouped_head_mix_reference(xp, rows, cols, proj)
    if proj.bias is not None:
        y = y + proj.bias[None, :, None, None]
    # heads summed in fp32, the output in the autocast dtype, as a conv's
    return y.to(autocast_dtype(xp.device.type, y.dtype))


def depthwise_mix(xp: torch.Tensor, rows: list, cols: list, w: torch.Tensor) -> torch.Tensor:
    """Depthwise heads, channels-last: y = sum_h SA_h(X) * w_h, w (Nh, C) the diagonals of
    W^(h). Each SA_h(X) is a (B, Ho, Wo, C) view of the (B, Hp, Wp, C) input (the stride is in
    the slice), so every head is one vectorized multiply-add over contiguous channels."""
    xl = xp.permute(0, 2, 3, 1)  # (B, Hp, Wp, C): a view when xp is channels_last
    if not xl.is_contiguous():
        xl = xl.contiguous()
    y = None
    for h in range(w.shape[0]):
        v = take(take(xl, 1, rows[h]), 2, cols[h])  # SA_h(X): (B, Ho, Wo, C)
        y = v * w[h] if y is None else y.addcmul_(v, w[h])  # + X_{q+f(h)} W^(h)
    return y.permute(0, 3, 1, 2)  # (B, C, Ho, Wo), channels_last


def grouped_flat_mix(
    xp: torch.Tensor, rows: list, cols: list, kernel: torch.Tensor, groups: int
) -> torch.Tensor:
    """Grouped heads as Nh batched matmuls over the groups, on the flattened padded image.

    The stride (sh, sw) is taken out by splitting the padded image into its sh*sw phases
    (pixel (i, j) -> phase (i % sh, j % sw), position (i // sh, j // sw)), so that every head
    reads one phase at a fixed offset, off_h = (r0_h // sh) * Wq + c0_h // sw, for every
    output. Laid out (Cin, phase, B*Hq*Wq), SA_h(X) for all the queries of the phase grid is
    then one contiguous slice of length m = B*Hq*Wq - max_h off_h (no copy), and
    y[:, q] = sum_h W^(h) x_h[:, q + off_h] (block-diagonal W^(h): a bmm over the groups).
    The conv's outputs are the queries (b, o, p), o < Ho, p < Wo, a strided view of y (all
    below m since every head's pixel is inside the image; the rest is never read).
    """
    nh, cout, cin_g = kernel.shape
    b, cin, hp, wp = xp.shape
    sh, sw = rows[0].step, cols[0].step
    oh, ow = len(range(hp)[rows[0]]), len(range(wp)[cols[0]])
    hq, wq = -(-hp // sh), -(-wp // sw)  # phase grid
    if hq * sh != hp or wq * sw != wp:  # whole phases (the added pixels are never read)
        xp = F.pad(xp, (0, wq * sw - wp, 0, hq * sh - hp))
    span = b * hq * wq
    xq = xp.reshape(b, cin, hq, sh, wq, sw).permute(1, 3, 5, 0, 2, 4)  # (Cin, sh, sw, B, Hq, Wq)
    xf = xq.reshape(groups, cin_g, sh * sw, span)  # one copy
    phase = [(r.start % sh) * sw + c.start % sw for r, c in zip(rows, cols)]
    offs = [(r.start // sh) * wq + c.start // sw for r, c in zip(rows, cols)]
    m = span - max(offs)
    wg = kernel.reshape(nh, groups, cout // groups, cin_g)  # (Nh, g, Cout/g, Cin/g)
    xf = xf.to(torch.promote_types(xf.dtype, wg.dtype))  # autocast: sum the heads in fp32,
    y = None  # as a conv accumulates its taps (the in-place sum is not autocast)
    with no_autocast(xp.device.type):
        for h in range(nh):
            v = xf[:, :, phase[h], offs[h] : offs[h] + m]  # SA_h(X), every query: (g, Cin/g, m)
            y = torch.bmm(wg[h], v) if y is None else y.baddbmm_(wg[h], v)  # (g, Cout/g, m)
    y = y.reshape(cout, m).as_strided((cout, b, oh, ow), (m, hq * wq, wq, 1))  # the outputs
    return y.permute(1, 0, 2, 3).contiguous(memory_format=torch.channels_last)


def grouped_head_mix_reference(xp: torch.Tensor, rows: list, cols: list, proj) -> torch.Tensor:
    """The plain loop: SA_h(X) = xp[:, :, rows[h], cols[h]], W^(h) as a grouped 1x1 conv,
    summed over the heads (+ b)."""
    y = None
    for h in range(proj.kernel.shape[0]):
        xs = take(take(xp, 2, rows[h]), 3, cols[h])  # (B, Cin, Ho, Wo)
        t = F.conv2d(xs, proj.kernel[h][:, :, None, None], groups=proj.groups)
        y = t if y is None else y + t
    if proj.bias is not None:
        y = y + proj.bias[None, :, None, None]
    return y
