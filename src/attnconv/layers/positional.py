"""2D positional encodings of Cordonnier, Loukas, Jaggi (ICLR 2020), sec. 2 and 4.

- absolute (eq. 7): P (T, C) added to the input of the query/key projections, learned or 2D
  sinusoidal (half the channels encode the row, half the column);
- relative, Dai et al. (eq. 8): r_delta = concat(r_row(delta1), r_col(delta2)), fixed or learned,
  projected per head by What_k, with global biases u (content) and v (position);
- learned relative (sec. 4.3): row and column tables, read by the query or by per-head keys;
- quadratic (eq. 9): -alpha_h ||delta - Delta_h||^2 with learned centres Delta (Nh, 2) and
  precision alpha (Nh,); generalized: -1/2 (delta - Delta)^T Sigma_h^-1 (delta - Delta).

delta = key position - query position, in pixels, (row, col). Tables are indexed by
delta + max_size - 1. Every module here is small: the attention math lives in mhsa2d.py and
quadratic.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import finite_float
from .flex import axis_score_mod, gaussian_score_mod
from .sinusoidal import sinusoid_1d, sinusoid_2d


def hi(t: torch.Tensor) -> torch.Tensor:
    """float32 copy of a bfloat16/float16 parameter: positional logits like alpha (d - Delta)^2
    reach 1e5+ and need float32 precision whatever the layer's dtype."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def check_size(h: int, w: int, max_size: int, what: str) -> None:
    if h > max_size or w > max_size:
        raise ValueError(
            f"input {h}x{w} is larger than the learned {what} table (max_size={max_size}); "
            f"build the layer with max_size >= {max(h, w)}"
        )


def relative_index(n: int, device=None) -> torch.Tensor:
    """(n, n) long: [q, k] -> k - q + n - 1, the row of a (2n-1)-entry table of offsets."""
    r = torch.arange(n, device=device)
    return r[None, :] - r[:, None] + n - 1


def pixel_coords(h: int, w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(h*w, 2) (row, col) of every pixel in row-major order, centred on the image middle
    (offsets are unchanged; centring keeps the folded quadratic logits small)."""
    i = torch.arange(h, device=device, dtype=dtype) - (h - 1) / 2
    j = torch.arange(w, device=device, dtype=dtype) - (w - 1) / 2
    return torch.stack(torch.meshgrid(i, j, indexing="ij"), dim=-1).reshape(h * w, 2)


def gaussian_offset_logits(qc, kc, ctr, prec) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9 with a full precision S, from the offsets d = key - query directly (no cancelling
    alpha H^2 terms): -1/2 (d - Delta)^T S (d - Delta) (Nh, Tq, Tk), and e = d - Delta
    (Nh, Tq, Tk, 2). qc (Tq, 2), kc (Tk, 2) pixel coordinates, ctr (Nh, 2), prec (Nh, 2, 2)
    symmetric. The generalized encoding's dense logits and the blocked kernel's both."""
    e = (kc[None, None] - qc[None, :, None]) - ctr[:, None, None, :]  # (Nh, Tq, Tk, 2)
    s00, s01, s11 = (prec[:, i, j, None, None] for i, j in ((0, 0), (0, 1), (1, 1)))
    e0, e1 = e[..., 0], e[..., 1]
    return -0.5 * (e0 * e0 * s00 + 2 * e0 * e1 * s01 + e1 * e1 * s11), e


def axis_onehot(h: int, w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(h*w, h + w): one-hot row then one-hot column of every pixel in row-major order."""
    t = torch.arange(h * w, device=device)
    return torch.cat([F.one_hot(t // w, h), F.one_hot(t % w, w)], -1).to(dtype)


def shifted_axis(alpha: torch.Tensor, center: torch.Tensor, n: int) -> torch.Tensor:
    """(Nh, n, n) [q, k]: -alpha ((d - c)^2 - (d* - c)^2), d = k - q, of eq. 9 along one axis, less
    its per-query maximum (softmax is invariant to it), d* = clamp(round(c), -q, n - 1 - q) the
    offset nearest c, written as -alpha (d - d*) (d + d* - 2c): no cancellation, so near the
    maximum the logits keep float32's relative precision (-alpha (d - c)^2 is ~alpha c^2 there,
    rounded to ~alpha c^2 eps), and the gradients of alpha and c vanish exactly on the nearest
    offset (the shift's own gradient multiplies the sum over keys of dL/dlogits, zero in exact
    arithmetic: kept, its rounding is amplified by 2 alpha (d* - c)). alpha, c (Nh,)."""
    r = torch.arange(n, device=alpha.device)
    d = (r[None, :] - r[:, None]).to(alpha.dtype)  # (n, n) k - q
    lo, top = -r[:, None], n - 1 - r[:, None]  # (n, 1) valid offsets of each query
    near = torch.round(center.detach())[:, None, None]  # (Nh, 1, 1)
    ds = torch.minimum(torch.maximum(near, lo.to(d.dtype)), top.to(d.dtype))  # (Nh, n, 1)
    c = center[:, None, None]
    return -alpha[:, None, None] * (d - ds) * (d + ds - 2 * c)


class PositionalEncoding(nn.Module):
    """What every positional encoding tells the attention layer, which picks its path by asking
    (never by the encoding's name):

    - ``input_dependent``: its logits read the queries/keys (the layer folds them into q/k);
    - ``separable``: position-only logits a(q1, k1) + b(q2, k2): ``axis_logits(h, w, dtype)``;
    - ``position_foldable``: position-only logits of low rank: ``position_fold(h, w)``;
    - ``adds_to_input``: absolute P (T, C) added to the input of Wq/Wk: ``self(h, w)``;
    - ``uses_qk_product``: the layer's q.k term is part of the logits;
    - ``large_logits``: the folded attention runs in float32 under autocast (quadratic: large
      logits that cancel; learned relative: bfloat16 SDPA's backward, relative.py);
    - ``axis_folded``: ``fold`` returns [q_axis (B, Nh, T, h + w)] against one-hot key rows and
      columns (the layer may add them as a score_mod instead: flex.py);
    - ``learned_size``: side of its learned tables (None: any image size);
    - ``hard``: one-hot heads (``hard_indices``).

    And the same methods: ``dense_bias(q, k, h, w, dtype)`` -> (B|1, Nh, T, T) or None (the plain
    equations), ``fold(q, k, h, w)`` -> extra (query, key) columns whose products are those
    logits (for the fused kernel).
    """

    name = "none"
    input_dependent = False
    separable = False
    position_foldable = False
    adds_to_input = False
    uses_qk_product = True
    large_logits = False
    axis_folded = False
    learned_size: int | None = None
    hard = False

    def axis_logits(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} is not separable")

    def position_fold(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no low-rank position fold")

    def position_logits(self, h: int, w: int) -> torch.Tensor:
        """(Nh, T, T) position-only logits from the low-rank fold, each query's maximum shifted
        to 0 (softmax is invariant to it). The folded terms grow as alpha
        H^2 and cancel (float32 lost 1e-2 of the output at 1 x 1000 pixels, 5-13x the dense
        path's error at 32 x 32): the fold's product and the shift run in float64, so only
        the final probabilities are rounded. Returned in float64: the softmax runs there too,
        so that its backward's dlogits meet the fold's large key terms without float32
        rounding (callers cast the probabilities)."""
        with torch.autocast(self.centers.device.type, enabled=False):
            q_pos, k_pos = self.position_fold(h, w, torch.float64)  # (Nh, T, r), (T, r)
            lg = q_pos @ k_pos.t()
            return lg - lg.amax(-1, keepdim=True).detach()

    def dense_bias(self, q, k, h: int, w: int, dtype) -> torch.Tensor | None:
        return None

    def fold(self, q, k, h: int, w: int) -> tuple[list, list]:
        return [], []

    def flex_score_mod(self, q, k, h: int, w: int, *, grad: bool = True):
        """The positional logits as a FlexAttention score_mod (flex.py), axis-folded encodings:
        each query's row/column logits q_axis gathered at the key's row and column. ``grad``:
        the encoding's parameters need gradients (see QuadraticEncoding)."""
        (q_axis,), _ = self.fold(q, k, h, w)  # (B|1, Nh, T, h + w)
        return axis_score_mod(q_axis, h, w)


class NoEncoding(PositionalEncoding):
    """``positional="none"``: no positional term (position-only: uniform attention)."""

    separable = True

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads

    def axis_logits(self, h: int, w: int, dtype=None):
        dt, nh = dtype or torch.float32, self.num_heads
        return torch.zeros(nh, h, h, dtype=dt), torch.zeros(nh, w, w, dtype=dt)


class AbsolutePositionalEncoding2d(PositionalEncoding):
    """P (h*w, C) of eq. 7: learned row/column tables or fixed 2D sinusoids."""

    adds_to_input = True

    def __init__(self, channels: int, *, learned: bool, max_size: int = 64):
        super().__init__()
        self.channels, self.learned, self.max_size = channels, learned, max_size
        self.name = "absolute_learned" if learned else "absolute_sinusoidal"
        self.learned_size = max_size if learned else None
        c_row = channels // 2
        if learned:
            self.row = nn.Parameter(torch.randn(max_size, c_row) * 0.02)
            self.col = nn.Parameter(torch.randn(max_size, channels - c_row) * 0.02)
        # no state: follows .to(device) so the fixed sinusoids are made where the layer lives
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)

    def forward(self, h: int, w: int) -> torch.Tensor:
        if not self.learned:
            return sinusoid_2d(h, w, self.channels, device=self.device_anchor.device)
        check_size(h, w, self.max_size, "absolute positional")
        c_row = self.row.shape[1]
        return torch.cat(
            [
                self.row[:h, None, :].expand(h, w, c_row),
                self.col[None, :w, :].expand(h, w, self.channels - c_row),
            ],
            dim=-1,
        ).reshape(h * w, self.channels)


class RelativeTables2d(nn.Module):
    """r_row(delta1) (dim_row) and r_col(delta2) (dim_col) for delta in [-(n-1), n-1]:
    learned tables of 2*max_size-1 rows, or fixed sinusoids of the offset."""

    def __init__(self, dim_row: int, dim_col: int, *, learned: bool, max_size: int = 64):
        super().__init__()
        self.dim_row, self.dim_col = dim_row, dim_col
        self.learned, self.max_size = learned, max_size
        if learned:
            self.rel_row = nn.Parameter(torch.randn(2 * max_size - 1, dim_row))
            self.rel_col = nn.Parameter(torch.randn(2 * max_size - 1, dim_col))
        # no state: follows .to(device) so the fixed sinusoids are made where the layer lives
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)

    def forward(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(2h-1, dim_row), (2w-1, dim_col); entry d + n - 1 holds offset d."""
        if not self.learned:
            dev = self.device_anchor.device
            dr = torch.arange(-(h - 1), h, dtype=torch.float32, device=dev)
            dc = torch.arange(-(w - 1), w, dtype=torch.float32, device=dev)
            return sinusoid_1d(dr, self.dim_row), sinusoid_1d(dc, self.dim_col)
        check_size(h, w, self.max_size, "relative positional")
        m = self.max_size
        return self.rel_row[m - h : m + h - 1], self.rel_col[m - w : m + w - 1]


class GaussianEncoding(PositionalEncoding):
    """What the isotropic and generalized quadratic encodings share: learned centres Delta and
    spreads (never decayed), dense logits ``dense_logits(h, w)`` and their low-rank position
    fold, whose large terms cancel (folded in float32)."""

    no_weight_decay = ("centers", "spread")  # geometry, never decayed (reference code)
    position_foldable, large_logits = True, True

    def dense_bias(self, q, k, h: int, w: int, dtype) -> torch.Tensor:
        return self.dense_logits(h, w)[None]  # float32 at least

    def fold(self, q, k, h: int, w: int) -> tuple[list, list]:
        return expand_fold(self.position_fold(h, w), q)


class QuadraticEncoding(GaussianEncoding):
    """Eq. 9: logits_h(q, k) = -alpha_h ||k - q - Delta_h||^2 (the ||Delta||^2 term of the paper's
    v^T r_delta is constant per query and cancels in the softmax).

    ``centers`` (Nh, 2) = Delta in pixels (row, col), init N(0, init_centers_std^2 I).
    ``spread`` (Nh,) = s, the reference code's inverse standard deviation: Sigma^-1 = s^2 I, so
    alpha = s^2 / 2 >= 0 whatever s, and a step on s moves alpha by s ds (faster as the head
    sharpens). Init s = sqrt(2 init_alpha) (1 + N(0, init_spread_std^2)): 1 + N(0, 0.01^2) at
    the default alpha 0.5, as in the reference. ``hard=True`` is the alpha -> infinity limit:
    one-hot on pixel clamp(q + round(Delta_h)) per axis.
    """

    name, separable, axis_folded = "quadratic", True, True

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
        self.register_load_state_dict_pre_hook(_alpha_to_spread)

    @property
    def alpha(self) -> torch.Tensor:
        """(Nh,) precision alpha = s^2 / 2 (float32 at least), differentiable in ``spread``."""
        return 0.5 * hi(self.spread) ** 2

    @torch.no_grad()
    def set_alpha(self, alpha) -> None:
        """Set every head's (or, with an (Nh,) tensor, each head's) alpha: s = sqrt(2 alpha)."""
        a = torch.as_tensor(alpha, dtype=torch.float64)
        if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        self.spread.copy_(torch.sqrt(2 * a).to(self.spread).expand_as(self.spread))

    def axis_logits(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Separable form: row logits (Nh, h, h) [q1, k1] and column logits (Nh, w, w), float32
        at least whatever ``dtype``, each query's maximum shifted to 0 (see ``shifted_axis``)."""
        a, ctr = hi(self.alpha), hi(self.centers)
        return shifted_axis(a, ctr[:, 0], h), shifted_axis(a, ctr[:, 1], w)

    def fold(self, q, k, h: int, w: int) -> tuple[list, list]:
        """Exact fold with content: each query's row logits R[q1, :] (h) and column logits
        C[q2, :] (w) meet one-hot key rows and columns, so q_pos . k_pos = R[q1, k1] + C[q2, k2],
        the dense path's bias less a per-query constant (``shifted_axis``; products with 0 and 1
        are exact); their gradients reduce by sums over the expanded axes. The rank-3 coordinate
        fold (``position_fold``) is cheaper, but its logits are differences of products
        ~alpha (H^2 + W^2) / 4 that cancel (float32 error growing with image size and alpha;
        tests/test_precision.py)."""
        row, col = self.axis_logits(h, w)  # (Nh, h, h), (Nh, w, w)
        nh, t = row.shape[0], h * w
        q_pos = torch.cat([row[:, :, None, :].expand(nh, h, w, h).reshape(nh, t, h),
                           col[:, None].expand(nh, h, w, w).reshape(nh, t, w)], -1)  # fmt: skip
        return expand_fold((q_pos, axis_onehot(h, w, row.device, row.dtype)), q)

    def flex_score_mod(self, q, k, h: int, w: int, *, grad: bool = True):
        """Inference: eq. 9 computed in the kernel from each pair's pixel offset (flex.py), no
        gather. Training: the row/column logits gathered per query (the base class), because
        compiled Flex reduces a captured per-head scalar's gradient over every (query, key)
        pair with atomics on Nh addresses: 11-47x slower on an H100 (bench --suite cuda)."""
        if grad:
            return super().flex_score_mod(q, k, h, w)
        return gaussian_score_mod(hi(self.alpha), hi(self.centers), w)

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
        return -hi(self.alpha)[:, None, None] * diff.pow(2).sum(-1)

    def position_fold(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank-3 bilinear form of the logits: q_pos (Nh, T, 3) . k_pos (T, 3) equals
        -alpha ||k - q - Delta||^2 up to a per-query constant:
        2 alpha k.(q + Delta) - alpha ||k||^2 (centred coordinates), in ``dtype`` (default
        float32 at least)."""
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
    rotation, init I + N(0, 0.01^2) (the reference code's ``attention_spreads``, same product).
    As a relative encoding, r_delta = (d1^2, d2^2, d1 d2, d1, d2): Dp = 5. Checkpoints of the
    former ``precision_factor`` L (Sigma^-1 = L^T L) load as A = L^T."""

    name = "quadratic_generalized"

    def __init__(self, num_heads: int, *, init_centers_std: float = 2.0, hard: bool = False):
        super().__init__()
        if hard:
            raise ValueError("hard=True is only defined for positional='quadratic'")
        init_centers_std = finite_float("init_centers_std", init_centers_std)
        self.num_heads = num_heads
        self.centers = nn.Parameter(torch.randn(num_heads, 2) * init_centers_std)
        self.spread = nn.Parameter(
            torch.eye(2).repeat(num_heads, 1, 1) + 0.01 * torch.randn(num_heads, 2, 2)
        )
        self.register_load_state_dict_pre_hook(_factor_to_spread)

    @property
    def precision(self) -> torch.Tensor:
        """Sigma^-1 (Nh, 2, 2) = A A^T."""
        a = hi(self.spread)
        return a @ a.transpose(-1, -2)

    def dense_logits(self, h: int, w: int) -> torch.Tensor:
        ctr = hi(self.centers)
        p = pixel_coords(h, w, ctr.device, ctr.dtype)
        return gaussian_offset_logits(p, p, ctr, self.precision)[0]  # (Nh, T, T)

    def position_fold(self, h: int, w: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """q_pos (Nh, T, 5) . k_pos (T, 5) = k^T S (q + Delta) - 1/2 k^T S k (+ per-query const),
        in ``dtype`` (default float32 at least)."""
        ctr = hi(self.centers) if dtype is None else self.centers.to(dtype)
        p = pixel_coords(h, w, ctr.device, ctr.dtype)  # (T, 2)
        s = self.precision.to(ctr.dtype)  # (Nh, 2, 2)
        target = p[None] + ctr[:, None, :]  # (Nh, T, 2)
        lin = torch.einsum("hij,htj->hti", s, target)  # (Nh, T, 2)
        quad = torch.stack([-0.5 * s[:, 0, 0], -0.5 * s[:, 1, 1], -s[:, 0, 1]], -1)  # (Nh, 3)
        q_pos = torch.cat([lin, quad[:, None, :].expand(-1, h * w, 3)], dim=-1)  # (Nh, T, 5)
        k_pos = torch.cat([p, p.pow(2), p[:, :1] * p[:, 1:]], dim=-1)  # (T, 5)
        return q_pos, k_pos


def expand_fold(pos: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> tuple[list, list]:
    """A position fold q_pos (Nh, T, r), k_pos (T, r) as extra query/key columns of a batch of
    queries q (B, Nh, T, dk), in q's dtype."""
    q_pos, k_pos = pos
    b, nh = q.shape[:2]
    return [q_pos[None].to(q.dtype).expand(b, -1, -1, -1)], [
        k_pos[None, None].to(q.dtype).expand(b, nh, -1, -1)
    ]


def _alpha_to_spread(module, state_dict, prefix, *args) -> None:
    """Load checkpoints written before alpha was parametrized by s: spread = sqrt(2 alpha)."""
    old, new = prefix + "alpha", prefix + "spread"
    if old in state_dict and new not in state_dict:
        alpha = state_dict.pop(old)
        if bool((alpha < 0).any()):
            raise ValueError(
                f"{old}: a negative alpha {alpha.min().item():g} (from a checkpoint of the old "
                "direct parametrization) has no spread s with alpha = s^2 / 2"
            )
        state_dict[new] = torch.sqrt(2 * alpha)


def _factor_to_spread(module, state_dict, prefix, *args) -> None:
    """Generalized encoding checkpoints of the former L (Sigma^-1 = L^T L): spread A = L^T."""
    old, new = prefix + "precision_factor", prefix + "spread"
    if old in state_dict and new not in state_dict:
        state_dict[new] = state_dict.pop(old).transpose(-1, -2).contiguous()


def upgrade_state_dict(state_dict: dict) -> dict:
    """A copy of ``state_dict`` with every quadratic encoding's old ``alpha`` / ``precision_factor``
    entry replaced by its ``spread`` (for loaders that check names before ``load_state_dict``)."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith("positional_encoding.alpha")]:
        _alpha_to_spread(None, out, key[: -len("alpha")])
    for key in [k for k in state_dict if k.endswith("positional_encoding.precision_factor")]:
        _factor_to_spread(None, out, key[: -len("precision_factor")])
    return out
