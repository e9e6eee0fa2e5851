"""The geometry of the local k x k window (kernels/window.py's attention and the layers that
read its maps): the offsets a window covers, which keys of it lie inside the image, the zero
padding that fits every window, the query and key boxes of each offset, and window maps spread
back to dense (query, key) maps."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_pad(kernel_size: int) -> tuple[int, int]:
    """Offsets covered by the window: -before .. +after (centred; even k leans to +)."""
    before = (kernel_size - 1) // 2
    return before, kernel_size - 1 - before


def window_valid(kernel_size: int, h: int, w: int, device=None) -> torch.Tensor:
    """Bool (k*k, H, W): True where key (i+di, j+dj) of query (i, j) lies inside the image."""
    before, _ = window_pad(kernel_size)
    off = torch.arange(kernel_size, device=device) - before  # (k,)
    rows = torch.arange(h, device=device)[None, :] + off[:, None]  # (k, H)
    cols = torch.arange(w, device=device)[None, :] + off[:, None]  # (k, W)
    vr = (rows >= 0) & (rows < h)
    vc = (cols >= 0) & (cols < w)
    return (vr[:, None, :, None] & vc[None, :, None, :]).reshape(kernel_size**2, h, w)


def pad_hw(x: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Zero-pad (..., H, W) so every window fits."""
    b, a = window_pad(kernel_size)
    return F.pad(x, (b, a, b, a))


def window_offsets(ks: int, h: int, w: int):
    """For each offset o = (di, dj) of the window: the query box (rows, cols) whose keys
    (i + di - c, j + dj - c) lie inside the image, and that key box. Keys outside the image
    are never read: no padded copies of the keys or values."""
    before, _ = window_pad(ks)
    for di in range(ks):
        ri = di - before
        qi, ki = slice(max(0, -ri), min(h, h - ri)), slice(max(0, ri), min(h, h + ri))
        for dj in range(ks):
            rj = dj - before
            qj, kj = slice(max(0, -rj), min(w, w - rj)), slice(max(0, rj), min(w, w + rj))
            if qi.start < qi.stop and qj.start < qj.stop:
                yield di * ks + dj, (..., qi, qj), (..., ki, kj)


def local_to_dense(maps: torch.Tensor, h: int, w: int, kernel_size: int) -> torch.Tensor:
    """(B, nh, H*W, k*k) window probabilities -> dense (B, nh, T, T) maps (rows = queries).

    Keys outside the image (zero-padding mode) have no column and are dropped.
    """
    bsz, nh, t, kk = maps.shape
    if t != h * w or kk != kernel_size**2:
        raise ValueError(f"maps {tuple(maps.shape)} do not match H={h}, W={w}, k={kernel_size}")
    before, _ = window_pad(kernel_size)
    off = torch.arange(kernel_size, device=maps.device) - before
    qi = torch.arange(h, device=maps.device).repeat_interleave(w)  # (T,)
    qj = torch.arange(w, device=maps.device).repeat(h)
    ki = qi[:, None, None] + off[None, :, None]  # (T, k, 1)
    kj = qj[:, None, None] + off[None, None, :]  # (T, 1, k)
    ki, kj = torch.broadcast_tensors(ki, kj)
    valid = ((ki >= 0) & (ki < h) & (kj >= 0) & (kj < w)).reshape(t, kk)
    col = (ki.clamp(0, h - 1) * w + kj.clamp(0, w - 1)).reshape(t, kk)
    dense = maps.new_zeros(bsz, nh, t, t)
    src = maps * valid.to(maps.dtype)
    return dense.scatter_add_(3, col.expand(bsz, nh, t, kk), src)
