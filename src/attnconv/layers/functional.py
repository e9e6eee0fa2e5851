"""Scaled dot-product attention, written once for every layer and model of attnconv.

softmax(q k^T * scale + bias) v  (Vaswani et al. 2017, eq. 1; Cordonnier et al. 2020, eq. 1-2).

Two kernels of the same equation, picked by ``SEQUENCE_TABLE`` (the sequence layers' table:
MultiHeadAttention, the ViT and the Transformer; ``backend`` overrides it):
- ``"reference"``: the plain equation, dense logits, softmax, matmul.
- ``"sdpa"`` (fast): ``torch.nn.functional.scaled_dot_product_attention``. PyTorch's CPU
  flash kernel only runs when query/key and value have the same head dimension and no float
  bias is given; otherwise it silently falls back to a math path that keeps (B, nh, Tq, Tk)
  for backward. So we zero-pad the narrower of (q, k) / v to a common width: padding q and k
  with zeros leaves q.k unchanged, padding v adds zero output columns that are sliced off.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .checks import refuses_retired
from .first_order import compiling, first_order_only, transforms_active
from .precision import softmax_f32
from .rows import Row, choose, explain

SEQUENCE_BACKENDS = ("reference", "sdpa")  # the sequence layers' ``backend`` names


class SequenceCase(NamedTuple):
    """What SEQUENCE_TABLE reads: the backend override, whether the probabilities are returned,
    the q/k width per head, and whether a torch.func transform traces the call."""

    backend: str | None = None
    maps: bool = False
    dk: int = 1
    transformed: bool = False


def _sdpa_runs(c: SequenceCase) -> str | None:
    """What PyTorch's fused kernel cannot run: it returns no probabilities, takes no zero-width
    q and k, and its backward is not transform-aware (first_order.transforms_active)."""
    if c.maps:
        return "it returns no probabilities (return_attention)"
    if c.dk == 0:
        return "it takes no zero-width q and k (logits of the bias alone)"
    if c.transformed:
        return "inside a torch.func transform it has no derivative past the first"
    return None


SEQUENCE_TABLE = (
    Row(
        "sdpa",
        lambda c: c.backend != "reference",
        "any",
        'backend None or "sdpa": PyTorch\'s fused kernel, q, k, v padded to one width',
        "",
        _sdpa_runs,
    ),
    Row("reference", lambda c: True, "any", 'backend="reference", or otherwise: the plain path'),
)


def check_sequence_backend(backend: str | None) -> str | None:
    if backend is not None and backend not in SEQUENCE_BACKENDS:
        raise ValueError(f"backend must be None or one of {SEQUENCE_BACKENDS}, got {backend!r}")
    return backend


def sequence_kernel(backend: str | None, maps: bool, dk: int, why: bool = False) -> str:
    """The kernel SEQUENCE_TABLE picks (``why``: each row passed over, then the one chosen)."""
    case = SequenceCase(check_sequence_backend(backend), maps, dk, transforms_active())
    return (explain if why else choose)(case, SEQUENCE_TABLE)


def _check_args(q, k, v, bias, mask, dropout_p: float = 0.0, scale=None) -> None:
    """One-line TypeError/ValueError for arguments the kernels would reject deep inside PyTorch:
    non-tensors, integer or mixed dtypes (any floating mix under autocast), a non-bool mask,
    masks/biases that do not broadcast to (B, nh, Tq, Tk), dropout outside [0, 1), a scale that
    is not a finite number (NaN gave NaN on the plain path, finite values on the fused one)."""
    named = (("q", q), ("k", k)) + ((("v", v),) if v is not None else ())
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating-point, got dtype {t.dtype}")
    dtypes = {t.dtype for _, t in named}
    if len(dtypes) > 1 and not torch.is_autocast_enabled(q.device.type):
        raise TypeError(f"q, k, v dtypes differ: {', '.join(str(t.dtype) for _, t in named)}")
    if q.dim() != 4 or k.dim() != 4 or (v is not None and v.dim() != 4):
        shapes = ", ".join(str(tuple(t.shape)) for _, t in named)
        raise ValueError(f"q, k, v must be 4-D (B, nh, T, d); got {shapes}")
    try:
        lead = torch.broadcast_shapes(*(t.shape[:2] for _, t in named))  # (B, nh)
    except RuntimeError:
        shapes = ", ".join(str(tuple(t.shape)) for _, t in named)
        raise ValueError(f"q, k, v batch/head dims do not broadcast: {shapes}") from None
    logits = (*lead, q.shape[-2], k.shape[-2])
    for name, t in (("bias", bias), ("mask", mask)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if name == "mask" and t.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = may attend), got {t.dtype}")
        if name == "bias" and not t.is_floating_point():
            raise TypeError(f"bias must be floating-point, got dtype {t.dtype}")
        try:
            ok = torch.broadcast_shapes(t.shape, logits) == logits
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"{name} of shape {tuple(t.shape)} does not broadcast to the logits "
                f"(B, nh, Tq, Tk) = {tuple(logits)}"
            )
    if not (isinstance(dropout_p, (int, float)) and 0.0 <= dropout_p < 1.0):
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    # a tuple, not int | float: torch 2.8's Dynamo cannot build the union type
    real = isinstance(scale, (int, float)) and not isinstance(scale, bool)
    if scale is not None and not (real and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")


def _combine_masks(
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    causal: bool,
    tq: int,
    tk: int,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Fold a boolean keep-mask and a causal mask into one additive float bias (or None)."""
    if mask is None and not causal:
        return bias
    keep = torch.ones(tq, tk, dtype=torch.bool, device=device)
    if causal:
        keep = torch.ones(tq, tk, dtype=torch.bool, device=device).tril(diagonal=tk - tq)
    if mask is not None:
        keep = keep & mask
    neg = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
    return neg if bias is None else bias + neg


_M32 = 0xFFFFFFFF


def _h32(x: torch.Tensor, tmp: torch.Tensor | None = None) -> torch.Tensor:
    """A 32-bit integer mixer, in place on an int64 tensor holding uint32 values (each product
    < 2^63: int64 arithmetic is exact); kernels/fused_axis.cpp's ``h32`` in uint32 arithmetic."""
    tmp = torch.empty_like(x) if tmp is None else tmp
    for shift, mul in ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, None)):
        x.bitwise_xor_(torch.bitwise_right_shift(x, shift, out=tmp))
        if mul is not None:
            x.mul_(mul).bitwise_and_(_M32)
    return x


def dropout_seed() -> int:
    """One draw of the default generator: the seed of a step's attention-dropout links."""
    seed = torch.randint(0, 1 << 32, (), dtype=torch.int64)
    try:
        return int(seed)
    except RuntimeError:  # vmap(randomness="different") drew one seed per sample
        if not transforms_active():
            raise
    raise RuntimeError(
        "attnconv: the counter-hash dropout draws one seed a step, not one per vmapped sample: "
        "use vmap(..., randomness='same'), or the model in eval mode"
    )


def seed_tensor(seed: int | torch.Tensor | None = None) -> torch.Tensor:
    """The seed as a 0-dim int64 tensor (None: ``dropout_seed``'s draw, the same call on the
    default generator): what a compiled graph hands the custom ops of kernels/ops.py, where
    ``int()`` of a draw would break the graph (Tensor.item)."""
    if seed is None:
        return torch.randint(0, 1 << 32, (), dtype=torch.int64)
    return seed if isinstance(seed, torch.Tensor) else torch.tensor(seed, dtype=torch.int64)


def drop_threshold(p: float) -> int:
    """A link is dropped when its 32-bit hash is below this: probability p (to 2^-32)."""
    return min(int(p * 4294967296.0), _M32)


def _row_key(n: torch.Tensor, seed: int) -> torch.Tensor:
    """key(n) = h32(h32(n mod 2^32 ^ seed) ^ n >> 32) of int64 counters n, in place on n
    (kernels/hash.h's ``row_key``)."""
    hi = n >> 32
    n.bitwise_and_(_M32).bitwise_xor_(seed)
    return _h32(_h32(n).bitwise_xor_(hi))


def dropped_elements(n: int, p: float, device, seed, offset: int = 0) -> torch.Tensor:
    """The elements hidden dropout (dropout.py) removes from a tensor of n elements, each with
    probability p independently: bool (n,), element i (row-major) dropped when key(offset + i)
    < p 2^32, the counter hash of ``dropped_links``' rows; the fused kernel (kernels/dropout.cpp)
    redraws it in forward and backward without storing it. Compiled: one custom op (the hash's
    int64 passes stay out of Inductor's code)."""
    if compiling():
        return torch.ops.attnconv.dropped_elements(seed_tensor(seed), n, p, offset, device)
    seed = int(seed)
    out = torch.empty(n, dtype=torch.bool, device=device)
    step, threshold = 1 << 16, drop_threshold(p)  # a chunk's hashes stay in cache
    for i in range(0, n, step):
        e = torch.arange(offset + i, offset + min(i + step, n), device=device, dtype=torch.int64)
        torch.lt(_row_key(e, seed), threshold, out=out[i : i + e.shape[0]])
    return out


def dropped_links(
    nh: int, t: int, batch: int | None, p: float, device, seed: int | torch.Tensor | None = None
) -> torch.Tensor:
    """The links attention dropout removes, each with probability p independently (as
    ``nn.Dropout`` draws them): bool (Nh, T, T) shared by the batch (``batch=None``, the
    reference code's Gaussian layer) or (B, Nh, T, T) a mask per image. Every path that can
    share its mask with another draws it here, so that they agree under one seed. Link (row,
    key j) of row = (b Nh + h) T + i is dropped when h32(key(row) ^ j) < p 2^32 with
    key(row) = h32(h32(row mod 2^32 ^ seed) ^ row >> 32), a counter hash of one ``seed`` drawn
    from the default generator: the fused kernel (kernels/fused.py) redraws it without storing.
    Compiled: one custom op of kernels/ops.py (seed: a 0-dim tensor there)."""
    if compiling():
        b, per_image = (0, False) if batch is None else (batch, True)
        ops = torch.ops.attnconv
        return ops.dropped_links(seed_tensor(seed), nh, t, b, per_image, p, device)
    seed = dropout_seed() if seed is None else int(seed)
    n = (1 if batch is None else batch) * nh * t  # (a batch of 0: no links)
    key = _row_key(torch.arange(n, device=device, dtype=torch.int64)[:, None], seed)  # (rows, 1)
    cols = torch.arange(t, device=device, dtype=torch.int64)
    out = torch.empty(n, t, dtype=torch.bool, device=device)
    step, threshold = max(1, (1 << 15) // t), drop_threshold(p)  # a chunk's hashes stay in cache
    u, tmp = (torch.empty(min(step, n), t, dtype=torch.int64, device=device) for _ in "ut")
    for i in range(0, n, step):
        m = min(step, n - i)
        torch.bitwise_xor(key[i : i + m], cols, out=u[:m])
        torch.lt(_h32(u[:m], tmp[:m]), threshold, out=out[i : i + m])
    return out.view((nh, t, t) if batch is None else (batch, nh, t, t))


def shared_dropout(probs: torch.Tensor, p: float, per_image: bool = False) -> torch.Tensor:
    """Dropout of ``probs`` (B|1, nh, Tq, Tk) with the links of ``dropped_links``: one mask for
    the whole batch (the reference code's Gaussian layer drops the same attention links for every
    image of a step), or ``per_image`` a mask per image; kept links scaled by 1 / (1 - p)."""
    if p == 0.0:
        return probs
    b, nh, t = probs.shape[0], probs.shape[1], probs.shape[2]
    if per_image:
        dropped = dropped_links(nh, t, b, p, probs.device)  # (B, Nh, T, T)
    else:
        dropped = dropped_links(nh, t, None, p, probs.device)[None]
    return probs * (~dropped).to(probs.dtype).div_(1.0 - p)


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """The softmax probabilities (..., Tq, Tk) of the plain equation.

    q (B, nh, Tq, dk), k (B, nh, Tk, dk); dk may be 0 (position-only attention: logits = bias).
    bias broadcasts to (B, nh, Tq, Tk); mask is boolean, True = may attend, broadcasting likewise.
    Rows whose keys are all masked get zero probabilities instead of NaN.
    """
    _check_args(q, k, None, bias, mask, scale=scale)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q/k widths differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
    dk = q.shape[-1]
    scale = (1.0 / math.sqrt(dk) if dk > 0 else 1.0) if scale is None else scale
    logits = (q @ k.transpose(-2, -1)) * scale  # (B, nh, Tq, Tk)
    full = _combine_masks(bias, mask, causal, q.shape[-2], k.shape[-2], q.device, logits.dtype)
    if full is not None:
        logits = logits + full
    # rows whose keys are all masked: zero probabilities, and no NaN in the backward pass either
    # (softmax of an all -inf row is NaN, and nan_to_num would still pass NaN gradients back)
    dead = torch.isneginf(logits).all(dim=-1, keepdim=True) if full is not None else None
    if dead is not None:
        logits = logits.masked_fill(dead, 0.0)
    probs = softmax_f32(logits)
    if dead is not None:
        probs = probs.masked_fill(dead, 0.0)
    return probs.to(q.dtype)


@refuses_retired
def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    backend: str | None = None,
    return_attention: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias) v.

    q (B, nh, Tq, dk), k (B, nh, Tk, dk), v (B, nh, Tk, dv) -> (B, nh, Tq, dv).
    ``scale`` defaults to 1/sqrt(dk). ``mask``: bool, True = may attend. ``causal``: query i
    attends keys j <= i + Tk - Tq (aligned to the end; with Tq > Tk the first Tq - Tk rows attend
    nothing and are zero). With ``return_attention=True`` also
    returns the probabilities (B, nh, Tq, Tk) (computed by the plain path, so identical). Inside
    a ``torch.func`` transform the plain path runs too (any order of derivative). ``backend``:
    None (SEQUENCE_TABLE's choice), ``"reference"`` or ``"sdpa"``.
    """
    _check_args(q, k, v, bias, mask, dropout_p, scale)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"q/k widths or k/v lengths differ: q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    dk, dv = q.shape[-1], v.shape[-1]
    scale = (1.0 / math.sqrt(dk) if dk > 0 else 1.0) if scale is None else scale

    if sequence_kernel(backend, return_attention, dk) == "reference":
        probs = attention_probs(q, k, bias=bias, mask=mask, causal=causal, scale=scale)
        p = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
        y = p @ v  # (B, nh, Tq, dv)
        return (y, probs) if return_attention else y

    # fast path: fused kernel, heads padded to a common width so the flash kernel applies, rounded
    # up to a multiple of 4 on a CPU (its kernel runs markedly slower at some other widths, e.g.
    # 51) and of 8 on a GPU (past FlashAttention's 256 only the memory-efficient kernel is
    # fused, and by PyTorch's dispatch rules as read it wants 16-bit widths a multiple of 8, else
    # the math kernel, (B, nh, Tq, Tk) in memory, runs; tests/test_functional.py checks on a GPU)
    m = 8 if q.is_cuda else 4
    d = -(-max(dk, dv) // m) * m
    if dk < d:
        q = F.pad(q, (0, d - dk))
        k = F.pad(k, (0, d - dk))
    if dv < d:
        v = F.pad(v, (0, d - dv))
    attn_mask = _combine_masks(bias, mask, causal, q.shape[-2], k.shape[-2], q.device, q.dtype)
    is_causal = False
    if (
        attn_mask is not None
        and bias is None
        and mask is None
        and causal
        and q.shape[-2] == k.shape[-2]
    ):
        attn_mask, is_causal = None, True  # the kernel's own causal mask, no bias tensor
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)
    q, k, v = first_order_only("the fused attention kernel (backend='sdpa')", q, k, v)
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    return y[..., :dv]
