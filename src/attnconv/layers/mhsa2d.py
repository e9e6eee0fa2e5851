"""Multi-head self-attention over the pixels of an image, with every positional encoding of
Cordonnier, Loukas, Jaggi, "On the Relationship between Self-Attention and Convolutional
Layers" (ICLR 2020), eq. 1-9.

    MHSA(X) = concat_h[ softmax(A^(h)) X Wval^(h) ] Wout + bout          (eq. 1-2)

with A^(h) the content term X Wq Wk^T X^T / sqrt(Dk) (``content=True``) plus the positional
term of ``positional`` (see positional.py). Two implementations of the same equations:

- ``impl="reference"``: dense (B, Nh, T, T) logits for every batch element, softmax, matmul.
- ``impl="auto"``: position-only attention is computed once per forward and shared across the
  batch; the separable encodings (quadratic, learned relative row + column) run as a row then
  a column operator (quadratic.py), never T x T; with content, every positional term is folded
  into augmented query/key vectors and the fused ``scaled_dot_product_attention`` runs with no
  bias tensor. Quadratic and learned relative: each query's row and column logits (exact, the
  dense bias's own values) against one-hot key rows/columns; generalized quadratic: a rank-5
  bilinear form of the pixel coordinates. On CUDA the row/column encodings run through
  FlexAttention instead (flex.py), their logits added by a score_mod; on CPU through the
  query-blocked exact kernel (blocked.py: dk-wide logits plus the row/column logits broadcast
  per block, recomputed in backward), or in inference the fused kernel with one shared bias.
  The content kernels and the choice between them live in content_kernels.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import check_tensor, positive_int
from .content_kernels import ContentKernels
from .encoding import POSITIONALS, build_encoding
from .functional import (
    attention_probs,
    check_impl,
    dropped_links,
    scaled_dot_product_attention,
    shared_dropout,
)
from .positional import PositionalEncoding, check_size
from .quadratic import (
    axis_softmax,
    head_major,
    head_major_output,
    outer_probs,
    separable_attention,
    separable_probs,
    shift_gather,
)
from .scripting import NotScriptable
from .shared_position import head_sum_linear, position_attention

__all__ = ["DROPOUT_MASKS", "MultiHeadSelfAttention2d", "POSITIONALS", "VALUES"]
VALUES = ("linear", "identity")
DROPOUT_MASKS = ("sample", "batch")


def _head_dims(cin: int, cout: int, nh: int, head_dim, qk_dim, value: str) -> tuple[int, int]:
    """(value width, query/key width) per head from the layer's arguments."""
    if value == "identity":  # each head attends over the raw input
        if head_dim not in (None, cin):
            raise ValueError(
                f"value='identity' attends over the raw input: head_dim is in_channels={cin}, "
                f"got head_dim={head_dim}"
            )
        head_dim = cin
    elif head_dim is None:
        if cout % nh:
            raise ValueError(
                f"out_channels={cout} is not divisible by num_heads={nh}; pass head_dim explicitly"
            )
        head_dim = cout // nh
    qk_dim = head_dim if qk_dim is None else qk_dim
    return positive_int("head_dim", head_dim), positive_int("qk_dim", qk_dim)


class MultiHeadSelfAttention2d(NotScriptable, ContentKernels, nn.Module):
    """Multi-head self-attention on NCHW images: (B, in_channels, H, W) -> (B, out_channels, H, W).

    Args: in_channels, out_channels, num_heads; positional (a ``PositionalEncoding``, or its
    string shorthand, one of POSITIONALS); content (add the content-content term); head_dim (value
    width per head, default out_channels // num_heads; = in_channels when ``value="identity"``);
    qk_dim (query/key width per head, default head_dim); value ("linear": Linear(in, Nh*head_dim)
    values; "identity": each head attends over the raw input, the reference code's layout);
    dropout (on attention probabilities); dropout_mask ("sample": a mask per image; "batch": one
    (Nh, T, T) mask shared by the batch, the reference code's Gaussian layer, position-only
    attention only); impl ("auto" | "reference"); max_size (side of learned
    tables); bias (of the projections). ``encoding_options`` go to the named encoding
    (encoding.build_encoding): hard, init_centers_std, init_alpha (quadratic); relative_terms,
    learned_r (relative, Dai eq. 8); rel_dim (r_delta width, relative encodings); head_keys
    (relative_learned: per-head keys read the tables, with content too; relative.py).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_heads: int,
        *,
        positional: str | PositionalEncoding = "none",
        content: bool = True,
        head_dim: int | None = None,
        qk_dim: int | None = None,
        value: str = "linear",
        dropout: float = 0.0,
        dropout_mask: str = "sample",
        impl: str = "auto",
        max_size: int = 64,
        bias: bool = True,
        **encoding_options,
    ):
        super().__init__()
        for name, val in (("in_channels", in_channels), ("out_channels", out_channels),
                          ("num_heads", num_heads), ("max_size", max_size)):  # fmt: skip
            positive_int(name, val)
        if value not in VALUES:
            raise ValueError(f"value must be one of {VALUES}, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if dropout_mask not in DROPOUT_MASKS:
            raise ValueError(f"dropout_mask must be one of {DROPOUT_MASKS}, got {dropout_mask!r}")
        head_dim, qk_dim = _head_dims(in_channels, out_channels, num_heads, head_dim, qk_dim, value)
        self.in_channels, self.out_channels, self.num_heads = in_channels, out_channels, num_heads
        self.head_dim, self.qk_dim, self.value = head_dim, qk_dim, value
        self.content, self.dropout, self.max_size = bool(content), dropout, max_size
        self.impl, self.scale = check_impl(impl), qk_dim**-0.5
        self.flex_backend: bool | None = None  # None: FlexAttention on CUDA (see _use_flex)
        self.blocked_backend: bool | None = None  # None: the blocked kernel on CPU (_use_blocked)
        self.positional_encoding = build_encoding(
            positional, num_heads=num_heads, in_channels=in_channels, qk_dim=qk_dim,
            content=self.content, max_size=max_size, **encoding_options,
        )  # fmt: skip
        enc = self.positional_encoding
        self.positional = enc.name
        self.input_dependent = self.content or enc.input_dependent  # logits read q/k
        self.separable = enc.separable and not self.input_dependent  # row then column operator
        if dropout_mask == "batch" and self.input_dependent:
            raise ValueError("dropout_mask='batch' needs position-only attention (content=False)")
        self.dropout_mask = dropout_mask
        self.has_qk = self.input_dependent or enc.adds_to_input
        if self.has_qk:
            self.query_proj = nn.Linear(in_channels, num_heads * qk_dim, bias=bias)
            self.key_proj = nn.Linear(in_channels, num_heads * qk_dim, bias=bias)
        if value == "linear":
            self.value_proj = nn.Linear(in_channels, num_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * head_dim, out_channels, bias=bias)

    # ------------------------------------------------------------------ helpers
    def attention_centers(self) -> torch.Tensor:
        """(Nh, 2) (row, col) offsets Delta in pixels of the quadratic encoding's heads."""
        if not hasattr(self.positional_encoding, "centers"):
            raise ValueError(
                f"attention_centers() needs a quadratic encoding, not {self.positional!r}"
            )
        return self.positional_encoding.centers.detach().clone()

    def _check_input(self, x: torch.Tensor) -> tuple[int, int, int]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point input, got dtype {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"expected a 4-D NCHW input (B, C, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected {self.in_channels} input channels, got {x.shape[1]} (shape "
                f"{tuple(x.shape)})"
            )
        check_tensor(x, self.out_proj.weight.dtype)  # non-empty, the parameters' dtype
        enc = self.positional_encoding
        if self.content and enc.hard:
            raise ValueError("hard=True (one-hot attention) needs content=False")
        b, _, h, w = x.shape
        if enc.learned_size is not None:
            check_size(h, w, enc.learned_size, "positional")
        return b, h, w

    def _heads(self, t: torch.Tensor, d: int) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], self.num_heads, d).transpose(1, 2)  # (B, nh, T, d)

    def _qk(self, xt: torch.Tensor, h: int, w: int):
        """q, k (B or 1, Nh, T, dk) from X (+ P for absolute encodings), or None."""
        if not self.has_qk:
            return None, None
        src = xt
        if self.positional_encoding.adds_to_input:
            p = self.positional_encoding(h, w).to(self.out_proj.weight.dtype)  # (T, Cin), eq. 7
            src = xt + p if self.content else p[None]
        q, k = self.query_proj(src), self.key_proj(src)  # (B|1, T, Nh*dk)
        return self._heads(q, self.qk_dim), self._heads(k, self.qk_dim)

    def _axis_logits(self, h: int, w: int, dtype):
        """Row (Nh, h, h) and column (Nh, w, w) logits of a separable position-only attention."""
        return self.positional_encoding.axis_logits(h, w, dtype)

    def _dense(self, xt: torch.Tensor | None, h: int, w: int):
        """The plain equations: q, k, bias; logits = q k^T * scale + bias, bias (B|1, Nh, T, T)."""
        t, nh, enc = h * w, self.num_heads, self.positional_encoding
        dt, dev = self.out_proj.weight.dtype, self.out_proj.weight.device
        q, k = self._qk(xt, h, w)
        bias = enc.dense_bias(q, k, h, w, dt)
        if not (self.has_qk and enc.uses_qk_product):  # no q.k term in the logits
            b = q.shape[0] if q is not None else (bias.shape[0] if bias is not None else 1)
            q = k = torch.zeros(b, nh, t, 0, dtype=dt, device=dev)
        return q, k, bias

    def _values(self, xt: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """(B, H, W, Nh or 1, Dv)."""
        b = xt.shape[0]
        if self.value == "identity":
            return xt.view(b, h, w, 1, self.in_channels)
        return self.value_proj(xt).view(b, h, w, self.num_heads, self.head_dim)

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax probabilities (B or 1, Nh, H*W, H*W), rows = queries in row-major order."""
        b, h, w = self._check_input(x)
        q, k, bias = self._dense(x.flatten(2).transpose(1, 2), h, w)
        return attention_probs(q, k, bias=bias, scale=self.scale)

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, return_attention: bool = False):
        b, h, w = self._check_input(x)
        p_drop = self.dropout if self.training else 0.0
        if self.impl == "auto" and self.separable and p_drop == 0.0:
            y = self._forward_separable(x, h, w)  # (B, Cout, H, W)
        else:
            xt = x.flatten(2).transpose(1, 2)  # (B, T, Cin)
            v5 = self._values(xt, h, w)  # (B, H, W, Nh|1, Dv)
            if self.impl == "reference":
                y = self._forward_reference(xt, v5, h, w, p_drop)
            elif not self.input_dependent:
                y = self._forward_shared(v5, h, w, p_drop)
            else:
                y = self._forward_folded(xt, v5, h, w, p_drop)
            y = self.out_proj(y.reshape(b, h * w, self.num_heads * self.head_dim))  # (B, T, Cout)
            y = y.transpose(1, 2).reshape(b, self.out_channels, h, w)
        if return_attention:
            return y, self._path_probs(x, h, w)
        return y

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on sequence-first channels-last tokens: (H, W, B, Cin) -> (H, W, B, Cout),
        the paper models' layout. Separable position-only attention runs there with no layout
        copy, attention dropout included (shared_position.py); every other case is ``forward``
        on the NCHW view."""
        enc = self.positional_encoding
        if not (self.impl == "auto" and self.separable and not enc.hard):
            return self.forward(x.permute(2, 3, 0, 1)).permute(2, 3, 0, 1)
        b, h, w = self._check_input(x.permute(2, 3, 0, 1))
        nh, dv, p = self.num_heads, self.head_dim, self.dropout if self.training else 0.0
        if self.value == "identity":
            v = x[None]  # (1, H, W, B, C): every head reads the raw input
        else:
            v = F.linear(x, self.value_proj.weight, self.value_proj.bias)  # (H, W, B, Nh*Dv)
            v = v.view(h, w, b, nh, dv).permute(3, 0, 1, 2, 4)
        row, col = self._axis_logits(h, w, x.dtype)
        r, c = axis_softmax(row.to(x.device)), axis_softmax(col.to(x.device))
        mask_batch = None if self.dropout_mask == "batch" else b
        drop = dropped_links(nh, h * w, mask_batch, p, x.device) if p > 0 else None
        y = position_attention(r, c, v, drop)  # (Nh, H, W, B, Dv), eq. 9 factorized, unscaled
        wo = self.out_proj.weight if drop is None else self.out_proj.weight / (1.0 - p)
        y = head_sum_linear(y.view(nh, h * w * b, dv), wo, self.out_proj.bias)
        return y.view(h, w, b, self.out_channels)

    def _path_probs(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """The probabilities (B or 1, Nh, T, T) of the path ``forward`` ran, computed from that
        path's own factors (separable R (x) C, hard one-hot shifts, the folded q/k), before
        dropout; the reference path's dense equations for impl="reference"."""
        if self.impl == "reference":
            return self.attention_probs(x)
        enc = self.positional_encoding
        if self.separable:
            if enc.hard:
                rows, cols = enc.hard_indices(h, w)  # (Nh, h), (Nh, w)
                r, c = F.one_hot(rows, h), F.one_hot(cols, w)  # (Nh, h, h), (Nh, w, w)
                return outer_probs(r.to(x.dtype), c.to(x.dtype))[None]
            row, col = self._axis_logits(h, w, x.dtype)
            return separable_probs(row.to(x.device), col.to(x.device))[None]
        xt = x.flatten(2).transpose(1, 2)  # (B, T, Cin)
        if not self.input_dependent:
            if enc.position_foldable and not enc.separable:  # the low-rank fold it runs
                return axis_softmax(enc.position_logits(h, w))[None].to(x.dtype)
            return self.attention_probs(x)  # the shared path's own dense probabilities
        if enc.position_foldable and not enc.separable:  # generalized: from the offsets
            q, k = self._qk(xt, h, w)
            lg = q @ k.transpose(-2, -1) * self.scale + enc.dense_logits(h, w).to(q.dtype)
            return axis_softmax(lg)
        q_aug, k_aug, _ = self.folded_qkv(xt, self._values(xt, h, w), h, w)
        return axis_softmax(q_aug @ k_aug.transpose(-2, -1))  # scale folded into q_aug

    def _seq_values(self, v5: torch.Tensor) -> torch.Tensor:
        """(B, H, W, Nh|1, Dv) -> (B, Nh, T, Dv)."""
        b, h, w, _, d = v5.shape
        return v5.reshape(b, h * w, -1, d).transpose(1, 2).expand(b, self.num_heads, h * w, d)

    def _forward_reference(self, xt, v5, h, w, p_drop) -> torch.Tensor:
        """Dense logits for every batch element, exactly the equations. -> (B, T, Nh, Dv)"""
        b = xt.shape[0]
        q, k, bias = self._dense(xt, h, w)
        q, k = q.expand(b, *q.shape[1:]), k.expand(b, *k.shape[1:])
        if bias is not None:
            bias = bias.expand(b, *bias.shape[1:])
        if p_drop > 0:  # the links of functional.dropped_links, as the tokens path draws them
            probs = attention_probs(q, k, bias=bias, scale=self.scale)
            probs = shared_dropout(probs, p_drop, per_image=self.dropout_mask == "sample")
            return (probs.to(v5.dtype) @ self._seq_values(v5)).transpose(1, 2)
        y = scaled_dot_product_attention(
            q, k, self._seq_values(v5), bias=bias, scale=self.scale, impl="reference"
        )  # (B, Nh, T, Dv)
        return y.transpose(1, 2)

    def _forward_separable(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Separable position-only attention in the head-major layout (Nh, D, H, B, W): a row
        then a column operator (or, hard, a shift), never T x T. -> (B, Cout, H, W)"""
        wv, bv = (
            (self.value_proj.weight, self.value_proj.bias)
            if self.value == "linear"
            else (None,) * 2
        )
        v = head_major(x, wv, bv, self.num_heads)  # (Nh|1, D, H, B, W)
        enc = self.positional_encoding
        if enc.hard:  # the alpha -> infinity limit, a gather
            y = shift_gather(v, *enc.hard_indices(h, w))
        else:
            row, col = self._axis_logits(h, w, x.dtype)
            y = separable_attention(v, row.to(x.device), col.to(x.device))
        return head_major_output(y, self.out_proj.weight, self.out_proj.bias)

    def _forward_shared(self, v5, h, w, p_drop) -> torch.Tensor:
        """Input-independent attention: computed once, shared by the batch. -> (B, T, Nh, Dv)"""
        b, dt = v5.shape[0], v5.dtype
        enc = self.positional_encoding
        if enc.position_foldable and not enc.separable:  # generalized: the rank-5 fold
            probs = axis_softmax(enc.position_logits(h, w))[None].to(dt)  # (1, Nh, T, T)
        else:
            q, k, bias = self._dense(None, h, w)
            probs = attention_probs(q, k, bias=bias, scale=self.scale).to(dt)  # (1, Nh, T, T)
        vs = v5.reshape(b, h * w, v5.shape[3], v5.shape[4])  # (B, T, Nh|1, Dv)
        if p_drop > 0 and self.dropout_mask == "batch":  # one mask: still shared by the batch
            probs = shared_dropout(probs, p_drop)
        elif p_drop > 0:  # a mask per image: expand the shared probabilities
            p = F.dropout(probs.expand(b, -1, -1, -1), p_drop)
            return torch.einsum("bhqk,bkhd->bqhd", p, vs.expand(b, h * w, self.num_heads, -1))
        if vs.shape[2] == 1:
            return torch.einsum("hqk,bkd->bqhd", probs[0], vs[:, :, 0])
        return torch.einsum("hqk,bkhd->bqhd", probs[0], vs)  # (B, T, Nh, Dv)
