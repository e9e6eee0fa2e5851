"""Convolution -> attention and back (Cordonnier et al., ICLR 2020, Theorem 1, Lemmas 1-2).

``conv_to_attention(conv)`` returns a ``ConvAttention2d`` / ``ConvAttention1d``: one position-only
quadratic ``MultiHeadSelfAttention2d`` with Kh*Kw heads whose centres Delta^(h) sit on the
kernel's (dilated) shifts and whose W^(h) = Wval^(h) Wout_h hold the kernel (Lemma 1), plus the
border padding, cropping and stride subsampling (geometry.py, "Borders").

- ``alpha=None``: the alpha -> inf limit (hard one-hot attention, a shift; exact).
- finite ``alpha``: Lemma 2's soft layer; its error decreases with alpha.
- ``head_dim=None``: exact, each head attends over the raw input (value="identity", Dh = Cin).
  A ``head_dim`` below a head's rank gives the best rank-``head_dim`` W^(h) (truncated SVD); the
  relative kernel error is ``module.rank_error`` and a warning says so (Theorem 1's
  min(Dh, Dout) bound).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnconv.layers.checks import check_tensor, refuses_retired
from attnconv.layers.kernels import plan
from attnconv.layers.scripting import NotScriptable

from . import head_conv as hc
from .attributes import ConvAttributes, copy_requires_grad, head_matrices
from .geometry import (
    ConvGeometry,
    kernel_to_heads,
    low_rank_heads,
)
from .grouped import GroupedHeadProjection, grouped_head_mix
from .rules import SpecConv, UnsupportedConv, check_conversion, conv_spec

# the fast hard path concatenates the heads' inputs when Nh * Cin is at most this (measured on
# ResNet18: the 3-channel stem gains, 64-channel layers lose with a 576-channel copy;
# docs/benchmarks.md, "Figures behind the code's comments")
CONCAT_MAX_CHANNELS = 128


def _mhsa_cls():
    from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

    return MultiHeadSelfAttention2d


class ConvAttention(NotScriptable, ConvAttributes, nn.Module):
    """A convolution computed by multi-head self-attention (Theorem 1): ConvAttention2d/1d.

    ``attention`` is a position-only quadratic ``MultiHeadSelfAttention2d`` over the padded input;
    ``geometry`` holds the conv's padding, stride and dilation. NCHW in, NCHW out, same shapes as
    the original conv. Its path is kernels/plan.py's CONVERTED_TABLE: a hard layer (unless its
    ``backend="reference"``) evaluates its one-hot attention at the kept queries only (a shift,
    ``_forward_shift``: one conv, or channel mixes at a clamped border); ``forward_layer``
    runs the layer's own forward on every padded pixel, then the crop (what the shift equals).
    It answers the conv's attributes (``weight``, ``bias``, ``in_channels``, ``kernel_size``,
    ``stride``, ``padding``, ``dilation``, ``groups``; attributes.py), and the 2-D / 1-D
    subclasses pass ``isinstance(m, nn.Conv2d)`` / ``nn.Conv1d`` (model code that checks types,
    e.g. timm's re-parametrization, accepts them; nn.Conv2d's __init__ is not run: no weight
    parameter of its own).
    """

    def __init__(self, geometry: ConvGeometry, attention: nn.Module, rank_error: float = 0.0):
        nn.Module.__init__(self)  # not nn.Conv2d's: the weight is read from the heads
        self.geometry = geometry
        self.attention = attention
        self.rank_error = rank_error  # ||W - W_r||_F / ||W||_F of the kernel (0 = exact)

    @property
    def hard(self) -> bool:
        return bool(self.attention.positional_encoding.hard)

    @property
    def alpha(self) -> torch.Tensor:
        return self.attention.positional_encoding.alpha

    def attention_centers(self) -> torch.Tensor:
        return self.attention.attention_centers()

    def _check(self, x: torch.Tensor, dims: int) -> tuple[torch.Tensor, bool]:
        """x with its batch dim, and whether it was unbatched: (C, H, W) / (C, L) input gets a
        batch of one, as nn.Conv2d / nn.Conv1d take it. A batch of 0 runs (an empty output, as
        theirs); any other size 0 is refused."""
        g = self.geometry
        # (next(parameters()): a grouped Wout's .weight would build the dense matrix)
        dtype = next(self.attention.out_proj.parameters()).dtype
        check_tensor(x, dtype)  # a float of our dtype, no size 0 but the batch's
        unbatched = x.dim() == dims + 1
        if unbatched:
            x = x.unsqueeze(0)
        if x.dim() != dims + 2 or x.shape[1] != g.in_channels:
            shape = "(B, C, H, W)" if dims == 2 else "(B, C, L)"
            raise ValueError(
                f"{type(self).__name__} expects {shape} input (or unbatched, without B) with "
                f"C={g.in_channels}, got shape {tuple(x.shape[1:] if unbatched else x.shape)}"
            )
        return x, unbatched

    def _forward2d(self, x: torch.Tensor, return_attention: bool, shift: bool = True):
        h, w = x.shape[-2:]
        self.geometry.output_size(h, w)  # ValueError if the image is smaller than the kernel
        case = plan.ConvertedCase(
            self.hard and shift,
            self.attention.backend,
            return_attention,
            plan.tracing(),  # an export or torch.compile: the attention path traces
        )
        if plan.choose(case, plan.CONVERTED_TABLE) != "attention":  # the hard heads' shift
            return self._forward_shift(x, h, w)
        xp = self.geometry.pad_input(x)  # (B, Cin, Hp, Wp), padded exactly as the conv pads
        out = self.attention(xp, return_attention=return_attention)
        y, attn = out if return_attention else (out, None)  # y (B, Cout, Hp, Wp)
        y = self.geometry.crop(y, h, w)  # (B, Cout, Ho, Wo): anchor + o * stride
        return (y, attn) if return_attention else y

    def _forward_shift(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Fast hard path: head h reads pixel clamp(q + round(Delta_h)) of the padded image, so
        Lemma 1's sum_h X_{q+f(h)} W^(h) is one convolution (head_conv.py; in inference its
        plan kept while every parameter equals, value for value, a copy taken with it: a
        version counter misses writes through ``p.data`` or into a ``vector_to_parameters``
        vector); with a clamped border, channel mixes of strided slices (grouped / depthwise:
        ``grouped_head_mix``). Equals the reference path (the layer's own forward on every
        query, then ``geometry.crop``)."""
        g, layer = self.geometry, self.attention
        zeros = g.padding_mode == "zeros"  # then the conv pads, not a padded copy
        kept = None if torch.is_grad_enabled() else self.__dict__.get("_plan")
        if kept is not None and kept[0] == (h, w, self.hard) and hc.unchanged(self, kept[1]):
            return hc.run(x if zeros else g.pad_input(x), kept[2])
        oh, ow = g.output_size(h, w)
        (ah, aw), (sh, sw), (hp, wp) = g.anchor, g.stride, g.padded_size(h, w)
        shifts = torch.round(layer.positional_encoding.centers.detach()).long().tolist()
        # per head: a slice, or the index list where a target is clamped
        rows = [hc.kept_indices(ah, oh, sh, hp, dr) for dr, _ in shifts]
        cols = [hc.kept_indices(aw, ow, sw, wp, dc) for _, dc in shifts]
        grouped = isinstance(layer.out_proj, GroupedHeadProjection)  # block-diagonal W^(h)
        clamped = not (hc.one_step(rows) and hc.one_step(cols))
        case = plan.ConvertedCase(hard=True, clamped=clamped)
        if plan.choose(case, plan.CONVERTED_TABLE) == "one_conv":  # Lemma 1's sum, one conv
            p = layer.out_proj
            heads, bias, groups = (
                (p.kernel, p.bias, p.groups)
                if grouped
                else (*head_matrices(layer, detach=False), 1)
            )
            conv = hc.plan(
                rows, cols, heads, bias, groups, g.pad_for(h, w)[2::-2] if zeros else (0, 0)
            )
            if not torch.is_grad_enabled():  # the copies: the exact test of "nothing changed"
                copies = [q.detach().clone() for q in self.parameters()]
                self.__dict__["_plan"] = ((h, w, self.hard), copies, conv)
            return hc.run(x if zeros else g.pad_input(x), conv)
        xp = g.pad_input(x)
        if grouped:
            return grouped_head_mix(xp, rows, cols, layer.out_proj)
        heads, bias = head_matrices(layer, detach=False)  # (Nh, Cout, Cin), (Cout,) | None
        nh, cout, cin = heads.shape
        if nh == 1:  # a 1x1 conv: one head reading one (strided) pixel, one channel mix in place
            xs = hc.take(hc.take(xp, 2, rows[0]), 3, cols[0])  # SA(X), no layout copy
            return F.conv2d(xs, heads[0][:, :, None, None], bias)
        xp = xp.contiguous(memory_format=torch.channels_last)
        sa = (hc.take(hc.take(xp, 2, r), 3, c) for r, c in zip(rows, cols))  # SA_h(X) (B,Cin,Ho,Wo)
        if nh * cin <= CONCAT_MAX_CHANNELS:  # few channels: concat_h[SA_h(X)] Wout in one mix
            w_all = heads.permute(1, 0, 2).reshape(cout, nh * cin)  # [W^(1) ... W^(Nh)]
            y = F.conv2d(torch.cat(list(sa), dim=1), w_all[:, :, None, None])
        else:  # many channels: sum_h SA_h(X) W^(h), one channel mix per head (no Nh*Cin copy)
            heads = heads.contiguous()  # oneDNN reorders strided weights on every call
            y = None
            for xs, wh in zip(sa, heads):
                t = F.conv2d(xs, wh[:, :, None, None])  # X_{q+f(h)} W^(h): (B, Cout, Ho, Wo)
                y = t if y is None else (y.add_(t) if not torch.is_grad_enabled() else y + t)
        if bias is not None:
            y = y + bias[None, :, None, None]
        return y

    def extra_repr(self) -> str:
        g = self.geometry
        s = (
            f"{g.in_channels}, {g.out_channels}, kernel_size={g.kernel}, stride={g.stride}, "
            f"pad={g.pad}, dilation={g.dilation}, groups={g.groups}, "
            f"padding_mode={g.padding_mode!r}, hard={self.hard}"
        )
        return s + (f", rank_error={self.rank_error:.3g}" if self.rank_error else "")


class ConvAttention2d(ConvAttention, nn.Conv2d):
    """An nn.Conv2d computed by multi-head self-attention (Theorem 1); see ConvAttention.

    Built by ``conv_to_attention``.

    Args:
        geometry: the convolution's geometry (channels, kernel, padding, stride, dilation,
            groups), as ``conv_geometry`` reads it.
        attention: the position-only quadratic ``MultiHeadSelfAttention2d`` over the padded
            input, one head per kernel tap.
        rank_error: the relative Frobenius error of the kernel the heads hold (0 = exact; above
            0 when ``head_dim`` is below a head's rank).
    """

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """x (B, Cin, H, W) -> conv(x) (B, Cout, Ho, Wo); with return_attention also the
        attention probabilities over the padded image (B or 1, Nh, `Hp*Wp`, `Hp*Wp`). An
        unbatched (Cin, H, W) input gives unbatched results, as nn.Conv2d's.

        Args:
            x: the (B, Cin, H, W) input, or an unbatched (Cin, H, W) one.
            return_attention: also return the attention probabilities.

        Returns:
            (torch.Tensor | tuple): conv(x) (B, Cout, Ho, Wo), or ``(conv(x), probabilities)``
                with return_attention.
        """
        x, unbatched = self._check(x, 2)
        return _unbatch(self._forward2d(x, return_attention), unbatched)

    def forward_layer(self, x: torch.Tensor) -> torch.Tensor:
        """conv(x) by the layer's own forward on every padded pixel, then the crop: the path the
        hard shift is tested equal to (and the speed reference of the convert benchmark)."""
        x, unbatched = self._check(x, 2)
        return _unbatch(self._forward2d(x, False, shift=False), unbatched)


class ConvAttention1d(ConvAttention, nn.Conv1d):
    """An nn.Conv1d computed by self-attention: the 2-D layer on a (1, L) image, K heads, row 0.

    Built by ``conv_to_attention``.

    Args:
        geometry: the convolution's geometry (channels, kernel, padding, stride, dilation,
            groups), as ``conv_geometry`` reads it.
        attention: the position-only quadratic ``MultiHeadSelfAttention2d`` over the padded
            input, one head per kernel tap.
        rank_error: the relative Frobenius error of the kernel the heads hold (0 = exact; above
            0 when ``head_dim`` is below a head's rank).
    """

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """x (B, Cin, L) -> conv(x) (B, Cout, Lo); an unbatched (Cin, L) input gives unbatched
        results, as nn.Conv1d's.

        Args:
            x: the (B, Cin, L) input, or an unbatched (Cin, L) one.
            return_attention: also return the attention probabilities over the padded (1, Lp)
                image.

        Returns:
            (torch.Tensor | tuple): conv(x) (B, Cout, Lo), or ``(conv(x), probabilities)`` with
                return_attention.
        """
        x, unbatched = self._check(x, 1)
        out = self._forward2d(x.unsqueeze(2), return_attention)  # (B, C, 1, L)
        out = (out[0].squeeze(2), out[1]) if return_attention else out.squeeze(2)
        return _unbatch(out, unbatched)

    def forward_layer(self, x: torch.Tensor) -> torch.Tensor:
        x, unbatched = self._check(x, 1)
        return _unbatch(self._forward2d(x.unsqueeze(2), False, shift=False).squeeze(2), unbatched)


def _unbatch(out, unbatched: bool):
    """Drop the batch dim ``_check`` added to an unbatched input (output and probabilities)."""
    if not unbatched:
        return out
    return tuple(t.squeeze(0) for t in out) if isinstance(out, tuple) else out.squeeze(0)


@refuses_retired
def conv_to_attention(
    conv: nn.Module,
    *,
    alpha: float | None = None,
    head_dim: int | None = None,
    backend: str | None = None,
    check: bool = True,
) -> ConvAttention2d:
    """Turn an ``nn.Conv2d`` / ``nn.Conv1d`` (or a subclass: see rules.py) into an equivalent
    self-attention module (Theorem 1).

    Args:
        conv: the convolution.
        alpha: None for hard heads (alpha -> inf, exact), a float > 0 for Lemma 2's soft layer.
        head_dim: None for the exact layer (``value="identity"``, Dh = Cin); an int for
            rank-limited W^(h) by truncated SVD (exact when >= every head's rank; else a
            warning, and the error in ``.rank_error``).
        backend: the attention layer's ``backend`` (None: its plan's choice; ``"reference"``:
            the plain equations).
        check: compare with ``conv``'s own forward on probe inputs before returning (the
            converted module when exact, else the plain convolution it was built from).

    Returns:
        A ``ConvAttention2d`` (``ConvAttention1d`` for a Conv1d), an instance of the conv's class.

    Raises:
        UnsupportedConv: (a ValueError) the module cannot be read as a convolution, or the
            converted module differs from it.
    """
    if isinstance(conv, ConvAttention):
        raise TypeError(f"{type(conv).__name__} is already a converted convolution")
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d)):
        raise TypeError(
            f"expected nn.Conv1d or nn.Conv2d, got {type(conv).__name__} "
            "(transposed and 3-D convolutions are not supported)"
        )
    if isinstance(conv.weight, nn.parameter.UninitializedParameter):  # kept by on_unsupported
        raise UnsupportedConv("lazy convolution is not initialized yet: run one forward first")
    number = isinstance(alpha, (int, float)) and not isinstance(alpha, bool)  # True is not 1
    if alpha is not None and not (number and math.isfinite(alpha)):
        raise TypeError(f"alpha must be None (hard) or a finite number, got {alpha!r}")
    if alpha is not None and alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
        raise ValueError(f"head_dim must be a positive int or None, got {head_dim!r}")
    spec = conv_spec(conv)  # the effective weight, bias and geometry of conv's forward
    exact = alpha is None and head_dim is None
    if check and not exact:
        check_conversion(conv, SpecConv(spec), "plain convolution read from it")
    module = _build(spec, alpha, head_dim, backend).train(conv.training)
    if not module.hard and not bool(torch.isfinite(module.alpha).all()):  # else NaN outputs
        raise ValueError(f"alpha={alpha:g} overflows {spec.weight.dtype}; pass a smaller one")
    copy_requires_grad(conv, module)
    if check and exact:
        check_conversion(conv, module)
    if module.rank_error > 0:
        warnings.warn(
            f"conv_to_attention: head_dim={head_dim} < rank of W^(h) (Theorem 1 needs "
            f"min(Dh, Dout) >= rank); rank-limited kernel, relative error {module.rank_error:.3g}",
            stacklevel=2,
        )
    return module


@torch.random.fork_rng(devices=[])  # the layer's random init, overwritten: global RNG kept
def _build(spec, alpha: float | None, head_dim: int | None, backend) -> ConvAttention2d:
    """The attention module of a ConvSpec (Lemma 1: heads on the kernel's shifts)."""
    geom, w = spec.geometry, spec.weight
    nh, cout, cin = geom.num_heads, geom.out_channels, geom.in_channels
    bias = spec.bias is not None
    mhsa = _mhsa_cls()
    rank_error, val_w = 0.0, None
    if head_dim is None and geom.groups > 1:  # W^(h) block-diagonal: keep its blocks only
        with torch.device("meta"):  # never allocate the dense (Cout, Nh*Cin) Wout
            layer = mhsa(
                cin,
                cout,
                nh,
                positional="quadratic",
                content=False,
                value="identity",
                backend=backend,
                bias=bias,
                hard=alpha is None,
            )
        blocks = w.reshape(cout, w.shape[1], nh).permute(2, 0, 1)  # (Nh, Cout, Cin/g)
        layer.out_proj = GroupedHeadProjection(blocks, geom.groups, spec.bias)
        layer.positional_encoding.to_empty(device=w.device)  # set below
        out_w = None
    elif head_dim is None:
        heads = kernel_to_heads(w, geom.groups)  # (Nh, Cout, Cin), W^(h) of Lemma 1
        layer = mhsa(
            cin,
            cout,
            nh,
            positional="quadratic",
            content=False,
            value="identity",
            backend=backend,
            bias=bias,
            hard=alpha is None,
        )
        out_w = heads.permute(1, 0, 2).reshape(cout, nh * cin)  # [W^(1) ... W^(Nh)]
    else:
        heads = kernel_to_heads(w, geom.groups)
        # (Nh, r, Cin), (Nh, Cout, r); per group: W^(h)'s off-diagonal blocks exactly zero
        val, out, rank_error = low_rank_heads(heads, head_dim, geom.groups)
        layer = mhsa(
            cin,
            cout,
            nh,
            head_dim=head_dim,
            positional="quadratic",
            content=False,
            value="linear",
            backend=backend,
            bias=bias,
            hard=alpha is None,
        )
        out_w = out.permute(1, 0, 2).reshape(cout, nh * head_dim)
        val_w = val.reshape(nh * head_dim, cin)
    layer = layer.to(device=w.device, dtype=w.dtype)
    pe = layer.positional_encoding
    with torch.no_grad():
        pe.centers.copy_(geom.centers().to(pe.centers))
        pe.set_alpha(1.0 if alpha is None else float(alpha))
        if out_w is not None:
            layer.out_proj.weight.copy_(out_w)
            if bias:
                layer.out_proj.bias.copy_(spec.bias)
        if val_w is not None:
            layer.value_proj.weight.copy_(val_w)
            if layer.value_proj.bias is not None:
                layer.value_proj.bias.zero_()
    cls = ConvAttention1d if geom.ndim == 1 else ConvAttention2d
    return cls(geom, layer, rank_error)
