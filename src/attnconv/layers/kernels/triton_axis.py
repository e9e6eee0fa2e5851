"""Content attention with axis positional logits as one flash-style Triton kernel (a GPU's;
``TRITON_INTERPRET=1`` runs the same source on CPU tensors, how the tests run it):

    y = (softmax_k(scale q.k + R[q, row(k)] + C[q, col(k)]) o M / (1 - p)) v
                                                   (Cordonnier et al. eq. 9, split by axis)

R (B|1, Nh, T, H) and C (B|1, Nh, T, W) are the row and column logits of the quadratic and
learned-relative encodings (``q_axis`` = [R, C], terms.AxisTerm). A program owns a block of
BLOCK_M queries and walks the keys ROWS image rows at a time, so a key block's column logits
are the query block's C (loaded once) and its row logits ROWS values per query: no (T, T)
tensor in memory, no gather in the loop. Online softmax in forward (the log-sum-exp kept); the
backward recomputes the probabilities in two kernels: one per query block (a first pass for each
query's delta = rowsum(P o dP), then dQ and the gradients of R and C, reduced over the keys of
each image row and column inside the program that owns the queries: no atomics) and one per
key block (dK, dV). M is the counter hash of
``functional.dropped_links``, redrawn in every kernel from (seed, row, key), so it drops
the links the CPU kernels and the plain path drop under one seed (the fold on CUDA draws
SDPA's own mask: the same law, other links). q, k, v in float32 (TF32 only where
``torch.backends.cuda.matmul.allow_tf32`` opts in), bfloat16 or float16 with float32
accumulation, float64 (gradcheck); R and C in float32 at least. The plain equations beside it:
``fused.axis_attention_reference``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re

import torch
from torch.autograd.function import once_differentiable

from ..first_order import compiling, first_order_only
from ..functional import drop_threshold, dropout_seed, seed_tensor
from ..precision import backward_without_autocast, no_autocast, shared, shared_sum
from . import triton_tiles
from .triton_launch import (  # noqa: F401  (re-exported: the launch's names, read here)
    FP_FUSION,
    STAGES,
    compile_options,
    launch,
    launch_name,
    rungs,
)
from .triton_tiles import pow2, window_dqa, window_logits, window_wp

INSTALLED = importlib.util.find_spec("triton") is not None
MAX_WIDTH = 128  # a key block is at least one image row: wider rows would spill registers
MAX_HEAD_DIM = 512
MAX_ELEMENTS = 2**31 - 1  # the kernels' offsets are int32 (program ids times strides)
MAX_IMAGE_HEADS = 65535  # B x Nh is the launch grid's second dimension (CUDA's limit)
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _version() -> str | None:
    """The installed triton's version, from its distribution's metadata (triton not imported):
    PyPI's ``triton`` or PyTorch nightlies' ``pytorch-triton``; None where neither is found."""
    for dist in ("triton", "pytorch-triton"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def _at_least(version: str | None, major: int, minor: int) -> bool:
    """Whether ``version`` ("3.5.0", "3.6.0rc1", "3.5.0+git1") is major.minor or later; a version
    missing or not of that form is not (never an error at import)."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return m is not None and (int(m[1]), int(m[2])) >= (major, minor)


VERSION = _version() if INSTALLED else None
# triton before 3.5 compiles no float64 tl.dot ("Unsupported lhs dtype fp64", 3.4 for sm_80 and
# sm_90); its interpreter runs one. A version not found: float64 takes the dense path
FLOAT64_DOT = _at_least(VERSION, 3, 5)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def unsupported(
    q: torch.Tensor, v: torch.Tensor, h: int, w: int, logits: int | None = None
) -> str | None:
    """Why the kernel cannot run these inputs (one line), or None when it can. ``logits``: the
    columns of its positional logits and their gradient (default the axis logits' H + W)."""
    if not INSTALLED:
        return "triton is not installed (pip install triton)"
    if q.dtype == torch.float64 and not (FLOAT64_DOT or interpreted()):
        found = VERSION or "(version not found)"
        return f"triton {found} compiles no float64 matrix product (3.5 does)"
    if q.device.type != "cuda" and not interpreted():
        return f"the Triton kernel runs on CUDA (or under TRITON_INTERPRET=1), not {q.device.type}"
    if q.dtype not in DTYPES:
        return f"the Triton kernel takes float32/bfloat16/float16/float64, not {q.dtype}"
    if w > MAX_WIDTH:
        return f"the Triton kernel takes image rows up to {MAX_WIDTH} pixels, not {w}"
    # q, v: (B, Nh, T, d) sequences or SASA's (B, Nh, d, H, W) maps
    width = max(x.shape[2] if x.dim() == 5 else x.shape[-1] for x in (q, v))
    if width > MAX_HEAD_DIM:
        return f"the Triton kernel takes head widths up to {MAX_HEAD_DIM}, not {width}"
    bh = max(q.shape[0], v.shape[0]) * q.shape[1]  # q may be one image's, expanded
    if bh > MAX_IMAGE_HEADS:
        return f"the Triton kernel takes batch x heads up to {MAX_IMAGE_HEADS}, not {bh}"
    # every tensor a launch reads or writes is (B, Nh, T, columns): the largest within int32
    elements = bh * h * w * max(width, h + w if logits is None else logits)
    if elements > MAX_ELEMENTS:
        return f"the Triton kernel's int32 offsets take tensors under 2^31 elements, not {elements}"
    return None


def check_backend(value: str | None) -> str | None:
    """A layer's ``backend``, refused in one line where it names a Triton kernel and triton is
    not installed (MultiHeadSelfAttention2d's and LocalSelfAttention2d's)."""
    if value == "triton" and not INSTALLED:
        raise ValueError("backend='triton' needs triton: pip install triton")
    return value


if INSTALLED:
    import triton
    import triton.language as tl

    from .triton_axis_jit import _bwd_dkdv, _bwd_dq, _fwd


def _bad_shapes(what: str, *xs: torch.Tensor) -> ValueError:
    return ValueError(f"{what}, got " + ", ".join(str(tuple(x.shape)) for x in xs))


def trains(*xs: torch.Tensor) -> bool:
    """Whether a backward will follow a call on ``xs``: grad mode on, an input needing it."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _meta(q, h: int, w: int, window: int = 0) -> dict:
    """The compile-time values the three kernels share: image rows padded to WP >= W columns
    (a window's: triton_tiles.WINDOW_WP columns), the products' precision and accumulation
    dtype. Each kernel adds its tile (``_tiled``)."""
    if q.dtype == torch.float32:
        prec = "tf32" if q.is_cuda and torch.backends.cuda.matmul.allow_tf32 else "ieee"
    else:
        prec = "ieee"  # bf16/fp16 multiply exactly in fp32; float64 stays
    acc = tl.float64 if q.dtype == torch.float64 else tl.float32
    wp = window_wp(w) if window else pow2(w)
    return dict(WP=wp, PREC=prec, ACC=acc, WINDOW=window > 0)


def _tiled(kernel, meta: dict, dtype: torch.dtype, block_m: int | None) -> dict:
    """``meta`` with ``kernel``'s tile (triton_tiles.tile; the three kernels of a call share
    its block): BLOCK_M queries, a key block of ROWS image rows (at least one), num_warps;
    ``block_m`` overrides the query block."""
    width = max(meta["DKP"], meta["DVP"])
    kind = triton_tiles.kind(dtype, meta["PREC"])
    t = triton_tiles.tile(kernel.__name__, kind, width, meta["WP"])
    rows = max(1, t.keys // meta["WP"])
    return dict(meta, BLOCK_M=block_m or t.block_m, ROWS=rows, num_warps=t.warps)


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _query_blocks(h: int, w: int, programs: int):
    """The grid of a kernel whose programs own query blocks, for each (image, head): a function
    of the compile-time values, since ``launch``'s rungs may halve BLOCK_M. A window's blocks
    are tiles of BLOCK_M // WP image rows of WP columns (triton_parts._query_tile)."""

    def grid(m: dict) -> tuple[int, int]:
        if m["WINDOW"]:
            return triton.cdiv(h, m["BLOCK_M"] // m["WP"]) * triton.cdiv(w, m["WP"]), programs
        return triton.cdiv(h * w, m["BLOCK_M"]), programs

    return grid


def _key_blocks(h: int, w: int, shift: int, programs: int):
    """The grid of the dK/dV kernel: blocks of ROWS image rows, or a window's ROWS x WP blocks
    on the grid from (-shift, -shift) that touch the image (_bwd_dkdv)."""

    def grid(m: dict) -> tuple[int, int]:
        rows, wp = m["ROWS"], m["WP"]
        if m["WINDOW"]:
            down = triton.cdiv(h + shift, rows) - shift // rows
            return down * (triton.cdiv(w + shift, wp) - shift // wp), programs
        return triton.cdiv(h, rows), programs

    return grid


def device_values(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device`` without a host-device synchronization: a CUDA
    tensor made from a list is a copy from pageable memory, which waits for every kernel queued
    before it (once a layer call, the GPU idle while Python catches up); a fill per value is a
    kernel like the others."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    out = torch.empty(len(values), dtype=dtype, device=device)
    for j, x in enumerate(values):
        out[j].fill_(x)  # fill_(a Python number): the value a kernel argument, no host tensor
    return out


def forward_values(q, v, h, w, scale, p, seed, per_image, block_m, window=0):
    """What the forward's and the backward's launches share: the forward's compile-time values
    (its tile), the shared ones (``_meta``), the scalars and the sizes; ``forward_launch``'s."""
    nh, t, dk = q.shape[1:]
    dv = v.shape[-1]
    meta = _meta(q, h, w, window)
    meta.update(DKP=pow2(dk, 16), DVP=pow2(dv, 16), DROP=p > 0, PER_IMAGE=per_image)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    rng = device_values([seed, drop_threshold(p)], torch.int64, q.device)
    scalars = (rng, device_values([scale, 1.0 / (1.0 - p)], acc, q.device))
    fmeta = _tiled(_fwd, meta, q.dtype, block_m)
    tile = (fmeta["BLOCK_M"], fmeta["ROWS"] * fmeta["WP"], fmeta["WP"])
    shift = triton_tiles.window_shift(h, w, window, *tile) if window else 0  # its key grid
    sizes = (nh, t, h, w, dk, dv, scale, 1.0 / (1.0 - p), window, (window - 1) // 2, shift)
    return fmeta, meta, scalars, sizes


def forward_launch(q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, window=0):
    """The forward kernel's (grid, arguments, compile-time values) and its outputs (y, stats,
    scalars): what ``_TritonAxis`` launches and ``triton_compile`` compiles for a GPU.
    ``window``: k for SASA's k x k window (triton_local.py; q_axis then holds each query's
    [Rq | Cq]). ``scalars``: the tensors [seed, threshold] (int64) and [scale, 1 / (1 - p)] in
    the accumulation dtype, which the float64 kernels read: a Python float reaches a compiled
    kernel as fp32 (the interpreter keeps it float64, so only a GPU would show it); the others
    take the floats, kernel parameters that cost no registers."""
    b, nh, t, _ = q.shape
    values = forward_values(q, v, h, w, scale, p, seed, per_image, block_m, window)
    fmeta, meta, scalars, sizes = values
    # (B, T, Nh, Dv) in q's dtype; the backward reads the saved m and 1 / l, never Y
    y = torch.empty(b, t, nh, v.shape[-1], dtype=q.dtype, device=q.device)
    stats = torch.empty(2, b, nh, t, dtype=scalars[1].dtype, device=q.device)  # m, 1 / l
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(q_axis), *_strides(y))
    args = (q, k, v, q_axis, y, stats, *scalars, *strides, *sizes)
    return (_query_blocks(h, w, b * nh), args, fmeta), (y, stats, scalars, sizes, meta)


def backward_launches(q, k, v, q_axis, stats, scalars, dy, sizes, meta, block_m=None):
    """The backward's launches in order, each (kernel, grid, arguments, compile-time values:
    the forward's block shape, each kernel its own num_warps): the dQ kernel's delta pass
    (rowsum(P o dP) into delta), dQ / dR / dC, dK / dV; and the gradients they write (dq, dk,
    dv, d q_axis), in the accumulation dtype; ``meta``: the forward's shared values
    (``forward_launch``)."""
    b, nh, t, dk = q.shape
    h, w, dv = sizes[2], sizes[3], v.shape[-1]
    acc = stats.dtype
    delta = torch.empty(b, nh, t, dtype=acc, device=q.device)  # the delta pass's
    dq = torch.empty(b, nh, t, dk, dtype=acc, device=q.device)
    ks = sizes[8]  # the window's side, 0: the axis logits; a window's offsets off the image
    na = window_logits(ks, w) if ks else h + w  # get no key: zero
    dqa = (torch.zeros if ks else torch.empty)(b, nh, t, na, dtype=acc, device=q.device)
    dk_ = torch.empty(b, nh, t, dk, dtype=acc, device=q.device)
    dv_ = torch.empty(b, nh, t, dv, dtype=acc, device=q.device)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(q_axis), *_strides(dy))
    common = (q, k, v, q_axis, dy, stats, delta)
    dq_meta, kv_meta = (_tiled(f, meta, q.dtype, block_m) for f in (_bwd_dq, _bwd_dkdv))
    dq_args = (*common, dq, dqa, *scalars)
    launches = [
        (_bwd_dq, _query_blocks(h, w, b * nh), dq_args, dict(dq_meta, DELTA_PASS=True)),
        (_bwd_dq, _query_blocks(h, w, b * nh), dq_args, dict(dq_meta, DELTA_PASS=False)),
        (_bwd_dkdv, _key_blocks(h, w, sizes[10], b * nh), (*common, dk_, dv_, *scalars), kv_meta),
    ]
    launches = [(f, g, (*a, *strides, *sizes), m) for f, g, a, m in launches]
    return launches, (dq, dk_, dv_, dqa)


def run_forward(q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, window, bh):
    """The forward kernel on q, k, v, q_axis (B|1, Nh|1, T, d) each, read at stride 0 over what
    the batch or the heads share (bh = (B, Nh)): y (B, T, Nh, dv), the rows' stats and the
    query block it ran with (``launch``), which the backward takes."""
    full = (x.expand(*bh, *x.shape[2:]) for x in (q, k, v, q_axis))
    launched = forward_launch(*full, h, w, scale, p, seed, per_image, block_m, window)
    (grid, args, meta), (y, stats, *_) = launched
    return y, stats, launch(_fwd, grid, args, meta)


def run_backward(dy, q, k, v, q_axis, stats, block, h, w, scale, p, seed, per_image, block_m,
                 window, bh):  # fmt: skip
    """The backward kernels at the forward's query ``block`` (a smaller one only where their
    own shared memory forces it: other product shapes would round the logits otherwise): dq,
    dk, dv and d q_axis (B, Nh, T, .) in the accumulation dtype, a window's as [dRq | dCq]."""
    full = [x.expand(*bh, *x.shape[2:]) for x in (q, k, v, q_axis)]
    values = forward_values(full[0], full[2], h, w, scale, p, seed, per_image, block_m, window)
    _, meta, scalars, sizes = values
    launches, (dq, dk, dv, dqa) = backward_launches(*full, stats, scalars, dy, sizes, meta, block)
    (fd, gd, ad, md), (fq, gq, aq, mq), kv = launches
    block = launch(fd, gd, ad, md)  # delta, then dQ at its block: P rounded alike in both
    got = launch(fq, gq, aq, dict(mq, BLOCK_M=block))
    if got < block:  # the dQ pass's shared memory forced a smaller block: both again at it
        dqa.zero_()  # (a window's partial row-logit slots are per tile)
        launch(fd, gd, ad, dict(md, BLOCK_M=got))
        launch(fq, gq, aq, dict(mq, BLOCK_M=got))
    launch(*kv)
    return dq, dk, dv, window_dqa(dqa, window) if window else dqa  # a window's partials added


class _TritonAxis(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, window, bh):
        ctx.args = (h, w, scale, p, seed, per_image, block_m, window, bh)
        y, stats, ctx.block = run_forward(q, k, v, q_axis, *ctx.args)
        ctx.save_for_backward(q, k, v, q_axis, stats)
        return y

    @staticmethod
    @once_differentiable
    @backward_without_autocast
    def backward(ctx, dy):
        *xs, stats = ctx.saved_tensors
        dy = dy.to(xs[0].dtype).contiguous()
        grads = run_backward(dy, *xs, stats, ctx.block, *ctx.args)
        needs = ctx.needs_input_grad[:4]
        grads = (shared_sum(g, x) if n else None for g, x, n in zip(grads, xs, needs))
        return (*grads, None, None, None, None, None, None, None, None, None)


def attention(q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, window=0, bh=None):
    """The kernels on (B|1, Nh|1, T, d) inputs, ready (shared, cast, autocast off), bh = (B, Nh)
    (default: the inputs' largest): the autograd Function eagerly; while torch.compile traces,
    the custom op ``attnconv::triton_axis`` (triton_ops.py; a seed drawn in the graph)."""
    bh = list(bh or (max(x.shape[d] for x in (q, k, v, q_axis)) for d in (0, 1)))
    if compiling():
        seed = seed_tensor(0 if seed is None and p == 0 else seed)
        args = (h, w, scale, p, seed, per_image, block_m, window, bh)
        return torch.ops.attnconv.triton_axis(q, k, v, q_axis, *args)[0]
    seed = (dropout_seed() if p > 0 else 0) if seed is None else int(seed)
    args = (h, w, scale, p, seed, per_image, block_m, window, bh)
    return _TritonAxis.apply(q, k, v, q_axis, *args)


def axis_attention_triton(
    q, k, v, q_axis, h, w, scale, p=0.0, per_image=True, seed=None, block_m=None
):
    """q, k (B, Nh, T, dk), v (B, Nh, T, dv) (the batch or the heads may share one: stride 0),
    q_axis (B|1, Nh, T, H + W) -> (B, T, Nh, dv) in q's dtype (bfloat16/float16/float32/
    float64); the logits q_axis in float32 at least; attention dropout p with the links of
    ``dropped_links(Nh, T, B if per_image else None, p, seed=seed)`` (seed: drawn from the
    default generator when None). First derivative only."""
    if any(x.dim() != 4 for x in (q, k, v, q_axis)):
        raise _bad_shapes("q, k, v, q_axis must be 4-D (B, Nh, T, columns)", q, k, v, q_axis)
    t = q.shape[2]
    b, nh = (max(x.shape[d] for x in (q, k, v, q_axis)) for d in (0, 1))
    if any(x.shape[d] not in (1, n) for x in (q, k, v, q_axis) for d, n in ((0, b), (1, nh))):
        raise _bad_shapes("q, k, v, q_axis: batch and heads must be 1 or alike", q, k, v, q_axis)
    if q_axis.shape[-2:] != (h * w, h + w) or t != h * w:
        raise ValueError(f"q_axis {tuple(q_axis.shape)} must be (B, Nh, T={h * w}, H+W={h + w})")
    if k.shape[-2:] != q.shape[-2:] or v.shape[-2] != t:
        raise _bad_shapes("q, k (B, Nh, T, dk) and v (B, Nh, T, dv) must agree", q, k, v)
    why = unsupported(q, v, h, w)
    if why:
        raise RuntimeError(f"attnconv: {why}")
    dts = (q.dtype,) * 3 + (torch.promote_types(q.dtype, torch.float32),)
    # what the heads or the batch share (value="identity", one query set for the batch) is
    # cast once, not per head, and its gradient summed in the accumulation dtype
    q, k, v, q_axis = (shared(x, dt) for x, dt in zip((q, k, v, q_axis), dts))
    q, k, v, q_axis = first_order_only("the Triton axis attention", q, k, v, q_axis)
    with no_autocast(q.device.type):
        return attention(q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, 0, (b, nh))
