"""Stand-Alone Self-Attention: exact per-pixel local k x k attention (Ramachandran et al. 2019).

    y_ij = sum_{(a,b) in N_k(i,j)} softmax_ab(q_ij^T k_ab + q_ij^T r_{a-i,b-j}) v_ab      (eq. 2-3)

with r_{a-i,b-j} = concat(rel_row[a-i], rel_col[b-j]), each half of the head's channels, the
window N_k(i, j) centred on every pixel (not blocked halo attention), heads splitting the
channels and 1x1 projections, so the weights do not grow with k (only the k x d_h relative
tables do). Stride s = s x s average pooling after the attention (sec. 3.1).

The kernels are kernels/local_kernels.py's (the plain reference and the window function in
kernels/window.py), picked by kernels/plan.py's LOCAL_TABLE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import BackendKnob, check_maps, check_tensor, positive_int
from .encodings.sinusoidal import sinusoid_2d
from .kernels import plan, triton_axis
from .kernels.local_kernels import LOCAL_KERNELS
from .kernels.window import (  # noqa: F401  (re-exported: the kernel's public names)
    PADDINGS,
    local_attention,
    local_to_dense,
    window_pad,
    window_valid,
)
from .precision import autocast_dtype
from .scripting import NotScriptable


@dataclass(frozen=True)
class SasaPositional:
    """One of SASA's positional encodings (sec. 4.3; not Dai's eq. 8 names, encodings/registry.py):
    what it adds to the logits and what it needs of the head dim, decided once at construction."""

    name: str
    tables: bool  # learned r_{a-i} (rel_row), r_{b-j} (rel_col), d_h / 2 each: q^T r_{a-i,b-j}
    absolute_keys: bool  # a fixed 2D sinusoid added to the keys: q^T (k_ab + p_ab)
    head_multiple: int  # d_h must divide into it: the tables' halves, the sinusoid's quarters
    head_rule: str = ""  # how the error says it

    @property
    def encodes(self) -> bool:
        """Whether there is a positional term at all (the logits "qr", "qk+qr" need one)."""
        return self.tables or self.absolute_keys

    @staticmethod
    def from_name(name: str) -> SasaPositional:
        """The factory: SASA's vocabulary ``SASA_POSITIONALS`` -> its encoding."""
        if name not in SASA_ENCODINGS:
            raise ValueError(f"positional must be one of {SASA_POSITIONALS}, got {name!r}")
        return SASA_ENCODINGS[name]

    def check_head_dim(self, dh: int) -> None:
        if dh % self.head_multiple:
            raise ValueError(f"{self.name} encoding needs {self.head_rule}, got {dh}")


SASA_ENCODINGS = {
    "relative": SasaPositional("relative", True, False, 2, "an even head dim"),
    "absolute": SasaPositional("absolute", False, True, 4, "head dim divisible by 4"),
    "none": SasaPositional("none", False, False, 1),
}
SASA_POSITIONALS = tuple(SASA_ENCODINGS)  # ("relative", "absolute", "none")


class SasaLogits(NamedTuple):
    """``logits``: whether the layer has keys (W_K, q^T k_ab) and whether the name asks for a
    positional term (q^T r)."""

    keys: bool
    needs_position: bool


LOGITS_KINDS = {
    "qk+qr": SasaLogits(True, True),
    "qk": SasaLogits(True, False),
    "qr": SasaLogits(False, True),
}
LOGITS = tuple(LOGITS_KINDS)  # ("qk+qr", "qk", "qr")


class LocalSelfAttention2d(NotScriptable, BackendKnob, nn.Module):
    """SASA local self-attention layer (Ramachandran et al., NeurIPS 2019, eq. 2-3), NCHW.

    Replaces a k x k convolution: 1x1 projections W_Q, W_K, W_V (no output projection), heads
    split ``out_channels``, every pixel attends its own centred k x k window; queries are scaled
    by ``1 / sqrt(d_h)``.

    Args:
        in_channels: channels of the input image.
        out_channels: channels of the output, split over the heads.
        num_heads: attention heads.
        kernel_size: side k of each pixel's window.
        stride: s; an s x s average pooling after the attention (output ``ceil(H / s)`` x
            ``ceil(W / s)``).
        positional: ``"relative"`` (learned rel_row/rel_col tables, concatenated:
            ``r_{a-i, b-j}``), ``"absolute"`` (a fixed 2-D sinusoid added to the keys:
            ``q^T (k_ab + p_ab)``) or ``"none"``.
        logits: ``"qk+qr"`` (eq. 3), ``"qk"`` (content only: positional ``"none"``) or ``"qr"``
            (position only, no W_K); default from ``positional``.
        padding: windows at the border: ``"mask"`` (pixels outside the image take no part) or
            ``"zeros"`` (they are zero keys and values, as a zero-padded convolution reads).
        backend: None (the plan's choice, ``kernel``; kernels/plan.py's LOCAL_TABLE),
            ``"reference"`` (unfold, the plain equations), ``"flex"``, ``"fused"``,
            ``"window"`` or ``"triton"`` (kernels/triton_local.py; needs triton).
    """

    BACKENDS = plan.LOCAL_BACKENDS  # the ``backend`` names it takes (kernels/plan.py)
    check_backend = staticmethod(triton_axis.check_backend)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_heads: int = 8,
        kernel_size: int = 7,
        stride: int = 1,
        positional: str = "relative",
        logits: str | None = None,
        padding: str = "mask",
        backend: str | None = None,
    ):
        super().__init__()
        for name, val in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("num_heads", num_heads),
            ("kernel_size", kernel_size),
            ("stride", stride),
        ):
            positive_int(name, val)
        encoding = SasaPositional.from_name(positional)
        logits = logits or ("qk+qr" if encoding.encodes else "qk")
        if logits not in LOGITS_KINDS:
            raise ValueError(f"logits must be one of {LOGITS}, got {logits!r}")
        if LOGITS_KINDS[logits].needs_position and not encoding.encodes:
            raise ValueError(f"logits={logits!r} needs a positional encoding, got {positional!r}")
        if not LOGITS_KINDS[logits].needs_position and encoding.encodes:  # it would add q^T r
            raise ValueError(
                f"logits={logits!r} has no positional term, got positional="
                f"{positional!r} (content only: positional='none')"
            )
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
        if num_heads < 1 or out_channels % num_heads:
            raise ValueError(f"out_channels={out_channels} not divisible by num_heads={num_heads}")
        if kernel_size < 1 or stride < 1:
            raise ValueError(f"kernel_size and stride must be >= 1, got {kernel_size}, {stride}")
        dh = out_channels // num_heads
        encoding.check_head_dim(dh)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_heads, self.head_dim = num_heads, dh
        self.kernel_size, self.stride = kernel_size, stride
        self.positional, self.logits, self.padding = positional, logits, padding
        self.encoding = encoding  # SasaPositional: what the forward adds, decided once
        self.scale = dh**-0.5
        self.backend = backend  # None: the plan's
        self.query = nn.Conv2d(in_channels, out_channels, 1, bias=False)  # W_Q
        keys = LOGITS_KINDS[logits].keys
        self.key = nn.Conv2d(in_channels, out_channels, 1, bias=False) if keys else None
        self.value = nn.Conv2d(in_channels, out_channels, 1, bias=False)  # W_V
        if encoding.tables:  # r_{a-i} and r_{b-j}, each d_h / 2, shared by the heads
            self.rel_row = nn.Parameter(torch.randn(kernel_size, dh // 2))
            self.rel_col = nn.Parameter(torch.randn(kernel_size, dh // 2))
        else:
            self.register_parameter("rel_row", None)
            self.register_parameter("rel_col", None)

    def case(
        self, device: torch.device | str, return_attention: bool = False, x=None
    ) -> plan.LocalCase:
        """What plan.LOCAL_TABLE reads of a call on ``device`` (``x`` (B, C, H, W): the input,
        whose sizes and (autocast's) dtype it reads; None: the layer's alone)."""
        device = torch.device(device).type
        dtype = None if x is None else autocast_dtype(device, x.dtype)
        b, h, w = (1, 0, 0) if x is None else (x.shape[0], *x.shape[-2:])
        grad = torch.is_grad_enabled() and (
            (x is not None and x.requires_grad) or any(p.requires_grad for p in self.parameters())
        )
        return plan.LocalCase(
            self.backend,
            device,
            self.padding,
            return_attention,
            plan.tracing(),
            dtype,
            h * w,
            plan.transforms_active(),
            plan.compiling(),
            False,
            self.kernel_size,
            b,
            self.num_heads,
            self.head_dim,
            self.head_dim,
            h,
            w,
            grad,
        )

    def kernel(
        self,
        device: torch.device | str,
        return_attention: bool = False,
        why: bool = False,
        x: torch.Tensor | None = None,
    ) -> str:
        """The kernel (plan.LOCAL_TABLE, local_kernels.LOCAL_KERNELS) ``forward`` runs on
        ``device`` (``why``: each earlier row passed over, then the one chosen,
        ``plan.explain``); ``x`` (B, C, H, W): the input, whose size and (autocast's) dtype the
        table reads (on CUDA; the Triton kernel's limits)."""
        case = self.case(device, return_attention, x)
        return (plan.explain if why else plan.choose)(case, plan.LOCAL_TABLE)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, nh, dh, H, W)
        b, _, h, w = x.shape
        return x.view(b, self.num_heads, self.head_dim, h, w)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, C_in, H, W) -> (B, C_out, H/s, W/s); with ``return_attention`` also the window
        probabilities ``(B, nh, H * W, k * k)`` at the input resolution (see ``local_to_dense``)."""
        check_tensor(x, self.query.weight.dtype)  # a non-empty float of the parameters' dtype
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected input (B, {self.in_channels}, H, W), got shape {tuple(x.shape)}"
            )
        bsz, _, h, w = x.shape
        if h < self.stride or w < self.stride:
            raise ValueError(f"input {h}x{w} is smaller than the stride {self.stride}")
        if return_attention:  # the windows' probabilities, refused first when they cannot fit
            check_maps(self, (bsz, self.num_heads, h * w, self.kernel_size**2), x)
        q = self._heads(self.query(x)) * self.scale  # (B, nh, dh, H, W)
        v = self._heads(self.value(x))
        k = self._heads(self.key(x)) if self.key is not None else None
        if self.encoding.absolute_keys:
            pe = sinusoid_2d(h, w, self.head_dim, device=x.device).to(x.dtype).t()  # (dh, H*W)
            pe = pe.view(self.head_dim, h, w)
            k = pe.expand(bsz, self.num_heads, -1, h, w) if k is None else k + pe
        case = self.case(x.device, return_attention, x)
        kernel = plan.choose(case, plan.LOCAL_TABLE)
        if self.backend is not None:
            maps = " and returns its maps" if return_attention else ""
            have = f'it has padding="{self.padding}"{maps} on {x.device.type}'
            plan.warn_if_passed_over(case, kernel, plan.LOCAL_TABLE, have)
        out = LOCAL_KERNELS[kernel](
            q,
            k,
            v,
            kernel_size=self.kernel_size,
            rel_row=self.rel_row,
            rel_col=self.rel_col,
            mix=None,
            padding=self.padding,
            return_attention=return_attention,
        )
        y, attn = out if return_attention else (out, None)
        y = y.reshape(bsz, self.out_channels, h, w)  # (B, nh*dv, H, W)
        if self.stride > 1:
            # downsampling after attention (sec. 3.1); ceil: ceil(H/s) like a strided conv
            y = F.avg_pool2d(y, self.stride, ceil_mode=True)
        return (y, attn) if return_attention else y

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, num_heads={self.num_heads}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, "
            f"positional={self.positional!r}, logits={self.logits!r}, padding={self.padding!r}"
        )
