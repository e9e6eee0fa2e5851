"""Attention back to convolution: a hard ConvAttention2d/1d to the conv it equals (its
geometry, W^(h) written back into the kernel), and a bare hard quadratic MultiHeadSelfAttention2d
to a replicate-padded nn.Conv2d (Cordonnier et al. 2020, Lemma 1 read backwards)."""

from __future__ import annotations

import torch
import torch.nn as nn

from .attributes import head_matrices
from .geometry import heads_to_kernel
from .modules import ConvAttention


def attention_to_conv(module: nn.Module) -> nn.Conv2d | nn.Conv1d:
    """The reverse of ``conv_to_attention`` for a hard module on integer shifts.

    ``ConvAttention2d/1d`` -> the original conv geometry with W^(h) written back into the kernel
    (a round trip gives the same weights). Soft (finite alpha) or non-integer centres ->
    ValueError. For a bare ``MultiHeadSelfAttention2d`` use ``mhsa_to_conv``.

    Args:
        module: a ``ConvAttention2d`` / ``ConvAttention1d`` with hard heads.

    Returns:
        An ``nn.Conv2d`` (``nn.Conv1d`` for a ConvAttention1d) of the original geometry, on the
        module's device and dtype, in its train/eval mode.

    Raises:
        TypeError: ``module`` is not a ConvAttention2d/1d.
        ValueError: soft heads, centres moved off the kernel's shifts, TensorFlow "SAME"
            padding (which depends on the input size), or an asymmetric pad (a traced
            forward's F.pad) that no nn.Conv2d/Conv1d ``padding`` expresses.
    """
    if not isinstance(module, ConvAttention):
        raise TypeError(
            f"attention_to_conv expects a ConvAttention2d/1d, got {type(module).__name__} "
            "(use mhsa_to_conv for a bare MultiHeadSelfAttention2d)"
        )
    g = module.geometry
    layer = module.attention
    if g.dynamic_same:
        raise ValueError("TensorFlow 'SAME' padding (per input size) has no nn.Conv2d equivalent")
    if not module.hard:
        raise ValueError("attention_to_conv needs hard heads (alpha -> inf); this layer is soft")
    padding = g.conv_padding
    if isinstance(padding, tuple) and len(padding) != g.ndim:
        raise ValueError(
            f"asymmetric padding {padding} (F.pad order: left, right"
            f"{', top, bottom' if g.ndim == 2 else ''}) has no nn.Conv{g.ndim}d equivalent"
        )
    centers = layer.positional_encoding.centers.detach()
    if not torch.equal(centers.round().long().cpu(), g.centers()):
        raise ValueError("the heads' centres are no longer the kernel's shifts")
    heads, bias = head_matrices(layer)
    weight = heads_to_kernel(heads, g.kernel, g.groups, g.ndim)
    cls = nn.Conv2d if g.ndim == 2 else nn.Conv1d
    size = g.kernel if g.ndim == 2 else g.kernel[1]
    pick = (lambda t: t) if g.ndim == 2 else (lambda t: t[1])
    conv = cls(
        g.in_channels,
        g.out_channels,
        size,
        stride=pick(g.stride),
        padding=padding,
        dilation=pick(g.dilation),
        groups=g.groups,
        bias=bias is not None,
        padding_mode=g.padding_mode,
    )
    conv = conv.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(weight)
        if bias is not None:
            conv.bias.copy_(bias.detach())
    return conv.train(module.training)


def mhsa_to_conv(layer: nn.Module) -> nn.Conv2d:
    """A bare hard quadratic ``MultiHeadSelfAttention2d`` (position-only) -> nn.Conv2d.

    Head h reads clamp(q + round(Delta_h)) per axis: that is a replicate-padded image, so the
    conv has padding_mode="replicate", a kernel spanning every centre (symmetric about 0, zeros
    where no head sits; heads on the same shift add) and padding = the largest |shift| per axis.

    Args:
        layer: a ``MultiHeadSelfAttention2d`` with hard quadratic heads and ``content=False``.

    Returns:
        The ``nn.Conv2d`` (replicate padding) that computes the same function.

    Raises:
        ValueError: the layer is not position-only quadratic attention, or its heads are soft.
    """
    pe = getattr(layer, "positional_encoding", None)
    if pe is None or not hasattr(pe, "centers") or getattr(layer, "content", False):
        raise ValueError("mhsa_to_conv needs a position-only quadratic MultiHeadSelfAttention2d")
    if not getattr(pe, "hard", False):
        raise ValueError("mhsa_to_conv needs hard heads (alpha -> inf); this layer is soft")
    shifts = pe.centers.detach().round().long().cpu()  # (Nh, 2)
    heads, bias = head_matrices(layer)  # (Nh, Cout, Cin), (Cout,) | None
    nh, cout, cin = heads.shape
    ph, pw = (int(v) for v in shifts.abs().amax(dim=0))
    weight = heads.new_zeros(cout, cin, 2 * ph + 1, 2 * pw + 1)
    for (dr, dc), wh in zip(shifts.tolist(), heads):
        weight[:, :, ph + dr, pw + dc] += wh
    conv = nn.Conv2d(
        cin,
        cout,
        weight.shape[-2:],
        padding=(ph, pw),
        bias=bias is not None,
        padding_mode="replicate",
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(weight)
        if bias is not None:
            conv.bias.copy_(bias.detach())
    return conv
