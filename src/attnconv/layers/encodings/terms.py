"""The positional term of the attention logits, typed: what an encoding gives the layer
(``PositionalEncoding.term``) and what the kernels (kernels/) read,

    logits = scale q.k (when ``qk``) + the term                  (Cordonnier et al., eq. 1-9)

Each term knows its logits in the forms its kernels use. It holds the image size and its
``owner``, the encoding that made it: the parts that read the queries, or whose precision depends
on the kernel that runs them, are the owner's named methods, which the term's own methods call at
the kernel's request, inside the kernel's precision policy (precision.py). Every term answers
``dense(q, k, dtype)``: the plain equations' (B|1, Nh, T, T) bias, or None (the reference kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from ..precision import hi

Tensor = torch.Tensor


class Grid(NamedTuple):
    """The image the layer attends over: h x w pixels (T = h w, row-major), and its dtype (the
    layer's: what the kernels return and the dtype the positional logits are asked in)."""

    h: int
    w: int
    dtype: torch.dtype


@dataclass(frozen=True, kw_only=True)
class Term:
    """The positional logits of ``owner`` (a PositionalEncoding) on an h x w image."""

    large_logits: ClassVar[bool] = False  # logits that bfloat16 would round (precision.py)
    owner: Any  # the encoding: its methods named below give the logits
    h: int
    w: int
    qk: bool = True  # the layer's scale q.k is part of the logits
    reads_q: bool = False  # the term reads the queries/keys (attention depends on the input)

    def dense(self, q: Tensor | None, k: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        """The plain equations' (B|1, Nh, T, T) bias (``owner.dense_bias``), or None."""
        return self.owner.dense_bias(q, k, self.h, self.w, dtype)

    def fold(self, q: Tensor, k: Tensor) -> tuple[list, list]:
        """Extra query/key columns (B, Nh, T, r) whose products are the term's logits."""
        return [], []


@dataclass(frozen=True, kw_only=True)
class NoTerm(Term):
    """No positional logits: scale q.k only (none; absolute eq. 7, P is already in q and k)."""


@dataclass(frozen=True, kw_only=True)
class AxisTerm(Term):
    """R[q, k1] + C[q, k2]: each query's row logits against the key's row and column logits
    against its column (quadratic eq. 9, learned relative sec. 4.3). ``axes(dtype)``: the fixed
    row (Nh, h, h) and column (Nh, w, w) logits (``owner.axis_logits``), unless
    ``query_reads``: then the query reads its tables (``owner.read_axis``); ``gaussian``: the same
    logits from pixel offsets (quadratic)."""

    large_logits: ClassVar[bool] = True
    query_reads: bool = False
    gaussian: GaussianTerm | None = None

    def axes(self, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """The fixed row (Nh, h, h) and column (Nh, w, w) logits (not when ``query_reads``)."""
        return self.owner.axis_logits(self.h, self.w, dtype)

    def q_axis(self, q: Tensor) -> Tensor:
        """(B|1, Nh, T, h + w) row then column logits of every query, in q's dtype."""
        if self.query_reads:
            return self.owner.read_axis(q, self.h, self.w)
        return expand_fold(axis_fold(*self.axes(q.dtype)), q)[0][0]

    def fold(self, q: Tensor, k: Tensor) -> tuple[list, list]:
        """q_axis against one-hot key rows and columns: products with 0 and 1 are exact."""
        b, nh = q.shape[:2]
        onehot = axis_onehot(self.h, self.w, q.device, q.dtype)[None, None]
        return [self.q_axis(q)], [onehot.expand(b, nh, -1, -1)]


@dataclass(frozen=True, kw_only=True)
class ShiftTerm(Term):
    """The alpha -> infinity limit of eq. 9 (Lemma 2): head h reads pixel clamp(q + round(Delta_h))
    per axis, target rows (Nh, h) and columns (Nh, w)."""

    rows: Tensor
    cols: Tensor


@dataclass(frozen=True, kw_only=True)
class GaussianTerm(Term):
    """-1/2 (d - Delta)^T S (d - Delta), d = key - query pixel (eq. 9): centres Delta (Nh, 2) and
    the spread, s (Nh,) with S = s^2 I (alpha = s^2 / 2), or A (Nh, 2, 2) with S = A A^T."""

    large_logits: ClassVar[bool] = True
    centers: Tensor
    spread: Tensor

    def position_fold(self) -> tuple[Tensor, Tensor]:
        """Its rank-5 bilinear form: q_pos (Nh, T, 5), k_pos (T, 5)."""
        return self.owner.position_fold(self.h, self.w)

    def position_logits(self) -> Tensor:
        """The position-only logits (Nh, T, T), each query's maximum shifted to 0."""
        return self.owner.position_logits(self.h, self.w)

    def dense_logits(self) -> Tensor:
        """The logits (Nh, T, T), float32 at least."""
        return self.owner.dense_logits(self.h, self.w)

    @property
    def alpha(self) -> Tensor:
        return spread_alpha(self.spread)

    @property
    def precision(self) -> Tensor:
        return spread_precision(self.spread)

    def fold(self, q: Tensor, k: Tensor) -> tuple[list, list]:
        return expand_fold(self.position_fold(), q)


@dataclass(frozen=True, kw_only=True)
class FoldTerm(Term):
    """Extra query/key columns whose products are the logits (Dai et al. eq. 8):
    ``fold(q, k)`` -> ([q columns], [k columns]), each (B, Nh, T, r) (``owner.fold``)."""

    reads_q: bool = True

    def fold(self, q: Tensor, k: Tensor) -> tuple[list, list]:
        return self.owner.fold(q, k, self.h, self.w)


def spread_alpha(spread: Tensor) -> Tensor:
    """Isotropic eq. 9: alpha = s^2 / 2 (float32 at least), Sigma^-1 = s^2 I."""
    return 0.5 * hi(spread) ** 2


def isotropic_energy(alpha: Tensor, e1: Tensor, e2: Tensor) -> Tensor:
    """alpha ||e||^2 = alpha (e1^2 + e2^2), e = d - Delta per axis: the isotropic eq. 9 logit is
    its negative. Written once, elementwise, for the quadratic encoding's dense logits
    (gaussian.py) and the Flex kernel's in-kernel score_mod (flex.py): the same form, the same
    bits. The other forms of eq. 9 (shifted per-axis logits, the rank-3/5 position folds, the
    generalized expansion) stay apart on purpose: each is there for its precision or its kernel."""
    return alpha * (e1 * e1 + e2 * e2)


def spread_precision(spread: Tensor) -> Tensor:
    """Generalized eq. 9: Sigma^-1 (Nh, 2, 2) = A A^T, positive semi-definite."""
    a = hi(spread)
    return a @ a.transpose(-1, -2)


def axis_onehot(h: int, w: int, device=None, dtype=torch.float32) -> Tensor:
    """(h*w, h + w): one-hot row then one-hot column of every pixel in row-major order."""
    t = torch.arange(h * w, device=device)
    return torch.cat(
        [torch.nn.functional.one_hot(t // w, h), torch.nn.functional.one_hot(t % w, w)], -1
    ).to(dtype)


def axis_fold(row: Tensor, col: Tensor) -> tuple[Tensor, Tensor]:
    """Row logits (Nh, h, h) and column logits (Nh, w, w) -> q_pos (Nh, T, h + w), each query's
    row R[q1, :] and column C[q2, :], and k_pos (T, h + w) one-hot key rows and columns:
    q_pos . k_pos = R[q1, k1] + C[q2, k2] exactly."""
    nh, h, w = row.shape[0], row.shape[1], col.shape[1]
    t = h * w
    q_pos = torch.cat(
        [
            row[:, :, None, :].expand(nh, h, w, h).reshape(nh, t, h),
            col[:, None].expand(nh, h, w, w).reshape(nh, t, w),
        ],
        -1,
    )
    return q_pos, axis_onehot(h, w, row.device, row.dtype)


def expand_fold(pos: tuple[Tensor, Tensor], q: Tensor) -> tuple[list, list]:
    """A position fold q_pos (Nh, T, r), k_pos (T, r) as extra query/key columns of a batch of
    queries q (B, Nh, T, dk), in q's dtype."""
    q_pos, k_pos = pos
    b, nh = q.shape[:2]
    return [q_pos[None].to(q.dtype).expand(b, -1, -1, -1)], [
        k_pos[None, None].to(q.dtype).expand(b, nh, -1, -1)
    ]
