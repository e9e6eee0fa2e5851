"""Multi-head self-attention over the pixels of an image, with every positional encoding of
Cordonnier, Loukas, Jaggi, "On the Relationship between Self-Attention and Convolutional
Layers" (ICLR 2020), eq. 1-9.

    MHSA(X) = concat_h[ softmax(A^(h)) X Wval^(h) ] Wout + bout          (eq. 1-2)

with A^(h) the content term X Wq Wk^T X^T / sqrt(Dk) (``content=True``) plus the positional
term of ``positional``. The forward reads: project (q, k, v), term (the encoding's positional
logits, typed: terms.py), plan (kernels/plan.py, one table: term x device x grad x dropout x
size, ``backend=`` overrides it), kernel (kernels/). ``backend="reference"`` runs the plain
equations (dense (B, Nh, T, T) logits); the plan's choice is the fastest exact kernel: position-only
attention shared by the batch or, separable, a row then a column operator (never T x T); with
content, FlexAttention on CUDA, the query-blocked kernel on CPU, or every positional term folded
into augmented q/k for the fused ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import BackendKnob, check_maps, check_tensor, positive_int
from .encodings.base import PositionalEncoding, check_size
from .encodings.registry import POSITIONALS, build_encoding
from .encodings.terms import Grid
from .kernels import KERNELS, plan, triton_axis
from .kernels.position import dense_inputs, reference_probs
from .kernels.separable import head_major, head_major_output
from .scripting import NotScriptable

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


class MultiHeadSelfAttention2d(NotScriptable, BackendKnob, nn.Module):
    """Multi-head self-attention on NCHW images: (B, in_channels, H, W) -> (B, out_channels, H, W).

    Args:
        in_channels: channels of the input image (Cin).
        out_channels: channels of the output image (Cout).
        num_heads: attention heads (Nh).
        positional: a ``PositionalEncoding``, or its string shorthand, one of ``POSITIONALS``.
        content: add the content-content term ``q k^T / sqrt(Dk)``.
        head_dim: value width per head; default ``out_channels // num_heads``, and
            ``in_channels`` when ``value="identity"``.
        qk_dim: query/key width per head; default ``head_dim``.
        value: ``"linear"`` (values ``Linear(Cin, Nh * head_dim)``) or ``"identity"`` (each head
            attends over the raw input, the reference code's layout).
        dropout: dropout on the attention probabilities.
        dropout_mask: ``"sample"`` (a mask per image) or ``"batch"`` (one ``(Nh, T, T)`` mask
            shared by the batch, the reference code's Gaussian layer; position-only attention
            only).
        max_size: side of learned tables.
        bias: biases of the projections.
        backend: None (the plan's choice: the fastest exact kernel), ``"reference"`` (the plain
            equations) or ``"flex"``, ``"blocked"``, ``"fused"``, ``"fold"``, ``"triton"``: that
            family of kernels where it applies (kernels/plan.py).
        **encoding_options (Any): go to the named encoding (``build_encoding``): ``hard``,
            ``init_centers_std``, ``init_alpha`` (quadratic); ``relative_terms``, ``learned_r``
            (relative, Dai eq. 8); ``rel_dim`` (r_delta width, relative encodings; not
            relative_learned read by the query, whose tables are its halves);
            ``head_keys`` (relative_learned: per-head keys read the tables, with content too).

    Shapes:
        ``forward(x)``: x ``(B, Cin, H, W)`` -> ``(B, Cout, H, W)``; with
        ``return_attention=True`` also the probabilities ``(B or 1, Nh, H * W, H * W)``.
    """

    BACKENDS = plan.BACKENDS  # the ``backend`` names it takes (kernels/plan.py)

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
        max_size: int = 64,
        bias: bool = True,
        backend: str | None = None,
        **encoding_options,
    ):
        super().__init__()
        for name, val in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("num_heads", num_heads),
            ("max_size", max_size),
        ):
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
        self.scale = qk_dim**-0.5
        self.backend = backend  # None: the plan's choice
        self.positional_encoding = build_encoding(
            positional,
            num_heads=num_heads,
            in_channels=in_channels,
            qk_dim=qk_dim,
            content=self.content,
            max_size=max_size,
            **encoding_options,
        )
        enc = self.positional_encoding
        self.positional = enc.name
        self.input_dependent = self.content or enc.reads_q  # logits read q/k
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

    check_backend = staticmethod(triton_axis.check_backend)

    @property
    def separable(self) -> bool:
        """Position-only attention that runs as a row then a column operator (or a shift)."""
        term = self.positional_encoding.term(1, 1, content=self.content)
        return KERNELS[plan.choose(plan.Case(term, self.content))].layout == "head_major"

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
        b, _, h, w = x.shape
        if enc.learned_size is not None:
            check_size(h, w, enc.learned_size, "positional")
        return b, h, w

    def _heads(self, t: torch.Tensor, d: int) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], self.num_heads, d).transpose(1, 2)  # (B, nh, T, d)

    def project(self, x: torch.Tensor):
        """x (B, Cin, H, W) -> q, k (B|1, Nh, T, dk) (X Wq, X Wk, eq. 1; absolute encodings add P
        first, eq. 7; None when the logits read no q/k) and v (B, Nh, T, Dv) (X Wval; for
        value="identity" the raw input, one tensor every head reads: stride 0)."""
        b, _, h, w = x.shape
        xt = x.flatten(2).transpose(1, 2)  # (B, T, Cin)
        if self.value == "identity":  # each head attends over the raw input
            v5 = xt.view(b, h, w, 1, self.in_channels)
        else:  # (values first: the order autograd sums dX in)
            v5 = self.value_proj(xt).view(b, h, w, self.num_heads, self.head_dim)
        d = v5.shape[-1]
        v = v5.reshape(b, h * w, v5.shape[3], d).transpose(1, 2).expand(b, self.num_heads, h * w, d)
        q = k = None
        if self.has_qk:
            src = xt
            if self.positional_encoding.adds_to_input:
                p = self.positional_encoding(h, w).to(self.out_proj.weight.dtype)  # (T, Cin)
                src = xt + p if self.content else p[None]
            q = self._heads(self.query_proj(src), self.qk_dim)  # (B|1, Nh, T, dk)
            k = self._heads(self.key_proj(src), self.qk_dim)
        return q, k, v

    def dense(self, x: torch.Tensor):
        """The plain equations' q, k, bias: logits = q k^T * scale + bias, bias (B|1, Nh, T, T)."""
        _, _, h, w = x.shape
        term = self.positional_encoding.term(h, w, content=self.content)
        return dense_inputs(*self.project(x), term, Grid(h, w, x.dtype))

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax probabilities ``(B or 1, Nh, H * W, H * W)``, rows: queries, row-major."""
        b, h, w = self._check_input(x)
        check_maps(self, self._maps_shape(b, h, w), x)
        term = self.positional_encoding.term(h, w, content=self.content)
        return reference_probs(*self.project(x), term, Grid(h, w, x.dtype), self.scale)

    def kernel(
        self,
        x: torch.Tensor,
        p_drop: float | None = None,
        device: str | None = None,
        why: bool = False,
        tokens: bool = False,
    ) -> str:
        """The kernel (kernels.KERNELS) ``forward`` runs on x (B, Cin, H, W): the plan's choice,
        with attention dropout ``p_drop`` (default: the layer's in its mode) on ``device``
        (default: x's); ``why=True``: each row of the plan passed over and what it needs, then
        the one chosen (plan.explain); ``tokens``: for ``forward_tokens`` on x's tokens."""
        _, h, w = self._check_input(x)
        p = (self.dropout if self.training else 0.0) if p_drop is None else p_drop
        term = self.positional_encoding.term(h, w, content=self.content)
        return plan.for_layer(self, x, term, p, device, why=why, tokens=tokens)

    # ------------------------------------------------------------------ forward
    def _maps_shape(self, b: int, h: int, w: int) -> tuple[int, int, int, int]:
        """The shape of ``return_attention``'s probabilities (position only: one map)."""
        return (b if self.input_dependent else 1, self.num_heads, h * w, h * w)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        b, h, w = self._check_input(x)
        if return_attention:  # refused before any of it is computed when it cannot fit
            check_maps(self, self._maps_shape(b, h, w), x)
        grid, p_drop = Grid(h, w, x.dtype), self.dropout if self.training else 0.0
        term = self.positional_encoding.term(h, w, content=self.content)
        if not b:  # a batch of 0: an empty output (no kernel, no positional logits computed)
            return self._empty(x, h, w, return_attention)
        case, table = plan.layer_case(self, x, term, p_drop)
        name = plan.choose(case, table)
        if self.backend is not None:
            enc = f"{self.positional} encoding" + (" with content" if self.content else "")
            drop = " with attention dropout" if p_drop else ""
            have = f"it has {plan.term_words(term)} from its {enc} on {x.device.type}{drop}"
            plan.warn_if_passed_over(case, name, table, have)
        kernel = KERNELS[name]
        if kernel.layout == "head_major":  # (Nh|1, D, H, B, W) values, a 1x1 conv each way
            linear = self.value == "linear"
            v = head_major(
                x,
                self.value_proj.weight if linear else None,
                self.value_proj.bias if linear else None,
                self.num_heads,
            )
            y = kernel.run(None, None, v, term, grid, self.scale)
            y = head_major_output(y, self.out_proj.weight, self.out_proj.bias)
        else:
            q, k, v = self.project(x)
            y = kernel.run(
                q,
                k,
                v,
                term,
                grid,
                self.scale,
                p_drop=p_drop,
                per_image=self.dropout_mask == "sample",
            )  # (B, T, Nh, Dv)
            y = self.out_proj(y.reshape(b, h * w, self.num_heads * self.head_dim))  # (B, T, Cout)
            y = y.transpose(1, 2).reshape(b, self.out_channels, h, w)
        if return_attention:  # the path's own factors, before dropout
            probs = KERNELS[plan.for_layer(self, x, term, 0.0)].probs
            return y, probs(*self.project(x), term, grid, self.scale)
        return y

    def _empty(self, x: torch.Tensor, h: int, w: int, return_attention: bool):
        """A batch of 0: (0, Cout, H, W), on the graph of x and the value and output projections
        (their gradients zero), as an nn.Conv2d gives; with ``return_attention`` (0, Nh, T, T)."""
        xt = x.flatten(2).transpose(1, 2)  # (0, T, Cin)
        v = xt.repeat(1, 1, self.num_heads) if self.value == "identity" else self.value_proj(xt)
        y = self.out_proj(v).transpose(1, 2).reshape(0, self.out_channels, h, w)
        if not return_attention:
            return y
        return y, x.new_zeros(0, self.num_heads, h * w, h * w)

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on sequence-first channels-last tokens: (H, W, B, Cin) -> (H, W, B, Cout),
        the paper models' layout. Where the plan picks "separable_tokens" (separable
        position-only attention on a CPU) it runs there with no layout copy, attention dropout
        included (shared_position.py); every other kernel is ``forward`` on the NCHW view."""
        xn = x.permute(2, 3, 0, 1)  # (B, Cin, H, W) view
        b, h, w = self._check_input(xn)
        term = self.positional_encoding.term(h, w, content=self.content)
        p = self.dropout if self.training else 0.0
        if not b:  # a batch of 0: no kernel
            return self.forward(xn).permute(2, 3, 0, 1)
        kernel = KERNELS[plan.for_layer(self, xn, term, p, tokens=True)]
        if kernel.layout != "projected":
            return self.forward(xn).permute(2, 3, 0, 1)
        if self.value == "identity":
            v = x[None]  # (1, H, W, B, C): every head reads the raw input
        else:
            v = F.linear(x, self.value_proj.weight, self.value_proj.bias)  # (H, W, B, Nh*Dv)
            v = v.view(h, w, b, self.num_heads, self.head_dim).permute(3, 0, 1, 2, 4)
        grid, sample = Grid(h, w, x.dtype), self.dropout_mask == "sample"
        w_out, b_out = self.out_proj.weight, self.out_proj.bias
        return kernel.run(v, term, grid, w_out, b_out, p_drop=p, per_image=sample)
