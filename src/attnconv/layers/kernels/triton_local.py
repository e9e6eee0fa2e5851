"""SASA's k x k window attention as one flash-style Triton kernel (a GPU's; ``TRITON_INTERPRET=1``
runs the same source on CPU tensors, how the tests run it):

    y_ij = sum_ab softmax_ab(q_ij . k_ab + q_ij . r_{a-i, b-j}) v_ab      (Ramachandran et al.
                                                                     2019, eq. 3; padding="mask")

with r_{a-i, b-j} = [r_row[a-i] | r_col[b-j]] split over the head's two halves, so the relative
logit is Rq[ij, a-i] + Cq[ij, b-j] (Rq, Cq: (B, Nh, T, k), q . r per query and offset, built
here with torch ops, so the tables learn through autograd). The kernels are triton_axis's with
WINDOW set (triton_axis_jit.py): the tables read at each key's offset, -inf off the window,
queries in 2-D tiles of 8 columns and keys in 8-column blocks on a grid that
``triton_tiles.window_shift`` places, every loop walking only the blocks a window reaches:
nothing of size T x T or T x k^2 in memory, no unfolded keys. The launch (tiles, shared-memory
rungs, one block shape a call) is triton_axis's too. The plain equations beside it:
``window_attention_reference`` (term for term; tested equal to the unfold kernel,
``window.local_attention(backend="reference")``). No attention dropout (SASA has none).
"""

from __future__ import annotations

import torch

from ..first_order import first_order_only
from ..precision import no_autocast
from . import triton_axis, triton_tiles
from .fused import axis_attention_reference


def unsupported(
    q: torch.Tensor, v: torch.Tensor, h: int, w: int, padding: str, kernel_size: int
) -> str | None:
    """Why the kernel cannot run these inputs (one line), or None when it can."""
    if padding != "mask":
        return f'the Triton window kernel takes padding="mask", not {padding!r}'
    return triton_axis.unsupported(q, v, h, w, logits=triton_tiles.window_logits(kernel_size, w))


def _seq(t: torch.Tensor) -> torch.Tensor:
    """(B, Nh, c, H, W) -> (B, Nh, T, c), contiguous in c."""
    return t.flatten(3).transpose(-1, -2).contiguous()


def relative_logits(qs, rel_row, rel_col, kernel_size: int) -> torch.Tensor:
    """[Rq | Cq] (B, Nh, T, 2k) of the queries qs (B, Nh, T, dk): q . r_row and q . r_col per
    query and window offset (the head's two halves), float32 at least; zeros without tables
    (broadcast, stride 0)."""
    b, nh, t, dk = qs.shape
    table = torch.promote_types(qs.dtype, torch.float32)
    if rel_row is None:
        zero = torch.zeros(1, 1, 1, 2 * kernel_size, dtype=table, device=qs.device)
        return zero.expand(b, nh, t, -1)
    half, qs = dk // 2, qs.to(table)
    rq = qs[..., :half] @ rel_row.to(table).t()
    return torch.cat([rq, qs[..., half:] @ rel_col.to(table).t()], -1)


def window_axis_logits(qa: torch.Tensor, h: int, w: int, kernel_size: int) -> torch.Tensor:
    """The window's relative logits [Rq | Cq] (B, Nh, T, 2k) as axis logits [R | C] (B, Nh, T,
    H + W) over every image row and column: Rq[i, row - row(i) + c] where the window reaches the
    row, -inf where it does not (columns alike)."""
    before, t = (kernel_size - 1) // 2, h * w
    i = torch.arange(t, device=qa.device)
    axes = []
    for n, pos, table in ((h, i // w, qa[..., :kernel_size]), (w, i % w, qa[..., kernel_size:])):
        off = torch.arange(n, device=qa.device)[None, :] - pos[:, None] + before  # (T, n)
        inside = (off >= 0) & (off < kernel_size)
        idx = off.clamp(0, kernel_size - 1).expand(*table.shape[:2], t, n)
        axes.append(table.gather(-1, idx).masked_fill(~inside, float("-inf")))
    return torch.cat(axes, -1)


def window_attention_reference(q, k, v, kernel_size: int, rel_row=None, rel_col=None):
    """The plain equations of ``local_attention_triton``, term for term: the window's relative
    logits as axis logits (-inf off the window) through ``fused.axis_attention_reference`` (the
    dense logits, softmax, @ v); equal to the unfold kernel (tests/test_triton_local.py)."""
    b, nh, _, h, w = q.shape
    qs, vs = _seq(q), _seq(v)
    qa = window_axis_logits(relative_logits(qs, rel_row, rel_col, kernel_size), h, w, kernel_size)
    ks = _seq(k) if k is not None else torch.zeros_like(qs)
    y = axis_attention_reference(qs, ks, vs, qa, h, w, 1.0)  # (B, T, Nh, dv)
    return y.permute(0, 2, 3, 1).reshape(b, nh, -1, h, w)


def local_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor,
    kernel_size: int,
    rel_row: torch.Tensor | None = None,
    rel_col: torch.Tensor | None = None,
    block_m: int | None = None,
) -> torch.Tensor:
    """q (already scaled), k (B, Nh, dk, H, W) or None (no content logits), v (B, Nh, dv, H, W),
    rel_row / rel_col (k, dk/2) or None -> (B, Nh, dv, H, W) in q's dtype (bfloat16 / float16 /
    float32 / float64), as ``window.local_attention(..., padding="mask")``. First derivative
    only."""
    b, nh, _, h, w = q.shape
    why = unsupported(q, v, h, w, "mask", kernel_size)
    if why:
        raise RuntimeError(f"attnconv: {why}")
    if k is None and rel_row is None:
        raise ValueError("local_attention_triton needs keys k or relative tables rel_row/rel_col")
    ks = kernel_size
    with no_autocast(q.device.type):
        qs, vs = _seq(q), _seq(v.to(q.dtype))
        qa = relative_logits(qs, rel_row, rel_col, ks)  # (B, Nh, T, 2k)
        kseq = _seq(k.to(q.dtype)) if k is not None else torch.zeros_like(qs)
        qs, kseq, vs, qa = first_order_only("the Triton window attention", qs, kseq, vs, qa)
        # (B, T, Nh, dv); q is scaled, no dropout; compiled: the custom op (triton_ops.py)
        y = triton_axis.attention(qs, kseq, vs, qa, h, w, 1.0, 0.0, 0, True, block_m, ks)
    return y.permute(0, 2, 3, 1).reshape(b, nh, -1, h, w)
