"""Multi-head attention over sequences and the 1D sinusoidal positional encoding.

Vaswani et al., "Attention Is All You Need" (2017): eq. 1 (scaled dot-product attention),
sec. 3.2.2 (multi-head attention, MultiHead(Q, K, V) = Concat(head_1..head_h) W^O) and
sec. 3.5 (PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))).

Sequences are (B, T, C). The attention math itself is ``attnconv.layers.functional``, whose
SEQUENCE_TABLE picks the kernel (``backend`` overrides it).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .checks import BackendKnob, check_tensor, finite_float, positive_int
from .encodings.sinusoidal import sinusoid_1d, sinusoid_rotation_1d
from .functional import SEQUENCE_BACKENDS, scaled_dot_product_attention, sequence_kernel
from .scripting import NotScriptable

__all__ = ["MultiHeadAttention", "SinusoidalPositionalEncoding", "sinusoidal_encoding"]


class MultiHeadAttention(NotScriptable, BackendKnob, nn.Module):
    """Multi-head (self- or cross-) attention over (B, T, C) sequences (Vaswani sec. 3.2.2).

    Args:
        embed_dim: model width d_model (query width and output width).
        num_heads: number of heads h; each has d_k = d_v = embed_dim / h.
        kdim: width of the key input (default embed_dim), for cross-attention.
        vdim: width of the value input (default kdim).
        dropout: dropout on the attention probabilities (training only).
        bias: biases of the q, k, v projections (and of W^O unless ``out_bias`` says).
        out_bias: bias of the output projection W^O (None: as ``bias``; timm's ViT keeps it
            with qkv_bias=False).
        backend: None (the choice of functional.SEQUENCE_TABLE: PyTorch's fused kernel where
            it runs), ``"reference"`` (plain softmax(q k^T / sqrt(d_k)) v) or ``"sdpa"``.

    ``forward(query, key=None, value=None, *, key_padding_mask=None, causal=False,
    return_attention=False)``: key defaults to query (self-attention), value to key.
    ``key_padding_mask`` (B, Tk) bool, True marks a padding key that is ignored (the
    ``torch.nn.MultiheadAttention`` convention). ``causal``: query i attends keys j <= i + Tk - Tq
    (aligned to the end, as a decoder's last Tq queries over Tk keys; with Tq > Tk the first
    Tq - Tk queries attend nothing: zero rows).
    Returns y (B, Tq, embed_dim), or (y, attn) with attn (B, h, Tq, Tk) softmax probabilities.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        out_bias: bool | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        positive_int("embed_dim", embed_dim)
        positive_int("num_heads", num_heads)
        for name, val in (("kdim", kdim), ("vdim", vdim)):
            if val is not None:
                positive_int(name, val)
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = self.kdim if vdim is None else vdim
        self.dropout = dropout
        self.backend = backend  # None: the table's choice
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)  # W^Q of all heads
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)  # W^K
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)  # W^V
        out_bias = bias if out_bias is None else out_bias
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_bias)  # W^O

    BACKENDS = SEQUENCE_BACKENDS  # the ``backend`` names it takes (functional.py)

    def kernel(self, return_attention: bool = False, why: bool = False) -> str:
        """The kernel (functional.SEQUENCE_TABLE) ``forward`` runs (``why``: each row passed
        over, then the one chosen)."""
        return sequence_kernel(self.backend, return_attention, self.head_dim, why)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        key_padding_mask: torch.Tensor | None = None,
        causal: bool = False,
        return_attention: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        key = query if key is None else key
        value = key if value is None else value
        self._check(query, key, value, key_padding_mask)
        B, Tq, C = query.shape
        q = self._heads(self.q_proj(query))  # (B, nh, Tq, hs)
        k = self._heads(self.k_proj(key))  # (B, nh, Tk, hs)
        v = self._heads(self.v_proj(value))  # (B, nh, Tk, hs)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk), True = may attend
        out = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_attention=return_attention,
        )
        y, attn = out if return_attention else (out, None)
        y = y.transpose(1, 2).reshape(B, Tq, C)  # (B, Tq, nh * hs), heads concatenated
        y = self.out_proj(y)
        return (y, attn) if return_attention else y

    def _check(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
    ) -> None:
        for name, t, width in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3 or t.shape[-1] != width:
                raise ValueError(f"{name} must be (B, T, {width}), got shape {tuple(t.shape)}")
            check_tensor(t, self.q_proj.weight.dtype, name=name, allow_empty=True)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"batch/length mismatch: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool:
                raise TypeError(
                    f"key_padding_mask must be a bool tensor, got {key_padding_mask.dtype}"
                )
            if tuple(key_padding_mask.shape) != tuple(key.shape[:2]):
                raise ValueError(
                    f"key_padding_mask must be (B, Tk) = {tuple(key.shape[:2])}, "
                    f"got {tuple(key_padding_mask.shape)}"
                )

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kdim={self.kdim}, "
            f"vdim={self.vdim}, dropout={self.dropout}, backend={self.backend!r}"
        )


def sinusoidal_encoding(
    positions: torch.Tensor, dim: int, *, base: float = 10000.0
) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos * w_i), PE(pos, 2i+1) = cos(pos * w_i), w_i = base^(-2i/dim).

    positions: (T,) (any real dtype) -> (T, dim) in the positions' floating dtype (float32 for
    integer positions).
    """
    if dim < 2 or dim % 2 != 0:
        raise ValueError(f"sinusoidal encoding needs an even dim >= 2, got {dim}")
    return sinusoid_1d(positions, dim, base)  # (T, dim), sin at even, cos at odd channels


class SinusoidalPositionalEncoding(NotScriptable, nn.Module):
    """1D sinusoidal positional encoding of Vaswani et al. (sec. 3.5), added to (B, T, C).

    ``forward(x)`` returns dropout(x + PE[:T]); ``encoding(T)`` the (T, dim) table.
    For a fixed offset k, PE(pos + k) = R(k) PE(pos) with R(k) block-diagonal, one 2x2
    rotation by the angle w_i * k per (sin, cos) pair: ``rotation(k)`` returns R(k).

    Args:
        dim: channels C of the tokens (even).
        max_len: longest sequence T the table is made for.
        dropout: dropout after the addition.
        base: the wavelength base (sec. 3.5): w_i = base^(-2i / dim).
    """

    def __init__(
        self, dim: int, *, max_len: int = 4096, dropout: float = 0.0, base: float = 10000.0
    ) -> None:
        super().__init__()
        self.dim = positive_int("dim", dim)
        self.max_len = positive_int("max_len", max_len)
        self.base = finite_float("base", base, positive=True)
        pe = sinusoidal_encoding(torch.arange(max_len), dim, base=base)
        self.register_buffer("pe", pe, persistent=False)  # (max_len, dim)
        self.drop = nn.Dropout(dropout)

    def encoding(self, length: int) -> torch.Tensor:
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"sequence length must be an int >= 0, got {length!r}")
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {self.max_len}")
        return self.pe[:length]

    def rotation(self, offset: float) -> torch.Tensor:
        """R(k) (dim, dim) float64: PE(pos + k) = R(k) @ PE(pos) for every pos."""
        return sinusoid_rotation_1d(offset, self.dim, self.base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', x)}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected (B, T, {self.dim}), got shape {tuple(x.shape)}")
        return self.drop(x + self.encoding(x.shape[1]).to(x.dtype))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}"
