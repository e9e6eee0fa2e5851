"""Lemma 1's sum over hard heads as the one convolution it equals (Cordonnier et al. 2020):

    MHSA(X)_q = sum_h X_{q + f(h)} W^(h) + b,   W^(h) = Wval^(h) Wout_h          (Lemma 1)

With every head at an integer shift f(h) and no clamped border, this is a convolution whose
kernel holds W^(h) at tap f(h): ``head_kernel`` writes the heads' matrices there (from the
attention layer's own parameters, on every call, so gradients reach them), ``head_conv`` runs
it, one conv2d over the padded image instead of one pass over memory per head. The taps may sit
on a dilated grid (the gcd of the heads' offsets). The per-head paths it replaces
(modules._forward_shift's channel mixes, grouped.grouped_head_mix_reference) stay beside it and
are tested equal.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F


def head_kernel(starts_r: list[int], starts_c: list[int], heads: torch.Tensor):
    """The conv kernel (Cout, Cin/g, KH, KW) holding W^(h) (heads (Nh, Cout, Cin/g)) at tap
    ((r_h - r0) / dr, (c_h - c0) / dc); returns it with the origin (r0, c0) and dilation."""
    r0, c0 = min(starts_r), min(starts_c)
    offs_r, offs_c = [r - r0 for r in starts_r], [c - c0 for c in starts_c]
    dr, dc = math.gcd(*offs_r) or 1, math.gcd(*offs_c) or 1
    kr = torch.tensor([o // dr for o in offs_r], device=heads.device)
    kc = torch.tensor([o // dc for o in offs_c], device=heads.device)
    nh, cout, cin_g = heads.shape
    taps = heads.new_zeros(max(offs_r) // dr + 1, max(offs_c) // dc + 1, cout, cin_g)
    taps = taps.index_put((kr, kc), heads, accumulate=True)  # two heads on one tap add
    return taps.permute(2, 3, 0, 1).contiguous(), (r0, c0), (dr, dc)


class HeadConv(NamedTuple):
    """The convolution of a hard layer's heads: its kernel (``head_kernel``), bias and groups,
    the origin of the taps in the given input (after its implicit (top, left) zeros), the
    dilation, the stride and the output size."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    groups: int
    origin: tuple[int, int]
    dilation: tuple[int, int]
    stride: tuple[int, int]
    out: tuple[int, int]


def plan(
    rows: list[slice],
    cols: list[slice],
    heads: torch.Tensor,
    bias: torch.Tensor | None,
    groups: int,
    pad: tuple[int, int] = (0, 0),
) -> HeadConv:
    """Head h reads pixel (rows[h], cols[h]) (slices of one step, the conv's stride) of the
    padded input: the input given to ``run`` preceded by ``pad`` = (top, left) rows and columns
    of zeros (the conv adds them: no padded copy)."""
    weight, (r0, c0), dil = head_kernel([r.start for r in rows], [c.start for c in cols], heads)
    out = len(range(rows[0].stop)[rows[0]]), len(range(cols[0].stop)[cols[0]])
    return HeadConv(
        weight, bias, groups, (r0 - pad[0], c0 - pad[1]), dil, (rows[0].step, cols[0].step), out
    )


def run(xp: torch.Tensor, p: HeadConv) -> torch.Tensor:
    """sum_h SA_h(X) W^(h) + b -> (B, Cout, Ho, Wo), one conv2d of xp (B, Cin, H', W')."""
    (r0, c0), (oh, ow) = p.origin, p.out
    xs = xp[:, :, max(r0, 0) :, max(c0, 0) :]  # reads before xp's first row are the conv's zeros
    front = (max(-r0, 0), max(-c0, 0))  # the conv pads both sides by these
    need = [
        (n - 1) * s + (k - 1) * d + 1
        for n, s, k, d in zip(p.out, p.stride, p.weight.shape[2:], p.dilation)
    ]
    short = [max(0, m - (xs.shape[2 + i] + 2 * front[i])) for i, m in enumerate(need)]
    if any(short):  # more zeros after the image than before it (an asymmetric pad)
        xs = F.pad(xs, (0, short[1], 0, short[0]))
    y = F.conv2d(
        xs, p.weight, p.bias, stride=p.stride, padding=front, dilation=p.dilation, groups=p.groups
    )
    return y[:, :, :oh, :ow]


def head_conv(
    xp: torch.Tensor,
    rows: list[slice],
    cols: list[slice],
    heads: torch.Tensor,
    bias: torch.Tensor | None,
    groups: int,
    pad: tuple[int, int] = (0, 0),
) -> torch.Tensor:
    """sum_h SA_h(X) W^(h) + b for hard heads (``plan``, then ``run``) -> (B, Cout, Ho, Wo)."""
    return run(xp, plan(rows, cols, heads, bias, groups, pad))


def one_step(idx: list) -> bool:
    """Every index a slice of the same step (no clamped border)."""
    return all(isinstance(i, slice) and i.step == idx[0].step for i in idx)


def kept_indices(anchor: int, n: int, stride: int, size: int, shift: int) -> slice | list[int]:
    """Head targets of the kept queries q = anchor + o * stride (o < n) along one axis:
    clamp(q + shift, 0, size - 1), as the layer's ``hard_indices``; a slice (a strided view)
    when no target is clamped, else the index list."""
    first, last = anchor + shift, anchor + (n - 1) * stride + shift
    if first >= 0 and last <= size - 1:
        return slice(first, last + 1, stride)
    return [min(max(anchor + o * stride + shift, 0), size - 1) for o in range(n)]


def _as_slice(idx: list[int]) -> slice | list[int]:
    """An arithmetic progression of indices as a slice (basic indexing), else the list."""
    step = idx[1] - idx[0] if len(idx) > 1 else 1
    if step > 0 and all(b - a == step for a, b in zip(idx, idx[1:])):
        return slice(idx[0], idx[-1] + 1, step)
    return idx


def take(x: torch.Tensor, dim: int, idx: list[int] | slice) -> torch.Tensor:
    """x.index_select(dim, idx), as a strided view when idx is (or ``_as_slice`` makes it) a
    slice; ``dim`` >= 0."""
    idx = _as_slice(idx) if isinstance(idx, list) else idx
    if isinstance(idx, slice):
        return x[(slice(None),) * dim + (idx,)]
    return x.index_select(dim, torch.tensor(idx, device=x.device))


def unchanged(module: torch.nn.Module, copies: list[torch.Tensor]) -> bool:
    """Every parameter equal, value for value (dtype and device too), to its kept copy."""
    params = list(module.parameters())
    return len(params) == len(copies) and all(
        p.dtype == c.dtype and p.device == c.device and torch.equal(p, c)
        for p, c in zip(params, copies)
    )
