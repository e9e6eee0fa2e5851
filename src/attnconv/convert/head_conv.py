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


def head_conv(xp: torch.Tensor, rows: list[slice], cols: list[slice], heads: torch.Tensor,
              bias: torch.Tensor | None, groups: int) -> torch.Tensor:  # fmt: skip
    """sum_h SA_h(X) W^(h) + b for hard heads: xp (B, Cin, Hp, Wp) the padded input, head h
    reading xp[:, :, rows[h], cols[h]] (slices of one step, the conv's stride) -> (B, Cout, Ho,
    Wo)."""
    sh, sw = rows[0].step, cols[0].step
    oh, ow = len(range(xp.shape[2])[rows[0]]), len(range(xp.shape[3])[cols[0]])
    weight, (r0, c0), dil = head_kernel([r.start for r in rows], [c.start for c in cols], heads)
    y = F.conv2d(xp[:, :, r0:, c0:], weight, bias, stride=(sh, sw), dilation=dil, groups=groups)
    return y[:, :, :oh, :ow]


def one_step(idx: list) -> bool:
    """Every index a slice of the same step (no clamped border)."""
    return all(isinstance(i, slice) and i.step == idx[0].step for i in idx)
