"""The quadratic (Gaussian) encodings of Cordonnier, Loukas, Jaggi (ICLR 2020), eq. 9:
-alpha_h ||delta - Delta_h||^2 with learned centres Delta (Nh, 2) and precision alpha (Nh,);
generalized: -1/2 (delta - Delta)^T Sigma_h^-1 (delta - Delta). delta = key - query pixel.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..checks import finite_float
from ..precision import hi, no_autocast
from .base import PositionalEncoding, pixel_coords
from .terms import (
    AxisTerm,
    GaussianTerm,
    ShiftTerm,
    isotropic_energy,
    spread_alpha,
    spread_precision,
)
from .upgrade import ALPHA_TO_SPREAD, FACTOR_TO_SPREAD, upgrade_on_load


def gaussian_offset_logits(qc, kc, ctr, prec) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9 with a full precision S, from the offsets d = key - query directly (no cancelling
    alpha H^2 terms): -1/2 (d - Delta)^T S (d - Delta) (Nh, Tq, Tk), and e = d - Delta
    (Nh, Tq, Tk, 2). qc (Tq, 2), kc (Tk, 2) pixel coordinates, ctr (Nh, 2), prec (Nh, 2, 2)
    symmetric. The generalized encoding's dense logits and the blocked kernel's both. (Eq. 9's
    general form; with S = 2 alpha I it is not ``isotropic_energy`` to the bit: alpha is
    distributed over the squares here, so the isotropic encoding keeps its own form.)"""
    e = (kc[None, None] - qc[None, :, None]) - ctr[:, None, None, :]  # (Nh, Tq, Tk, 2)
    s00, s01, s11 = (prec[:, i, j, None, None] for i, j in ((0, 0), (0, 1), (1, 1)))
    e0, e1 = e[..., 0], e[..., 1]
    return -0.5 * (e0 * e0 * s00 + 2 * e0 * e1 * s01 + e1 * e1 * s11), e


def shifted_axis(alpha: torch.Tensor, center: torch.Tensor, n: int) -> torch.Tensor:
    """(Nh, n, n) [q, k]: -alpha ((d - c)^2 - (d* - c)^2), d = k - q, of eq. 9 along one axis, less
    its per-query maximum (softmax is invariant to it), d* = clamp(round(c), -q, n - 1 - q) the
    offset nearest c, written as -alpha (d - d*) (d + d* - 2c): no cancellation, so near the
    maximum the logits keep float32's relative precision (-alpha (d - c)^2 is ~alpha c^2 there,
    rounded to ~alpha c^2 eps), and the gradients of alpha and c vanish exactly on the nearest
    offset (the shift's own gradient multiplies the sum over keys of dL/dlogits, zero in exact
    arithmetic: kept, its rounding is amplified by 2 alpha (d* - c)). alpha, c (Nh,).
    Eq. 9 per axis in this shifted form for precision, not ``isotropic_energy``'s plain one."""
    r = torch.arange(n, device=alpha.device)
    d = (r[None, :] - r[:, None]).to(alpha.dtype)  # (n, n) k - q
    lo, top = -r[:, None], n - 1 - r[:, None]  # (n, 1) valid offsets of each query
    near = torch.round(center.detach())[:, None, None]  # (Nh, 1, 1)
    ds = torch.minimum(torch.maximum(near, lo.to(d.dtype)), top.to(d.dtype))  # (Nh, n, 1)
    c = center[:, None, None]
    return -alpha[:, None, None] * (d - ds) * (d + ds - 2 * c)


class GaussianEncoding(PositionalEncoding):
    """What the isotropic and generalized quadratic encodings share: learned centres Delta and
    spreads (never decayed), dense logits ``dense_logits(h, w)`` and their low-rank position
    fold, whose large terms cancel (folded in float32)."""

    no_weight_decay = ("centers", "spread")  # geometry, never decayed (reference code)

    def gaussian(self, h: int, w: int) -> GaussianTerm:
        return GaussianTerm(owner=self, h=h, w=w, centers=self.centers, spread=self.spread)

    def dense_bias(self, q, k, h: int, w: int, dtype) -> torch.Tensor:
        return self.dense_logits(h, w)[None]  # float32 at least

    def position_logits(self, h: int, w: int) -> torch.Tensor:
        """(Nh, T, T) position-only logits from the low-rank fold, each query's maximum shifted
        to 0 (softmax is invariant to it). The folded terms grow as alpha H^2 and cancel in
        float32 (docs/benchmarks.md, "Figures behind the code's comments"): the fold's product
        and the shift run in float64, so only the final probabilities are rounded. Returned in
        float64: the softmax runs there too, so that its backward's dlogits meet the fold's
        large key terms without float32 rounding (callers cast the probabilities)."""
        with no_autocast(self.centers.device.type):
            q_pos, k_pos = self.position_fold(h, w, torch.float64)  # (Nh, T, r), (T, r)
            lg = q_pos @ k_pos.t()
            return lg - lg.amax(-1, keepdim=True).detach()


class QuadraticEncoding(GaussianEncoding):
    """Eq. 9: logits_h(q, k) = -alpha_h ||k - q - Delta_h||^2 (the ||Delta||^2 term of the paper's
    v^T r_delta is constant per query and cancels in the softmax).

    ``centers`` (Nh, 2) = Delta in pixels (row, col), init N(0, init_centers_std^2 I).
    ``spread`` (Nh,) = s, the reference code's inverse standard deviation: Sigma^-1 = s^2 I, so
    alpha = s^2 / 2 >= 0 whatever s, and a step on s moves alpha by s ds (faster as the head
    sharpens). Init s = sqrt(2 init_alpha) (1 + N(0, init_spread_std^2)): 1 + N(0, 0.01^2) at
    the default alpha 0.5, as in the reference. ``hard=True`` is the alpha -> infinity limit:
    one-hot on pixel clamp(q + round(Delta_h)) per axis.

    Args:
        num_heads: Nh, one centre and one spread per head.
        hard: one-hot heads (alpha -> infinity), position only.
        init_centers_std: standard deviation of the centres' initial N(0, std^2 I), in pixels.
        init_alpha: the initial alpha (a head's sharpness).
        init_spread_std: relative noise on the initial spreads.
    """

    name = "quadratic"

    def __init__(
        self,
        num_heads: int,
        *,
        hard: bool = False,
        init_centers_std: float = 2.0,
        init_alpha: float = 0.5,
        init_spread_std: float = 0.01,
    ):
        super().__init__()
        init_alpha = finite_float("init_alpha", init_alpha, positive=True)
        init_centers_std = finite_float("init_centers_std", init_centers_std)
        init_spread_std = finite_float("init_spread_std", init_spread_std)
        self.num_heads, self.hard = num_heads, hard
        self.centers = nn.Parameter(torch.randn(num_heads, 2) * init_centers_std)
        s0 = (2.0 * init_alpha) ** 0.5
        self.spread = nn.Parameter(s0 * (1 + init_spread_std * torch.randn(num_heads)))
        upgrade_on_load(self, ALPHA_TO_SPREAD)  # checkpoints of the direct alpha

    @property
    def alpha(self) -> torch.Tensor:
        """(Nh,) precision alpha = s^2 / 2 (float32 at least), differentiable in ``spread``."""
        return spread_alpha(self.spread)

    def check(self, content: bool) -> None:
        if self.hard and content:
            raise ValueError("hard=True (one-hot attention) needs content=False")

    def term(self, h: int, w: int, *, content: bool) -> AxisTerm | ShiftTerm:
        """Separable row + column logits (or, hard, the shift), with content too: each query's
        row and column logits against the key's (and, in-kernel, eq. 9 from the offsets)."""
        self.check(content)
        if self.hard:
            rows, cols = self.hard_indices(h, w)
            return ShiftTerm(owner=self, h=h, w=w, rows=rows, cols=cols)
        return AxisTerm(owner=self, h=h, w=w, gaussian=self.gaussian(h, w))

    @torch.no_grad()
    def set_alpha(self, alpha) -> None:
        """Set every head's (or, with an (Nh,) tensor, each head's) alpha: s = sqrt(2 alpha)."""
        a = torch.as_tensor(alpha, dtype=torch.float64)
        if a.dim() > 1 or a.numel() not in (1, self.num_heads):
            raise ValueError(
                f"alpha must be a number or ({self.num_heads},), one per head, got shape "
                f"{tuple(a.shape)}"
            )
        if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        self.spread.copy_(torch.sqrt(2 * a).to(self.spread).expand_as(self.spread))

    def axis_logits(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Separable form: row logits (Nh, h, h) [q1, k1] and column logits (Nh, w, w), float32
        at least whatever ``dtype``, each query's maximum shifted to 0 (see ``shifted_axis``)."""
        a, ctr = hi(self.alpha), hi(self.centers)
        return shifted_axis(a, ctr[:, 0], h), shifted_axis(a, ctr[:, 1], w)

    def dense_logits(self, h: int, w: int) -> torch.Tensor:
        """(Nh, T, T): -alpha ||delta - Delta||^2 for every (query, key) pair, or 0/-inf if hard."""
        p = pixel_coords(h, w, self.alpha.device, hi(self.alpha).dtype)  # (T, 2)
        delta = p[None, :, :] - p[:, None, :]  # (T, T, 2) key - query
        if self.hard:
            r, c = self.hard_indices(h, w)  # (Nh, h), (Nh, w)
            tgt = (r[:, :, None] * w + c[:, None, :]).reshape(self.num_heads, h * w)  # (Nh, T)
            keep = torch.zeros(self.num_heads, h * w, h * w, dtype=torch.bool, device=p.device)
            keep.scatter_(2, tgt[..., None], True)
            zero = torch.zeros((), dtype=p.dtype, device=p.device)
            return torch.where(keep, zero, torch.full_like(zero, float("-inf")))
        diff = delta[None] - hi(self.centers)[:, None, None, :]  # (Nh, T, T, 2)
        return -isotropic_energy(hi(self.alpha)[:, None, None], diff[..., 0], diff[..., 1])

    def position_fold(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank-3 bilinear form of the logits: q_pos (Nh, T, 3) . k_pos (T, 3) equals
        -alpha ||k - q - Delta||^2 up to a per-query constant:
        2 alpha k.(q + Delta) - alpha ||k||^2 (centred coordinates), in ``dtype`` (default
        float32 at least). Eq. 9 as a bilinear form, for the kernels that fold it into q/k; its
        large terms cancel, so the offset forms (``dense_logits``) stay for precision."""
        a = hi(self.alpha)[:, None, None]
        a = a if dtype is None else a.to(dtype)
        p = pixel_coords(h, w, a.device, a.dtype)  # (T, 2)
        target = p[None] + self.centers.to(a.dtype)[:, None, :]  # (Nh, T, 2)
        q_pos = torch.cat([2 * a * target, -a.expand(-1, h * w, 1)], dim=-1)  # (Nh, T, 3)
        k_pos = torch.cat([p, p.pow(2).sum(-1, keepdim=True)], dim=-1)  # (T, 3)
        return q_pos, k_pos

    def hard_indices(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Target row (Nh, h) and column (Nh, w) indices: clamp(q + round(Delta)) per axis."""
        sh = torch.round(self.centers.detach()).long()  # (Nh, 2)
        rows = torch.arange(h, device=sh.device)[None, :] + sh[:, :1]
        cols = torch.arange(w, device=sh.device)[None, :] + sh[:, 1:]
        return rows.clamp(0, h - 1), cols.clamp(0, w - 1)


class GeneralizedQuadraticEncoding(GaussianEncoding):
    """Generalized eq. 9: logits_h = -1/2 (delta - Delta_h)^T Sigma_h^-1 (delta - Delta_h), with
    Sigma_h^-1 = A_h A_h^T positive semi-definite, A = ``spread`` (Nh, 2, 2), Sigma^-1/2 up to a
    rotation, init sqrt(2 init_alpha) (I + N(0, 0.01^2)): the isotropic encoding's start
    (Sigma^-1 = 2 alpha I), I + N(0, 0.01^2) at the default alpha 0.5 (the reference code's
    ``attention_spreads``, same product).
    As a relative encoding, r_delta = (d1^2, d2^2, d1 d2, d1, d2): Dp = 5. Checkpoints of the
    former ``precision_factor`` L (Sigma^-1 = L^T L) load as A = L^T.

    Args:
        num_heads: Nh, one centre and one (2, 2) spread per head.
        init_centers_std: standard deviation of the centres' initial N(0, std^2 I), in pixels.
        init_alpha: the initial precision as the isotropic encoding's alpha (Sigma^-1 = 2 alpha I).
        hard: not defined for this encoding (an error if True).
    """

    name = "quadratic_generalized"

    def __init__(
        self,
        num_heads: int,
        *,
        init_centers_std: float = 2.0,
        init_alpha: float = 0.5,
        hard: bool = False,
    ):
        super().__init__()
        if hard:
            raise ValueError("hard=True is only defined for positional='quadratic'")
        init_centers_std = finite_float("init_centers_std", init_centers_std)
        init_alpha = finite_float("init_alpha", init_alpha, positive=True)
        self.num_heads = num_heads
        self.centers = nn.Parameter(torch.randn(num_heads, 2) * init_centers_std)
        s0 = (2.0 * init_alpha) ** 0.5  # A = s0 I: Sigma^-1 = 2 alpha I; 1.0 at alpha 0.5
        A = torch.eye(2).repeat(num_heads, 1, 1) + 0.01 * torch.randn(num_heads, 2, 2)
        self.spread = nn.Parameter(s0 * A)
        upgrade_on_load(self, FACTOR_TO_SPREAD)  # checkpoints of the factor L

    @property
    def precision(self) -> torch.Tensor:
        """Sigma^-1 (Nh, 2, 2) = A A^T."""
        return spread_precision(self.spread)

    def term(self, h: int, w: int, *, content: bool) -> GaussianTerm:
        return self.gaussian(h, w)

    def dense_logits(self, h: int, w: int) -> torch.Tensor:
        ctr = hi(self.centers)
        p = pixel_coords(h, w, ctr.device, ctr.dtype)
        return gaussian_offset_logits(p, p, ctr, self.precision)[0]  # (Nh, T, T)

    def position_fold(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """q_pos (Nh, T, 5) . k_pos (T, 5) = k^T S (q + Delta) - 1/2 k^T S k (+ per-query const),
        in ``dtype`` (default float32 at least): generalized eq. 9 as a bilinear form (the fold;
        ``gaussian_offset_logits`` is the offset form, kept for precision)."""
        ctr = hi(self.centers) if dtype is None else self.centers.to(dtype)
        p = pixel_coords(h, w, ctr.device, ctr.dtype)  # (T, 2)
        # S = A A^T in the fold's dtype: its large terms reach dS, whose rounding in a bf16
        # product (a backward inside autocast) would not cancel in dA = (dS + dS^T) A
        s = spread_precision(self.spread.to(ctr.dtype))  # (Nh, 2, 2)
        target = p[None] + ctr[:, None, :]  # (Nh, T, 2)
        lin = torch.einsum("hij,htj->hti", s, target)  # (Nh, T, 2)
        quad = torch.stack([-0.5 * s[:, 0, 0], -0.5 * s[:, 1, 1], -s[:, 0, 1]], -1)  # (Nh, 3)
        q_pos = torch.cat([lin, quad[:, None, :].expand(-1, h * w, 3)], dim=-1)  # (Nh, T, 5)
        k_pos = torch.cat([p, p.pow(2), p[:, :1] * p[:, 1:]], dim=-1)  # (T, 5)
        return q_pos, k_pos
