"""A converted convolution keeps answering as the convolution it replaced: model code
reads its convolutions' attributes (``weight`` for weight standardization or a re-parametrized
branch, ``in_channels`` / ``kernel_size`` / ``stride`` / ``padding`` / ``groups`` to size other
layers), so ``ConvAttention2d`` answers them all from its geometry and its heads.

``weight`` is the equivalent kernel of Lemma 1 read back from the heads, W[:, :, kh, kw] =
W^(h) for h = kh*Kw + kw, built on access and differentiable in the heads (a forward that
convolves with it gives the same function and trains the same parameters). It exists for hard
layers whose centres still sit on the kernel's shifts; a soft layer (finite alpha) or moved
centres have no equivalent kernel: ``weight`` is then absent (AttributeError, ``hasattr`` False).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .geometry import heads_to_kernel
from .grouped import GroupedHeadProjection


class ConvAttributes:
    """Mixin of ``ConvAttention2d``: the nn.Conv1d/Conv2d attributes, from ``self.geometry``
    and ``self.attention``."""

    def _pick(self, t: tuple) -> tuple:
        return t if self.geometry.ndim == 2 else t[1:]  # Conv1d: (K,), geometry is (1, K)

    @property
    def in_channels(self) -> int:
        return self.geometry.in_channels

    @property
    def out_channels(self) -> int:
        return self.geometry.out_channels

    @property
    def groups(self) -> int:
        return self.geometry.groups

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return self._pick(self.geometry.kernel)

    @property
    def stride(self) -> tuple[int, ...]:
        return self._pick(self.geometry.stride)

    @property
    def dilation(self) -> tuple[int, ...]:
        return self._pick(self.geometry.dilation)

    @property
    def padding(self):
        """The conv's ``padding`` as it pads (``ConvGeometry.conv_padding``): its own argument,
        or a traced forward's F.pad / padding_mode; an asymmetric pad no nn.Conv argument
        expresses is the F.pad-order tuple (left, right, top, bottom) ((left, right) 1-D)."""
        return self.geometry.conv_padding

    @property
    def padding_mode(self) -> str:
        return self.geometry.padding_mode

    @property
    def transposed(self) -> bool:
        return False

    @property
    def output_padding(self) -> tuple[int, ...]:
        return (0,) * self.geometry.ndim

    @property
    def bias(self) -> torch.Tensor | None:
        """The conv's bias: b_out + sum_h Wout_h b_val^(h) (one-hot rows sum to 1)."""
        return head_matrices(self.attention, detach=False)[1]

    @property
    def weight(self) -> torch.Tensor:
        """(Cout, Cin/g, Kh, Kw) (Conv1d: (Cout, Cin/g, K)), the equivalent kernel (Lemma 1)."""
        layer, g = self.attention, self.geometry
        enc = layer.positional_encoding
        if not enc.hard:
            raise AttributeError("a soft converted layer (finite alpha) has no equivalent kernel")
        if not torch.equal(enc.centers.detach().round().long().cpu(), g.centers()):
            raise AttributeError("the heads' centres left the kernel's shifts: no kernel")
        out = layer.out_proj
        if isinstance(out, GroupedHeadProjection) and layer.value == "identity":
            nh, cout, cin_g = out.kernel.shape  # the kernel's own entries, no dense matrix
            w = out.kernel.reshape(g.kernel[0], g.kernel[1], cout, cin_g).permute(2, 3, 0, 1)
            return w.squeeze(2) if g.ndim == 1 else w
        heads, _ = head_matrices(layer, detach=False)
        try:
            return heads_to_kernel(heads, g.kernel, g.groups, g.ndim)
        except ValueError as e:  # trained rank-limited heads left their diagonal blocks
            raise AttributeError(f"no equivalent kernel: {e}") from None


def head_matrices(
    layer: nn.Module, detach: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W^(h) = Wval^(h) Wout_h of an MHSA2d layer as (Nh, Cout, Cin) (Lemma 1), and the output
    bias b_out + sum_h Wout_h b_val^(h) (one-hot attention rows sum to 1, so b_val passes)."""
    nh = layer.num_heads
    out_w = layer.out_proj.weight  # (Cout, Nh*Dh)
    bias = layer.out_proj.bias
    cout = out_w.shape[0]
    out_h = out_w.reshape(cout, nh, -1).permute(1, 0, 2)  # (Nh, Cout, Dh)
    vp = getattr(layer, "value_proj", None)
    heads = out_h
    if vp is not None:
        heads = out_h @ vp.weight.reshape(nh, -1, vp.weight.shape[1])  # (Nh, Cout, Cin)
        if vp.bias is not None:
            vb = (out_h @ vp.bias.reshape(nh, -1, 1)).sum(0)[:, 0]  # (Cout,)
            bias = vb if bias is None else bias + vb
    if detach:
        return heads.detach(), None if bias is None else bias.detach()
    return heads, bias


def copy_requires_grad(conv: nn.Module, module: nn.Module) -> None:
    """A frozen conv stays frozen: the bias terms (b_out, b_val) follow the conv's bias, every
    other parameter (W^(h)'s factors, centres, spreads) its weight's parameters (a
    parametrization's or a gain's included)."""
    weight = [p.requires_grad for n, p in conv.named_parameters() if n != "bias"]
    train_w = any(weight)
    bias = getattr(conv, "bias", None)
    train_b = bias.requires_grad if isinstance(bias, nn.Parameter) else train_w
    for name, p in module.named_parameters():
        p.requires_grad_(train_b if name.endswith("bias") else train_w)
