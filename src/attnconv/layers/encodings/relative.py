"""Relative positional encodings of an image attention layer, delta = key - query (row, col).

- ``RelativeEncoding``: Dai et al. (2019) eq. 8 as written in Cordonnier et al. (ICLR 2020):
      A_qk = X_q^T Wq^T Wk X_k            content-content   (the layer's q.k)
           + X_q^T Wq^T What_k r_delta     content-position
           + u^T Wk X_k                    global content bias
           + v^T What_k r_delta            global positional bias
  with r_delta = concat(r_row(delta1), r_col(delta2)) fixed (sinusoids) or learned, shared by
  the heads; What_k separate from Wk; each term switchable. All terms are scaled by 1/sqrt(Dk).
- ``LearnedRelativeEncoding``: Cordonnier sec. 4.3 (reference: Learned2DRelativeSelfAttention):
  position only, logits_h = w_row_h . r_row(delta1) + w_col_h . r_col(delta2) (no scaling);
  with content, the query reads the tables: (q.k + q[:Dk/2] . r_row(delta1)
  + q[Dk/2:] . r_col(delta2)) / sqrt(Dk) (the later upstream layer, ``query_positional_score``);
  or, ``head_keys=True``, the per-head keys still read them: q.k / sqrt(Dk) + w_row_h . r_row
  + w_col_h . r_col, unscaled (``use_attention_data`` at the paper-run commit 9ffaa30).

Each module gives the same logits three ways: ``dense_bias`` (the plain (B|1, Nh, T, T) tensor
of the equations, for backend="reference"), ``fold`` (extra query/key columns so that
q_aug . k_aug = the positional logits: the query's scores against each key row and column
(B, Nh, T, H + W), relative-to-absolute gathered, meet one-hot key rows/columns), and, when only
input-independent terms are on, ``axis_logits`` (row (Nh, H, H) and column (Nh, W, W) logits of
a separable attention).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import PositionalEncoding, check_size, relative_index
from .sinusoidal import sinusoid_1d
from .terms import AxisTerm, FoldTerm, Term, axis_fold, expand_fold

RELATIVE_TERMS = ("content_content", "content_position", "global_content", "global_position")


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


def rel_gather(full: torch.Tensor, n: int, pos: torch.Tensor) -> torch.Tensor:
    """Relative-to-absolute: full (..., T, 2n-1) scores per offset -> (..., T, n) per key index,
    [t, k] = full[t, k - pos[t] + n - 1]."""
    idx = torch.arange(n, device=full.device)[None, :] - pos[:, None] + n - 1  # (T, n)
    return full.gather(-1, idx.expand(*full.shape[:-1], n))


def _pair_index(h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, T) table rows of delta1 and delta2 for every (query, key) pair."""
    t = torch.arange(h * w, device=device)
    rows, cols = t // w, t % w
    return rows[None, :] - rows[:, None] + h - 1, cols[None, :] - cols[:, None] + w - 1


def fold_axis_scores(
    row_full, col_full, h: int, w: int, batch: int, scale: float, keys: bool = True
):
    """Scores per key offset (B|1, Nh, T, 2h-1) and (B|1, Nh, T, 2w-1) -> query columns
    (B, Nh, T, h + w) and the matching one-hot key columns (None unless ``keys``)."""
    t, nh, dev, dt = h * w, row_full.shape[1], row_full.device, row_full.dtype
    rows = torch.arange(t, device=dev) // w
    cols = torch.arange(t, device=dev) % w
    row_full, col_full = row_full.expand(batch, nh, t, -1), col_full.expand(batch, nh, t, -1)
    q_cols = torch.cat([rel_gather(row_full, h, rows), rel_gather(col_full, w, cols)], -1) * scale
    if not keys:
        return q_cols, None
    onehot = torch.cat([F.one_hot(rows, h), F.one_hot(cols, w)], -1).to(dt)  # (T, h + w)
    return q_cols, onehot.expand(batch, nh, t, h + w)


class RelativeEncoding(PositionalEncoding):
    """Dai et al. eq. 8 (see module docstring). ``key_pos_proj`` = What_k, ``content_bias`` = u,
    ``position_bias`` = v; r_delta width ``rel_dim`` (half rows, half columns).

    Args:
        num_heads: Nh.
        qk_dim: Dk, the query/key width per head (What_k projects r_delta to it).
        rel_dim: Dp, the width of r_delta (half rows, half columns).
        terms: the eq. 8 terms that are on, a subset of ``RELATIVE_TERMS``.
        learned: learned r_row / r_col tables (else fixed sinusoids of the offset).
        max_size: side of the learned tables (images up to max_size x max_size).
    """

    name = "relative"

    def __init__(
        self,
        num_heads: int,
        qk_dim: int,
        rel_dim: int,
        terms: tuple[str, ...],
        *,
        learned: bool = False,
        max_size: int = 64,
    ):
        super().__init__()
        bad = [t for t in terms if t not in RELATIVE_TERMS]
        if bad or not terms:
            raise ValueError(f"terms must be a non-empty subset of {RELATIVE_TERMS}, got {terms}")
        self.num_heads, self.qk_dim, self.terms = num_heads, qk_dim, tuple(terms)
        self.reads_q = bool(set(self.terms) & {"content_position", "global_content"})
        self.learned_size = max_size if learned else None
        self.scale = qk_dim**-0.5
        self.tables = RelativeTables2d(
            rel_dim // 2, rel_dim - rel_dim // 2, learned=learned, max_size=max_size
        )
        self.key_pos_proj = nn.Linear(rel_dim, num_heads * qk_dim, bias=False)  # What_k
        self.content_bias = nn.Parameter(torch.randn(num_heads, qk_dim) * 0.02)  # u
        self.position_bias = nn.Parameter(torch.randn(num_heads, qk_dim) * 0.02)  # v

    @property
    def learned(self) -> bool:
        return self.tables.learned

    def check(self, content: bool) -> None:
        if "content_content" in self.terms and not content:
            raise ValueError(
                "the relative encoding's terms include 'content_content' (q.k), the layer has "
                "content=False: drop the term or build the layer with content=True"
            )

    def check_widths(self, *, in_channels: int, qk_dim: int) -> None:
        if self.qk_dim != qk_dim:
            raise ValueError(f"the relative encoding has qk_dim {self.qk_dim}, the layer {qk_dim}")

    def term(self, h: int, w: int, *, content: bool) -> Term:
        """Only the global positional bias, position only: separable row + column logits;
        otherwise extra query/key columns (``fold``)."""
        qk = "content_content" in self.terms
        if not (self.reads_q or content):
            return AxisTerm(owner=self, h=h, w=w, qk=qk)
        return FoldTerm(owner=self, h=h, w=w, qk=qk)

    def head_tables(self, h: int, w: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What_k r_row (2h-1, Nh, dk) and What_k r_col (2w-1, Nh, dk)."""
        r_row, r_col = self.tables(h, w)
        wk = self.key_pos_proj.weight.to(dtype)  # (Nh*dk, Dp)
        dr = r_row.shape[1]
        kr = (r_row.to(dtype) @ wk[:, :dr].t()).view(-1, self.num_heads, self.qk_dim)
        kc = (r_col.to(dtype) @ wk[:, dr:].t()).view(-1, self.num_heads, self.qk_dim)
        return kr, kc

    def axis_logits(self, h: int, w: int, dtype=None):
        """Only the global positional bias: v^T What_k r_delta, separable."""
        dtype = dtype or self.position_bias.dtype
        kr, kc = self.head_tables(h, w, dtype)
        v = self.position_bias.to(dtype)
        gr = torch.einsum("hd,rhd->hr", v, kr) * self.scale
        gc = torch.einsum("hd,rhd->hr", v, kc) * self.scale
        return gr[:, relative_index(h, gr.device)], gc[:, relative_index(w, gc.device)]

    def dense_bias(self, q, k, h: int, w: int, dtype) -> torch.Tensor:
        """The plain equations: (B|1, Nh, T, T) of the positional and global terms, scaled."""
        t, dev = h * w, self.position_bias.device
        d1, d2 = _pair_index(h, w, dev)
        r_row, r_col = self.tables(h, w)
        r = torch.cat([r_row[d1], r_col[d2]], dim=-1).to(dtype)  # (T, T, Dp) r_delta
        rk = self.key_pos_proj(r).view(t, t, self.num_heads, self.qk_dim)  # What_k r_delta
        bias = torch.zeros(1, self.num_heads, t, t, dtype=dtype, device=dev)
        if "content_position" in self.terms:
            bias = bias + torch.einsum("bhqd,qkhd->bhqk", q, rk)
        if "global_content" in self.terms:
            bias = bias + torch.einsum("hd,bhkd->bhk", self.content_bias, k)[:, :, None, :]
        if "global_position" in self.terms:
            bias = bias + torch.einsum("hd,qkhd->hqk", self.position_bias, rk)[None]
        return bias * self.scale

    def fold(self, q, k, h: int, w: int) -> tuple[list, list]:
        """Extra (query, key) columns whose dot product is dense_bias (per query row)."""
        b, nh, t, _ = q.shape
        kr, kc = self.head_tables(h, w, q.dtype)
        row_full = col_full = None  # scores per offset (B|1, Nh, T, 2h-1), (B|1, Nh, T, 2w-1)
        if "content_position" in self.terms:
            row_full = torch.einsum("bhtd,rhd->bhtr", q, kr)
            col_full = torch.einsum("bhtd,rhd->bhtr", q, kc)
        if "global_position" in self.terms:
            gr = torch.einsum("hd,rhd->hr", self.position_bias, kr)[None, :, None, :]
            gc = torch.einsum("hd,rhd->hr", self.position_bias, kc)[None, :, None, :]
            row_full = gr if row_full is None else row_full + gr
            col_full = gc if col_full is None else col_full + gc
        qs, ks = [], []
        if row_full is not None:
            qc, kc1 = fold_axis_scores(row_full, col_full, h, w, b, self.scale)
            qs, ks = [qc], [kc1]
        if "global_content" in self.terms:  # u^T Wk X_k: a key-only logit
            qs.append(torch.full((b, nh, t, 1), self.scale, dtype=q.dtype, device=q.device))
            ks.append(torch.einsum("hd,bhkd->bhk", self.content_bias, k)[..., None])
        return qs, ks


class LearnedRelativeEncoding(PositionalEncoding):
    """Cordonnier sec. 4.3 (see module docstring): learned row and column tables of offsets,
    read by per-head keys (``head_keys``, default without content) or by the query (default
    with content). Per-head keys give input-independent, separable row + column logits, added
    unscaled to the layer's q.k / sqrt(Dk) when it has content.

    Args:
        num_heads: Nh.
        qk_dim: Dk; the query reads the tables with its two halves.
        rel_dim: width of each of the row and column tables read by per-head keys; the query
            reads tables of its own halves (``qk_dim // 2`` and the rest), so then ``rel_dim``
            must be ``qk_dim``.
        content: whether the layer has the content term (sets the default of ``head_keys``).
        head_keys: per-head keys read the tables (default: without content only).
        max_size: side of the learned tables (images up to max_size x max_size).
    """

    name = "relative_learned"

    def __init__(
        self,
        num_heads: int,
        qk_dim: int,
        rel_dim: int,
        *,
        content: bool,
        head_keys: bool | None = None,
        max_size: int = 64,
    ):
        super().__init__()
        head_keys = not content if head_keys is None else bool(head_keys)
        if not (content or head_keys):
            raise ValueError(
                "relative_learned without content reads its tables by head keys "
                "(head_keys=False needs content=True)"
            )
        self.num_heads, self.content, self.scale = num_heads, content, qk_dim**-0.5
        self.query_reads = self.reads_q = not head_keys  # the query reads the tables (q . r)
        self.learned_size = max_size
        if self.query_reads:  # half the query's channels read the rows, half the columns
            if rel_dim != qk_dim:  # the tables are the query's halves: a rel_dim is not read
                raise ValueError(
                    f"relative_learned read by the query: its tables are the query's halves "
                    f"(qk_dim={qk_dim}), got rel_dim={rel_dim} (per-head keys take one: "
                    "head_keys=True)"
                )
            dr, dc = qk_dim // 2, qk_dim - qk_dim // 2
        else:  # per-head keys read them
            dr = dc = rel_dim
            self.head_keys_row = nn.Linear(dr, num_heads, bias=False)
            self.head_keys_col = nn.Linear(dc, num_heads, bias=False)
        self.tables = RelativeTables2d(dr, dc, learned=True, max_size=max_size)

    def check(self, content: bool) -> None:
        if self.query_reads and not content:
            raise ValueError(
                "relative_learned read by the query (head_keys=False) needs content=True"
            )

    def check_widths(self, *, in_channels: int, qk_dim: int) -> None:
        width = self.tables.rel_row.shape[-1] + self.tables.rel_col.shape[-1]
        if self.query_reads and width != qk_dim:
            raise ValueError(
                f"the learned relative tables are {width} wide, the layer's queries {qk_dim} "
                "(the query reads them)"
            )

    def term(self, h: int, w: int, *, content: bool) -> AxisTerm:
        """Each query's row and column logits: read by the query (``fold``), or the per-head
        keys' fixed ones. An AxisTerm's attention runs in float32 under autocast (precision.py):
        the fused bfloat16 backward forms dS = P (dP - D) with D = rowsum(dO * O) from the
        bfloat16-rounded output O, an error shared by every key of a query that adds up
        coherently in dq, dk (dense: softmax's backward in float32), past the dense path's
        gradient error (tests/test_precision.py; docs/benchmarks.md, "Figures behind the code's
        comments")."""
        if self.query_reads:
            return AxisTerm(owner=self, h=h, w=w, query_reads=True, reads_q=True)
        return AxisTerm(owner=self, h=h, w=w)

    def axis_logits(self, h: int, w: int, dtype=None):
        r_row, r_col = self.tables(h, w)
        dtype = dtype or r_row.dtype
        wr, wc = self.head_keys_row.weight.to(dtype), self.head_keys_col.weight.to(dtype)
        gr, gc = (r_row.to(dtype) @ wr.t()).t(), (r_col.to(dtype) @ wc.t()).t()  # (Nh, 2h-1), ..
        return gr[:, relative_index(h, gr.device)], gc[:, relative_index(w, gc.device)]

    def dense_bias(self, q, k, h: int, w: int, dtype) -> torch.Tensor:
        d1, d2 = _pair_index(h, w, self.tables.rel_row.device)
        r_row, r_col = self.tables(h, w)
        e_row, e_col = r_row[d1].to(dtype), r_col[d2].to(dtype)  # (T, T, dr), (T, T, dc)
        if not self.query_reads:  # w_h . r, unscaled, shared by the batch
            bias = torch.einsum("qkd,hd->hqk", e_row, self.head_keys_row.weight)
            return (bias + torch.einsum("qkd,hd->hqk", e_col, self.head_keys_col.weight))[None]
        dr = e_row.shape[-1]
        bias = torch.einsum("bhqd,qkd->bhqk", q[..., :dr], e_row)
        return (bias + torch.einsum("bhqd,qkd->bhqk", q[..., dr:], e_col)) * self.scale

    def fold(self, q, k, h: int, w: int) -> tuple[list, list]:
        if not self.query_reads:  # head keys: each query's row logits and column logits
            row, col = self.axis_logits(h, w, q.dtype)  # (Nh, h, h), (Nh, w, w)
            return expand_fold(axis_fold(row, col), q)
        qc, kc = self.read_axis(q, h, w, keys=True)
        return [qc], [kc]

    def read_axis(self, q, h: int, w: int, keys: bool = False):
        """The query reads the tables: q_axis (B, Nh, T, h + w) (and, ``keys``, the one-hot key
        columns it meets)."""
        r_row, r_col = self.tables(h, w)
        dr = r_row.shape[1]
        row_full = q[..., :dr] @ r_row.to(q.dtype).t()  # (B, Nh, T, 2h-1)
        col_full = q[..., dr:] @ r_col.to(q.dtype).t()  # (B, Nh, T, 2w-1)
        out = fold_axis_scores(row_full, col_full, h, w, q.shape[0], self.scale, keys)
        return out if keys else out[0]
