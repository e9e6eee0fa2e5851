"""The pure parts of Theorem 1 (Cordonnier et al., ICLR 2020, sec. 3): conv geometry <-> heads.

Lemma 1: with Nh = Kh*Kw heads and a bijection f from heads to the kernel's shifts, head h
attending only to pixel q + f(h) gives ``MHSA(X)_q = sum_h X_{q+f(h)} W^(h) + b_out``, where
``W^(h) = Wval^(h) Wout[h-th block]``. Choosing W^(h) = the kernel at shift f(h) gives the conv.

Borders: the input is padded exactly as the conv pads it; attention runs on the
padded image; the stride-1 "valid" result is the attention output cropped by the anchor, and a
strided conv is that result subsampled. Dilation d multiplies the shifts by d; a grouped conv has
block-diagonal W^(h). Conv1d is Conv2d on a (1, L) image whose shifts have row 0.

Everything here is plain tensor code with no attention layer, so it can be checked against
``F.conv2d`` on its own (``shift_conv_reference``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about a Conv1d/Conv2d except its weights, in 2-D form ((1, K) for Conv1d).

    Args:
        in_channels: the conv's input channels, Cin.
        out_channels: its output channels, Cout.
        kernel: (Kh, Kw); (1, K) for a Conv1d.
        stride: (rows, cols).
        dilation: (rows, cols).
        pad: the input padding in ``F.pad`` order (left, right, top, bottom).
        padding_mode: "zeros", "reflect", "replicate" or "circular".
        groups: the conv's groups.
        ndim: 1 for a Conv1d, 2 for a Conv2d.
        padding: the conv's own ``padding`` argument (int, tuple, "same" or "valid").
        dynamic_same: TensorFlow's "SAME" padding, recomputed for every input size.
    """

    in_channels: int
    out_channels: int
    kernel: tuple[int, int]  # (Kh, Kw)
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad: tuple[int, int, int, int]  # F.pad order: (left, right, top, bottom)
    padding_mode: str
    groups: int
    ndim: int  # 1 (Conv1d) or 2 (Conv2d)
    padding: object = 0  # the conv's own `padding` argument (int, tuple or "same"/"valid")
    # TensorFlow's "SAME": padding computed per input size, the odd pixel right/bottom
    # (padding is part of attention's geometry, so it is recomputed for every input)
    dynamic_same: bool = False

    @property
    def num_heads(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def anchor(self) -> tuple[int, int]:
        """Query pixel (in the padded image) of output (0, 0): the kernel's (dilated) centre."""
        return (
            self.dilation[0] * (self.kernel[0] - 1) // 2,
            self.dilation[1] * (self.kernel[1] - 1) // 2,
        )

    def centers(self) -> torch.Tensor:
        """(Nh, 2) integer (row, col) shifts ``f(h) = (kh*dh - ah, kw*dw - aw)``, head
        ``h = kh*Kw + kw``."""
        kh = torch.arange(self.kernel[0]).repeat_interleave(self.kernel[1])
        kw = torch.arange(self.kernel[1]).repeat(self.kernel[0])
        rows = kh * self.dilation[0] - self.anchor[0]
        cols = kw * self.dilation[1] - self.anchor[1]
        return torch.stack([rows, cols], dim=1)  # (Nh, 2)

    @property
    def conv_padding(self):
        """The ``padding`` of an nn.Conv2d / nn.Conv1d that pads as this geometry does: the
        conv's own argument when it gives ``pad`` (or for TensorFlow "SAME", ``dynamic_same``);
        else (top, left) / (left,) for a symmetric pad, "same" for nn.Conv's own "same" split
        (stride 1, the odd pixel right/bottom), else ``pad`` itself in F.pad order (left,
        right, top, bottom) / (left, right), which no nn.Conv argument expresses."""
        if self.dynamic_same or self._own_padding_pads():
            return self.padding
        left, right, top, bottom = self.pad
        if left == right and top == bottom:
            return (top, left) if self.ndim == 2 else (left,)
        same = _resolve_padding(SimpleNamespace(padding="same"), self.kernel, self.dilation, 2)
        if self.stride == (1, 1) and self.pad == same:
            return "same"
        return self.pad if self.ndim == 2 else self.pad[:2]

    def _own_padding_pads(self) -> bool:
        """The conv's own ``padding`` argument gives ``pad`` (not so for a traced forward that
        pads with F.pad or a padding_mode before an unpadded F.conv2d)."""
        own = (self.padding,) * self.ndim if isinstance(self.padding, int) else self.padding
        if not isinstance(own, str):
            if len(own) != self.ndim:
                return False
            own = tuple(own) if self.ndim == 2 else (0, *own)
        ns = SimpleNamespace(padding=own)
        return _resolve_padding(ns, self.kernel, self.dilation, 2) == self.pad

    def pad_for(self, h: int, w: int) -> tuple[int, int, int, int]:
        """F.pad amounts (left, right, top, bottom) for an h x w input."""
        if not self.dynamic_same:
            return self.pad
        th, tw = (
            tf_same_total(n, k, s, d)
            for n, k, s, d in zip((h, w), self.kernel, self.stride, self.dilation)
        )
        return (tw // 2, tw - tw // 2, th // 2, th - th // 2)

    def padded_size(self, h: int, w: int) -> tuple[int, int]:
        left, right, top, bottom = self.pad_for(h, w)
        return h + top + bottom, w + left + right

    def output_size(self, h: int, w: int) -> tuple[int, int]:
        hp, wp = self.padded_size(h, w)
        span_h = self.dilation[0] * (self.kernel[0] - 1) + 1
        span_w = self.dilation[1] * (self.kernel[1] - 1) + 1
        if hp < span_h or wp < span_w:
            raise ValueError(
                f"input of size {(h, w) if self.ndim == 2 else w} is smaller than the "
                f"(dilated) kernel {(span_h, span_w) if self.ndim == 2 else span_w} after padding"
            )
        return (hp - span_h) // self.stride[0] + 1, (wp - span_w) // self.stride[1] + 1

    def pad_input(self, x: torch.Tensor) -> torch.Tensor:
        """Pad x (B, C, H, W) exactly as the conv does (zeros or its padding_mode)."""
        h, w = x.shape[-2:]
        pad = self.pad_for(h, w)
        if not any(pad):
            return x
        if self.padding_mode == "zeros":
            return F.pad(x, pad)
        left, right, top, bottom = pad
        limit = {"circular": 0, "reflect": 1}.get(self.padding_mode)  # pad <= size - limit
        if limit is not None and (max(left, right) > w - limit or max(top, bottom) > h - limit):
            size = (h, w) if self.ndim == 2 else w
            raise ValueError(
                f"{self.padding_mode} padding {self.pad if self.ndim == 2 else self.pad[:2]} "
                f"needs an input larger than {size}"
            )
        if self.ndim == 1:  # reflect/replicate/circular of a 3-D input pad the last dim only
            return F.pad(x.squeeze(2), self.pad[:2], mode=self.padding_mode).unsqueeze(2)
        return F.pad(x, self.pad, mode=self.padding_mode)

    def crop(self, y: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """From the attention output over the padded image (B, C, Hp, Wp) keep the conv's
        outputs: queries anchor + o * stride (the stride-1 'valid' result, subsampled)."""
        oh, ow = self.output_size(h, w)
        ah, aw = self.anchor
        sh, sw = self.stride
        return y[:, :, ah : ah + (oh - 1) * sh + 1 : sh, aw : aw + (ow - 1) * sw + 1 : sw]


def tf_same_total(size: int, kernel: int, stride: int, dilation: int) -> int:
    """Total padding of TensorFlow's "SAME" along one axis: the output has ceil(size / stride)
    entries."""
    return max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)


def _resolve_padding(conv: nn.Module, kernel, dilation, ndim) -> tuple[int, int, int, int]:
    padding = conv.padding
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(
                f"unsupported padding {padding!r} (expected int, tuple, 'same', 'valid')"
            )
        lr = []
        for k, d in zip(kernel, dilation):  # PyTorch: the odd pixel of "same" goes right/bottom
            total = d * (k - 1)
            lr.append((total // 2, total - total // 2))
        (top, bottom), (left, right) = lr
        return (left, right, top, bottom)
    if ndim == 1:
        return (padding[0], padding[0], 0, 0)
    return (padding[1], padding[1], padding[0], padding[0])


def conv_geometry(conv: nn.Module) -> ConvGeometry:
    """The geometry of an nn.Conv1d / nn.Conv2d (TypeError for any other module).

    Args:
        conv: the convolution (its attributes are read as they are; see ``conv_spec`` for a
            subclass with its own forward).

    Returns:
        Its ``ConvGeometry``.

    Raises:
        TypeError: not an nn.Conv1d / nn.Conv2d (transposed and 3-D convolutions included).
        ValueError: a padding mode other than zeros, reflect, replicate or circular.
    """
    if isinstance(conv, nn.Conv2d):
        ndim = 2
        kernel, stride, dilation = conv.kernel_size, conv.stride, conv.dilation
    elif isinstance(conv, nn.Conv1d):
        ndim = 1
        kernel = (1, conv.kernel_size[0])
        stride, dilation = (1, conv.stride[0]), (1, conv.dilation[0])
    else:
        raise TypeError(
            f"expected nn.Conv1d or nn.Conv2d, got {type(conv).__name__} "
            "(transposed and 3-D convolutions are not supported)"
        )
    if conv.padding_mode not in PADDING_MODES:
        raise ValueError(f"unsupported padding_mode {conv.padding_mode!r}")
    return ConvGeometry(
        in_channels=conv.in_channels,
        out_channels=conv.out_channels,
        kernel=tuple(int(k) for k in kernel),
        stride=tuple(int(s) for s in stride),
        dilation=tuple(int(d) for d in dilation),
        pad=_resolve_padding(conv, kernel, dilation, ndim),
        padding_mode=conv.padding_mode,
        groups=conv.groups,
        ndim=ndim,
        padding=conv.padding,
    )


def kernel_to_heads(weight: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """Conv weight (Cout, Cin/g, Kh, Kw) (or (Cout, Cin/g, K)) -> W^(h) as (Nh, Cout, Cin).

    W^(h)[o, i] = weight[o, i, kh, kw] with h = kh*Kw + kw (Lemma 1); block-diagonal for groups.

    Args:
        weight: the conv kernel (Cout, Cin/g, Kh, Kw), or (Cout, Cin/g, K) for a Conv1d.
        groups: the conv's groups.

    Returns:
        (Nh, Cout, Cin) the heads' matrices W^(h), Nh = Kh Kw, in row-major tap order.

    Raises:
        ValueError: Cout is not divisible by ``groups``.
    """
    if weight.dim() == 3:
        weight = weight.unsqueeze(2)
    cout, cin_g, kh, kw = weight.shape
    if cout % groups:
        raise ValueError(f"out_channels {cout} not divisible by groups {groups}")
    og = cout // groups
    heads = weight.new_zeros(kh * kw, cout, cin_g * groups)  # (Nh, Cout, Cin)
    blocks = weight.permute(2, 3, 0, 1).reshape(kh * kw, cout, cin_g)  # (Nh, Cout, Cin/g)
    for g in range(groups):
        o, i = slice(g * og, (g + 1) * og), slice(g * cin_g, (g + 1) * cin_g)
        heads[:, o, i] = blocks[:, o]
    return heads


def heads_to_kernel(
    heads: torch.Tensor, kernel: tuple[int, int], groups: int = 1, ndim: int = 2
) -> torch.Tensor:
    """Inverse of ``kernel_to_heads``: (Nh, Cout, Cin) -> (Cout, Cin/g, Kh, Kw) (or 3-D).

    The off-diagonal blocks of a grouped W^(h) must be zero (ValueError otherwise).

    Args:
        heads: (Nh, Cout, Cin) the heads' matrices W^(h), in row-major tap order.
        kernel: (Kh, Kw), with Kh Kw = Nh; (1, K) for a Conv1d.
        groups: the conv's groups.
        ndim: 2 for a (Cout, Cin/g, Kh, Kw) kernel, 1 for a Conv1d's (Cout, Cin/g, K).

    Returns:
        The conv kernel.

    Raises:
        ValueError: Nh does not fill the kernel, the channels are not divisible by
            ``groups``, or a grouped W^(h) has nonzero off-diagonal blocks.
    """
    nh, cout, cin = heads.shape
    if nh != kernel[0] * kernel[1]:
        raise ValueError(f"{nh} heads cannot fill a {kernel[0]}x{kernel[1]} kernel")
    if cout % groups or cin % groups:
        raise ValueError(f"channels ({cin} in, {cout} out) not divisible by groups {groups}")
    og, ig = cout // groups, cin // groups
    blocks, off = [], heads.clone()
    for g in range(groups):
        o, i = slice(g * og, (g + 1) * og), slice(g * ig, (g + 1) * ig)
        blocks.append(heads[:, o, i])
        off[:, o, i] = 0
    if groups > 1 and off.abs().max() > 0:
        raise ValueError(f"W^(h) is not block-diagonal, it cannot be a conv with groups={groups}")
    w = torch.cat(blocks, dim=1)  # (Nh, Cout, Cin/g)
    w = w.reshape(kernel[0], kernel[1], cout, ig).permute(2, 3, 0, 1).contiguous()
    return w.squeeze(2) if ndim == 1 else w


def low_rank_heads(
    heads: torch.Tensor, rank: int, groups: int = 1
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Best rank-``rank`` factorization of each W^(h) (Eckart-Young, truncated SVD per head).

    heads (Nh, Cout, Cin) ~= out (Nh, Cout, r) @ val (Nh, r, Cin). Returns (val, out, rel_err)
    with rel_err = ||W - W_r||_F / ||W||_F over all heads (0.0 when the rank suffices). With
    ``groups`` > 1, W^(h) is block-diagonal (``kernel_to_heads``): each diagonal block is
    decomposed on its own and the r largest singular values over all blocks are kept (the
    singular values of a block-diagonal matrix are its blocks'), so every singular vector lies
    in one group and the off-diagonal blocks of out @ val are exactly zero (a conv again).

    Args:
        heads: (Nh, Cout, Cin) the heads' matrices W^(h).
        rank: r, the head dimension; above the heads' rank bound the factors are padded with
            zeros.
        groups: the conv's groups (W^(h)'s diagonal blocks; entries off them are ignored).

    Returns:
        ``(val, out, rel_err)``: (Nh, r, Cin) and (Nh, Cout, r) factors, each carrying the
        square root of the singular values, and the relative Frobenius error of their product.

    Raises:
        ValueError: ``rank`` < 1, or channels not divisible by ``groups``.
    """
    if rank < 1:
        raise ValueError(f"head_dim must be >= 1, got {rank}")
    nh, cout, cin = heads.shape
    if cout % groups or cin % groups:
        raise ValueError(f"channels ({cin} in, {cout} out) not divisible by groups {groups}")
    og, ig = cout // groups, cin // groups
    us, ss, vs = [], [], []
    for g in range(groups):  # SVD of block g, its vectors placed in group g's rows / columns
        block = heads[:, g * og : (g + 1) * og, g * ig : (g + 1) * ig]
        u, s, vh = torch.linalg.svd(block, full_matrices=False)  # (Nh,og,m) (Nh,m) (Nh,m,ig)
        us.append(F.pad(u, (0, 0, g * og, cout - (g + 1) * og)))  # (Nh, Cout, m)
        vs.append(F.pad(vh, (g * ig, cin - (g + 1) * ig)))  # (Nh, m, Cin)
        ss.append(s)
    u, s, vh = torch.cat(us, 2), torch.cat(ss, 1), torch.cat(vs, 1)
    if groups > 1:  # the singular values of all blocks, largest first
        s, order = s.sort(dim=1, descending=True)
        u = u.gather(2, order[:, None, :].expand(-1, cout, -1))
        vh = vh.gather(1, order[:, :, None].expand(-1, -1, cin))
    m = s.shape[-1]
    r = min(rank, m)
    root = s[:, :r].sqrt()
    out = u[:, :, :r] * root[:, None, :]  # (Nh, Cout, r)
    val = root[:, :, None] * vh[:, :r, :]  # (Nh, r, Cin)
    if rank > m:  # pad to the requested head_dim with zero channels
        out = F.pad(out, (0, rank - m))
        val = F.pad(val, (0, 0, 0, rank - m))
    total = float((s.double() ** 2).sum())
    dropped = float((s[:, r:].double() ** 2).sum())
    rel_err = math.sqrt(dropped / total) if total > 0 else 0.0
    return val, out, rel_err


def shift_conv_reference(
    x: torch.Tensor, geom: ConvGeometry, heads: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Lemma 1 written out: y_q = sum_h X_pad[q + f(h)] W^(h) + b, cropped and subsampled.

    x (B, Cin, H, W); heads (Nh, Cout, Cin). A plain loop over heads, no attention: the
    reference that the attention layers are checked against (and that is checked against conv).
    """
    _, _, h, w = x.shape
    xp = geom.pad_input(x)  # (B, Cin, Hp, Wp)
    hp, wp = xp.shape[-2:]
    y = x.new_zeros(x.shape[0], heads.shape[1], hp, wp)  # (B, Cout, Hp, Wp) for every query
    for (dr, dc), wh in zip(geom.centers().tolist(), heads):
        # shifted[q] = xp[q + (dr, dc)], valid where q + (dr, dc) is inside the padded image
        shifted = torch.zeros_like(xp)
        r0, r1 = max(0, -dr), min(hp, hp - dr)
        c0, c1 = max(0, -dc), min(wp, wp - dc)
        shifted[:, :, r0:r1, c0:c1] = xp[:, :, r0 + dr : r1 + dr, c0 + dc : c1 + dc]
        y = y + torch.einsum("bihw,oi->bohw", shifted, wh)
    if bias is not None:
        y = y + bias[None, :, None, None]
    return geom.crop(y, h, w)
