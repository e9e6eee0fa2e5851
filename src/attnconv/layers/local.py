"""Stand-Alone Self-Attention: exact per-pixel local k x k attention (Ramachandran et al. 2019).

    y_ij = sum_{(a,b) in N_k(i,j)} softmax_ab(q_ij^T k_ab + q_ij^T r_{a-i,b-j}) v_ab      (eq. 2-3)

with r_{a-i,b-j} = concat(rel_row[a-i], rel_col[b-j]), each half of the head's channels, the
window N_k(i, j) centred on every pixel (not blocked halo attention), heads splitting the
channels and 1x1 projections, so the weights do not grow with k (only the k x d_h relative
tables do). Stride s = s x s average pooling after the attention (sec. 3.1).

The kernel (fast path and plain reference) is local_kernel.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import check_tensor, positive_int
from .flex import flex_local_attention
from .functional import check_impl
from .local_kernel import (  # noqa: F401  (re-exported: the kernel's public names)
    PADDINGS,
    local_attention,
    local_to_dense,
    window_pad,
    window_valid,
)
from .scripting import NotScriptable
from .sinusoidal import sinusoid_2d

SASA_POSITIONALS = ("relative", "absolute", "none")  # sec. 4.3; not the Dai eq. 8 names
LOGITS = ("qk+qr", "qk", "qr")


class LocalSelfAttention2d(NotScriptable, nn.Module):
    """SASA local self-attention layer (Ramachandran et al., NeurIPS 2019, eq. 2-3), NCHW.

    Replaces a k x k convolution: 1x1 projections W_Q, W_K, W_V (no output projection), heads
    split ``out_channels``, every pixel attends its own centred k x k window. ``positional``:
    "relative" (learned rel_row/rel_col tables, concat = r_{a-i,b-j}), "absolute" (fixed 2D
    sinusoid added to the keys: q^T (k_ab + p_ab)) or "none". ``logits``: "qk+qr" (eq. 3),
    "qk" (content only) or "qr" (position only, no W_K). Queries are scaled by 1/sqrt(d_h).
    ``stride`` s: s x s average pooling after the attention (output ceil(H/s) x ceil(W/s)).
    """

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
        impl: str = "auto",
    ):
        super().__init__()
        for name, val in (("in_channels", in_channels), ("out_channels", out_channels),
                          ("num_heads", num_heads), ("kernel_size", kernel_size),
                          ("stride", stride)):  # fmt: skip
            positive_int(name, val)
        if positional not in SASA_POSITIONALS:
            raise ValueError(f"positional must be one of {SASA_POSITIONALS}, got {positional!r}")
        logits = logits or ("qk" if positional == "none" else "qk+qr")
        if logits not in LOGITS:
            raise ValueError(f"logits must be one of {LOGITS}, got {logits!r}")
        if positional == "none" and logits != "qk":
            raise ValueError(f"logits={logits!r} needs a positional encoding, got 'none'")
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
        check_impl(impl)
        if num_heads < 1 or out_channels % num_heads:
            raise ValueError(f"out_channels={out_channels} not divisible by num_heads={num_heads}")
        if kernel_size < 1 or stride < 1:
            raise ValueError(f"kernel_size and stride must be >= 1, got {kernel_size}, {stride}")
        dh = out_channels // num_heads
        if positional == "relative" and dh % 2:
            raise ValueError(f"relative encoding needs an even head dim, got {dh}")
        if positional == "absolute" and dh % 4:
            raise ValueError(f"absolute encoding needs head dim divisible by 4, got {dh}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_heads, self.head_dim = num_heads, dh
        self.kernel_size, self.stride = kernel_size, stride
        self.positional, self.logits, self.padding, self.impl = positional, logits, padding, impl
        self.scale = dh**-0.5
        self.absolute_keys = positional == "absolute"  # q^T (k_ab + p_ab), decided once
        self.flex_backend: bool | None = None  # None: FlexAttention on CUDA (see _use_flex)
        self.query = nn.Conv2d(in_channels, out_channels, 1, bias=False)  # W_Q
        self.key = nn.Conv2d(in_channels, out_channels, 1, bias=False) if "qk" in logits else None
        self.value = nn.Conv2d(in_channels, out_channels, 1, bias=False)  # W_V
        if positional == "relative":  # r_{a-i} and r_{b-j}, each d_h / 2, shared by the heads
            self.rel_row = nn.Parameter(torch.randn(kernel_size, dh // 2))
            self.rel_col = nn.Parameter(torch.randn(kernel_size, dh // 2))
        else:
            self.register_parameter("rel_row", None)
            self.register_parameter("rel_col", None)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, nh, dh, H, W)
        b, _, h, w = x.shape
        return x.view(b, self.num_heads, self.head_dim, h, w)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, C_in, H, W) -> (B, C_out, H/s, W/s); with ``return_attention`` also the window
        probabilities (B, nh, H*W, k*k) at the input resolution (see ``local_to_dense``)."""
        check_tensor(x, self.query.weight.dtype)  # a non-empty float of the parameters' dtype
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected input (B, {self.in_channels}, H, W), got shape {tuple(x.shape)}"
            )
        bsz, _, h, w = x.shape
        if h < self.stride or w < self.stride:
            raise ValueError(f"input {h}x{w} is smaller than the stride {self.stride}")
        q = self._heads(self.query(x)) * self.scale  # (B, nh, dh, H, W)
        v = self._heads(self.value(x))
        k = self._heads(self.key(x)) if self.key is not None else None
        rel_row, rel_col = self.rel_row, self.rel_col
        if self.absolute_keys:
            pe = sinusoid_2d(h, w, self.head_dim, device=x.device).to(x.dtype).t()  # (dh, H*W)
            pe = pe.view(self.head_dim, h, w)
            k = pe.expand(bsz, self.num_heads, -1, h, w) if k is None else k + pe
        if self._use_flex(x.device, return_attention):
            out = self._flex(q, k, v)
        else:
            out = local_attention(
                q, k, v, kernel_size=self.kernel_size, rel_row=rel_row, rel_col=rel_col,
                padding=self.padding, impl=self.impl, return_attention=return_attention,
            )  # fmt: skip
        y, attn = out if return_attention else (out, None)
        y = y.reshape(bsz, self.out_channels, h, w)  # (B, nh*dv, H, W)
        if self.stride > 1:
            # downsampling after attention (sec. 3.1); ceil: ceil(H/s) like a strided conv
            y = F.avg_pool2d(y, self.stride, ceil_mode=True)
        return (y, attn) if return_attention else y

    def _use_flex(self, device: torch.device, return_attention: bool) -> bool:
        """FlexAttention (flex.py) on CUDA, or when ``flex_backend`` forces it (CPU tests): masked
        borders, the plain (non-reference) path, no returned maps."""
        on = self.flex_backend if self.flex_backend is not None else device.type == "cuda"
        return bool(on) and self.padding == "mask" and self.impl == "auto" and not return_attention

    def _flex(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor:
        qr_row = qr_col = None
        if self.rel_row is not None:  # q^T r_{a-i,b-j}, per query and offset (B, nh, k, H, W)
            half = self.head_dim // 2
            qr_row = torch.einsum("bndhw,kd->bnkhw", q[:, :, :half], self.rel_row)
            qr_col = torch.einsum("bndhw,kd->bnkhw", q[:, :, half:], self.rel_col)
        return flex_local_attention(q, k, v, self.kernel_size, qr_row, qr_col,
                                    compiled=q.device.type == "cuda")  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, num_heads={self.num_heads}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, "
            f"positional={self.positional!r}, logits={self.logits!r}, padding={self.padding!r}"
        )
