"""SASA attention stem with spatially-aware values (Ramachandran et al., NeurIPS 2019, sec. 3.2).

RGB pixels are individually uninformative, so content-only attention struggles to learn edge
detectors at the stem. The values are made position-aware instead (eq. 4-5):

    v_ab = (sum_m p(a, b, m) W_V^m) x_ab,
    p(a, b, m) = softmax_m((emb_row(a) + emb_col(b))^T nu^m),

with emb_row / emb_col embeddings of the position inside the local window (relative to the
query, like the offsets of a convolution kernel) and m = 1..M value matrices. The logits are
content-only, q_ij^T k_ab, over the same per-pixel k x k window as LocalSelfAttention2d, whose
kernels it shares (kernels/local_kernels.py, picked by plan.LOCAL_TABLE). The layer is followed by
batch norm, ReLU and the stem's max pooling (``pool``; 4 in the paper's ImageNet stem, 1 for
CIFAR-size inputs).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import BackendKnob, check_maps, check_tensor, positive_int
from .kernels import plan
from .kernels.local_kernels import LOCAL_KERNELS
from .kernels.window import PADDINGS
from .scripting import NotScriptable


class AttentionStem2d(NotScriptable, BackendKnob, nn.Module):
    """Attention stem: local attention with spatially-aware values, then BN, ReLU, max pool.

    x (B, C_in, H, W) -> (B, C_out, H/pool, W/pool). ``mixtures`` M value matrices per head,
    ``kernel_size`` k the window (4 in the paper; even k covers offsets -(k-1)//2 .. k//2).

    Args:
        in_channels: channels of the input image (C_in).
        out_channels: channels of the output (C_out), split over the heads.
        num_heads: attention heads.
        kernel_size: side k of each pixel's window.
        mixtures: M, the value matrices W_V^m mixed per position (sec. 3.2).
        pool: side of the max pooling after BN and ReLU (1: none).
        norm: batch normalization before the ReLU.
        padding: windows at the border: ``"mask"`` (outside pixels take no part) or
            ``"zeros"`` (zero keys and values).
        backend: None (the plan's choice; kernels/plan.py's LOCAL_TABLE), ``"reference"``
            (unfold, the plain equations), ``"fused"`` or ``"window"``.
    """

    BACKENDS = plan.STEM_BACKENDS  # the ``backend`` names it takes (kernels/plan.py)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_heads: int = 8,
        kernel_size: int = 4,
        mixtures: int = 4,
        pool: int = 4,
        norm: bool = True,
        padding: str = "mask",
        backend: str | None = None,
    ):
        super().__init__()
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
        for name, val in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("num_heads", num_heads),
            ("kernel_size", kernel_size),
            ("mixtures", mixtures),
            ("pool", pool),
        ):
            positive_int(name, val)
        if num_heads < 1 or out_channels % num_heads:
            raise ValueError(f"out_channels={out_channels} not divisible by num_heads={num_heads}")
        if kernel_size < 1 or mixtures < 1 or pool < 1:
            raise ValueError(
                f"kernel_size, mixtures, pool must be >= 1, got {kernel_size}, {mixtures}, {pool}"
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_heads, self.head_dim = num_heads, out_channels // num_heads
        self.kernel_size, self.mixtures, self.pool = kernel_size, mixtures, pool
        self.padding = padding
        self.backend = backend  # None: the plan's
        self.scale = self.head_dim**-0.5
        self.query = nn.Conv2d(in_channels, out_channels, 1, bias=False)  # W_Q
        self.key = nn.Conv2d(in_channels, out_channels, 1, bias=False)  # W_K
        self.value = nn.Conv2d(in_channels, mixtures * out_channels, 1, bias=False)  # W_V^m
        emb_dim = out_channels
        self.emb_row = nn.Parameter(torch.randn(kernel_size, emb_dim) * emb_dim**-0.5)
        self.emb_col = nn.Parameter(torch.randn(kernel_size, emb_dim) * emb_dim**-0.5)
        self.nu = nn.Parameter(torch.randn(mixtures, emb_dim) * emb_dim**-0.5)  # nu^m
        self.norm = nn.BatchNorm2d(out_channels) if norm else nn.Identity()

    def mixture_weights(self) -> torch.Tensor:
        """p(a, b, m): (k*k, M), offsets in row-major order, each row summing to 1 (eq. 5)."""
        emb = self.emb_row[:, None, :] + self.emb_col[None, :, :]  # (k, k, D)
        return torch.softmax(emb.flatten(0, 1) @ self.nu.t(), dim=-1)  # (k^2, M)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With ``return_attention`` also the window probabilities ``(B, nh, H * W, k * k)`` at
        the input resolution."""
        check_tensor(x, self.query.weight.dtype)
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected input (B, {self.in_channels}, H, W), got shape {tuple(x.shape)}"
            )
        bsz, _, h, w = x.shape
        if h < self.pool or w < self.pool:
            raise ValueError(f"input {h}x{w} is smaller than the stem pooling {self.pool}")
        if return_attention:  # the windows' probabilities, refused first when they cannot fit
            check_maps(self, (bsz, self.num_heads, h * w, self.kernel_size**2), x)
        nh, dh, nm = self.num_heads, self.head_dim, self.mixtures
        q = self.query(x).view(bsz, nh, dh, h, w) * self.scale  # (B, nh, dh, H, W)
        k = self.key(x).view(bsz, nh, dh, h, w)
        v = self.value(x).view(bsz, nh, nm, dh, h, w)  # (B, nh, M, dh, H, W): W_V^m x
        out = LOCAL_KERNELS[self.kernel(x.device, return_attention)](
            q,
            k,
            v,
            kernel_size=self.kernel_size,
            rel_row=None,
            rel_col=None,
            mix=self.mixture_weights(),
            padding=self.padding,
            return_attention=return_attention,
        )
        y, attn = out if return_attention else (out, None)
        y = F.relu(self.norm(y.reshape(bsz, self.out_channels, h, w)))
        if self.pool > 1:
            y = F.max_pool2d(y, self.pool)
        return (y, attn) if return_attention else y

    def kernel(
        self, device: torch.device | str, return_attention: bool = False, why: bool = False
    ) -> str:
        """The window kernel ``forward`` runs on ``device`` (plan.LOCAL_TABLE, whose Flex and
        Triton kernels take no mixed values; ``why``: each row passed over, plan.explain)."""
        case = plan.LocalCase(
            self.backend,
            torch.device(device).type,
            self.padding,
            return_attention,
            plan.tracing(),
            transformed=plan.transforms_active(),
            compiled=plan.compiling(),
            mix=True,
        )
        return (plan.explain if why else plan.choose)(case, plan.LOCAL_TABLE)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, num_heads={self.num_heads}, "
            f"kernel_size={self.kernel_size}, mixtures={self.mixtures}, pool={self.pool}"
        )
