"""The kernels as ``torch.library`` custom ops: what a ``torch.compile``'d forward calls.

Eager runs each kernel's autograd Function as before (fused.py, window.py, shared_position.py,
dropout.py; no dispatcher in the way). While torch.compile traces (``first_order.compiling``)
the same kernels are called through these ops, each with a fake (the shapes, dtypes and strides
the kernel returns) and its backward, itself an op: Dynamo and AOTAutograd see one opaque call
where they would otherwise meet the extension's C++ functions, a Python loop writing through
``out=`` views, or the int64 counter hash (Inductor's CPU code for it did not compile). A seed is
a 0-dim int64 tensor drawn in the graph (``functional.seed_tensor``): the masks are the eager
ones under one seed.

| op (attnconv::)    | kernel                                     | backward (an op)            |
|--------------------|--------------------------------------------|-----------------------------|
| dropped_links      | functional.dropped_links (bool mask)       | none (no gradient)          |
| dropped_elements   | functional.dropped_elements (bool mask)    | none                        |
| hash_dropout       | dropout.cpp (dropout.py)                   | hash_dropout again          |
| fused_axis         | fused_axis.cpp (fused.py)                  | fused_axis_backward         |
| local_window       | fused_local.cpp, or window.window_forward  | local_window_backward       |
| separable_head_sum | shared_position.head_sum_forward           | separable_head_sum_backward |
| blocked_axis       | blocked._AxisAttention (Python, by blocks) | blocked_axis_backward       |
| blocked_gaussian   | blocked._GaussianAttention                 | blocked_gaussian_backward   |
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from ..functional import drop_threshold, dropped_elements, dropped_links
from ..precision import no_autocast, shared_sum
from . import shared_position, window
from .blocked import _AxisAttention, _column_major_zeros, _GaussianAttention
from .fused import extension


def _op(name: str, schema: str):
    """A custom op ``attnconv::name`` of ``schema`` (written out: the same on torch 2.8-2.13)."""
    return custom_op(f"attnconv::{name}", mutates_args=(), schema=schema)


def _none() -> torch.Tensor:
    """An absent gradient in an op's fixed tuple of outputs (an op returns no None)."""
    return torch.empty(0)


def _present(t: torch.Tensor) -> torch.Tensor | None:
    return None if t.numel() == 0 and t.dim() == 1 else t


# ---- the dropout masks (no gradient) ---------------------------------------------------------
@_op("dropped_links", "(Tensor seed, SymInt nh, SymInt t, SymInt b, bool per_image, float p, "
     "Device device) -> Tensor")  # fmt: skip
def _dropped_links(seed, nh, t, b, per_image, p, device):
    return dropped_links(nh, t, b if per_image else None, p, device, seed=int(seed))


@_dropped_links.register_fake
def _(seed, nh, t, b, per_image, p, device):
    shape = (b, nh, t, t) if per_image else (nh, t, t)
    return torch.empty(shape, dtype=torch.bool, device=device)


@_op("dropped_elements", "(Tensor seed, SymInt n, float p, int offset, Device device) -> Tensor")
def _dropped_elements(seed, n, p, offset, device):
    return dropped_elements(n, p, device, int(seed), offset)


@_dropped_elements.register_fake
def _(seed, n, p, offset, device):
    return torch.empty(n, dtype=torch.bool, device=device)


# ---- hidden dropout (dropout.cpp) ------------------------------------------------------------
@_op("hash_dropout", "(Tensor x, float p, Tensor seed, int offset) -> Tensor")
def hash_dropout(x, p, seed, offset):
    with no_autocast(x.device.type):
        return extension().hash_dropout(x.contiguous(), p, int(seed), drop_threshold(p), offset)


@hash_dropout.register_fake
def _(x, p, seed, offset):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _hash_dropout_setup(ctx, inputs, output):
    _, ctx.p, seed, ctx.offset = inputs
    ctx.save_for_backward(seed)


def _hash_dropout_backward(ctx, dy):  # dx = dy o M / (1 - p), M redrawn from the seed
    (seed,) = ctx.saved_tensors
    return hash_dropout(dy, ctx.p, seed, ctx.offset), None, None, None


hash_dropout.register_autograd(_hash_dropout_backward, setup_context=_hash_dropout_setup)


# ---- content attention with axis logits (fused_axis.cpp) ------------------------------------
AXIS_ARGS = "SymInt h, SymInt w, float scale, float p, Tensor seed, bool per_image"


@_op("fused_axis", f"(Tensor q, Tensor k, Tensor v, Tensor q_axis, {AXIS_ARGS}) "
     "-> (Tensor, Tensor, Tensor)")  # fmt: skip
def fused_axis(q, k, v, q_axis, h, w, scale, p, seed, per_image):
    """fused._FusedAxis's forward: y (B, T, Nh, Dv), the rows' max and 1 / sum (B, Nh, T)."""
    full = (*q.shape[:2], *v.shape[2:])  # v may be (B|1, Nh|1, T, dv): shared
    s = int(seed)
    with no_autocast(q.device.type):
        args = (h, w, scale, p, s, drop_threshold(p), per_image)
        y, mx, inv = extension().forward(q, k, v.expand(full), q_axis, *args)
    return y, mx, inv


@fused_axis.register_fake
def _(q, k, v, q_axis, h, w, scale, p, seed, per_image):
    b, nh, t = q.shape[:3]
    y = q_axis.new_empty(b, t, nh, v.shape[-1])
    return y, q_axis.new_empty(b, nh, t), q_axis.new_empty(b, nh, t)


@_op("fused_axis_backward", f"(Tensor dy, Tensor q, Tensor k, Tensor v, Tensor q_axis, "
     f"Tensor mx, Tensor inv, {AXIS_ARGS}) -> (Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
def fused_axis_backward(dy, q, k, v, q_axis, mx, inv, h, w, scale, p, seed, per_image):
    full = (*q.shape[:2], *v.shape[2:])
    args = (h, w, scale, p, int(seed), drop_threshold(p), per_image)
    with no_autocast(q.device.type):
        dq, dk, dv, dqa = extension().backward(dy, q, k, v.expand(full), q_axis, mx, inv, *args)
    return dq, dk, dv, dqa


@fused_axis_backward.register_fake
def _(dy, q, k, v, q_axis, mx, inv, h, w, scale, p, seed, per_image):
    b, nh, t, dk = q.shape
    dv = v.shape[-1]
    return (  # the layouts the kernel writes (fused_axis.cpp)
        q_axis.new_empty(b, t, nh, dk).transpose(1, 2),
        q_axis.new_empty(b, nh, dk, t).transpose(2, 3),
        q_axis.new_empty(b, nh, dv, t).transpose(2, 3),
        q_axis.new_empty(b, nh, t, h + w),
    )


def _fused_axis_setup(ctx, inputs, output):
    q, k, v, q_axis, h, w, scale, p, seed, ctx.per_image = inputs
    ctx.args = (h, w, scale, p)
    ctx.save_for_backward(q, k, v, q_axis, output[1], output[2], seed)


def _fused_axis_bw(ctx, dy, _dmx, _dinv):
    q, k, v, q_axis, mx, inv, seed = ctx.saved_tensors
    dy = dy.to(q.dtype).contiguous()
    args = (*ctx.args, seed, ctx.per_image)
    dq, dk, dv, dqa = fused_axis_backward(dy, q, k, v, q_axis, mx, inv, *args)
    # summed over what v shares in q_axis's dtype, rounded once (as fused._FusedAxis)
    return dq.to(q.dtype), dk.to(k.dtype), shared_sum(dv, v), dqa, *(None,) * 6


fused_axis.register_autograd(_fused_axis_bw, setup_context=_fused_axis_setup)


# ---- SASA's window attention (fused_local.cpp, or window.py's Python kernel) -----------------
@_op("local_window", "(Tensor q, Tensor? k, Tensor v, Tensor? mix, Tensor? qr_row, "
     "Tensor? qr_col, Tensor? valid, int ks, bool fused) -> (Tensor, Tensor)")  # fmt: skip
def local_window(q, k, v, mix, qr_row, qr_col, valid, ks, fused):
    """y (B, nh, dv, H, W) and the window probabilities (B, nh, k^2, H, W)."""
    with no_autocast(q.device.type), torch.no_grad():
        if fused:
            mask = valid is not None
            return tuple(extension().local_forward(q, k, v, mix, qr_row, qr_col, ks, mask))
        return window.window_forward(q, k, v, mix, qr_row, qr_col, valid, ks)


@local_window.register_fake
def _(q, k, v, mix, qr_row, qr_col, valid, ks, fused):
    b, nh, _, h, w = q.shape
    return q.new_empty(b, nh, v.shape[3], h, w), q.new_empty(b, nh, ks * ks, h, w)


@_op("local_window_backward", "(Tensor gy, Tensor q, Tensor? k, Tensor v, Tensor? mix, "
     "Tensor probs, int ks, bool has_qr, bool fused, bool[] need) "
     "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
def local_window_backward(gy, q, k, v, mix, probs, ks, has_qr, fused, need):
    """gq, gk, gv, gm, g_row, g_col: an empty (0,) tensor where ``_window_grads`` has none."""
    with no_autocast(q.device.type), torch.no_grad():
        if fused:
            grads = extension().local_backward(gy.contiguous(), q, k, v, mix, probs, ks, has_qr)
        else:
            grads = window.window_backward(gy, q, k, v, mix, probs, ks, has_qr, need)
    keep = _window_grads(k, mix, has_qr, need)
    return tuple(g if on and g is not None else _none() for g, on in zip(grads, keep))


def _window_grads(k, mix, has_qr: bool, need) -> tuple[bool, ...]:
    """Which of gq, gk, gv, gm, g_row, g_col the backward op returns (the fake's rule too)."""
    keys = k is not None
    return keys and need[0], keys and need[1], need[2], mix is not None and need[3], has_qr, has_qr


@local_window_backward.register_fake
def _(gy, q, k, v, mix, probs, ks, has_qr, fused, need):
    b, nh, _, h, w = q.shape
    rel = q.new_empty(b, nh, ks, h, w)
    like = (q, k, v, mix, rel, rel)
    keep = _window_grads(k, mix, has_qr, need)
    return tuple(torch.zeros_like(t) if on else _none() for t, on in zip(like, keep))


def _local_window_setup(ctx, inputs, output):
    q, k, v, mix, qr_row, _, _, ctx.ks, ctx.fused = inputs
    ctx.has_qr = qr_row is not None
    ctx.save_for_backward(q, k, v, mix, output[1])


def _local_window_bw(ctx, gy, _gprobs):
    q, k, v, mix, probs = ctx.saved_tensors
    need = [bool(n) for n in ctx.needs_input_grad[:4]]
    grads = local_window_backward(gy, q, k, v, mix, probs, ctx.ks, ctx.has_qr, ctx.fused, need)
    return (*(_present(g) for g in grads), None, None, None)


local_window.register_autograd(_local_window_bw, setup_context=_local_window_setup)


# ---- position-only separable attention, one head at a time (shared_position.py) --------------
@_op("separable_head_sum", "(Tensor r, Tensor c, Tensor x, Tensor weight, Tensor? bias) -> Tensor")
def separable_head_sum(r, c, x, weight, bias):
    """sum_h (R_h (x) C_h) x_h W_h^T + b -> (H*W*B, Dout) (shared_position.separable_head_sum)."""
    with no_autocast(x.device.type), torch.no_grad():
        return shared_position.head_sum_forward(r, c, x, weight, bias)


@separable_head_sum.register_fake
def _(r, c, x, weight, bias):
    return x.new_empty(x.shape[1] * x.shape[2] * x.shape[3], weight.shape[0])


@_op("separable_head_sum_backward", "(Tensor gy, Tensor r, Tensor c, Tensor x, Tensor weight) "
     "-> (Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
def separable_head_sum_backward(gy, r, c, x, weight):
    with no_autocast(x.device.type), torch.no_grad():
        return shared_position.head_sum_backward(gy.contiguous(), r, c, x, weight)


@separable_head_sum_backward.register_fake
def _(gy, r, c, x, weight):
    return torch.empty_like(r), torch.empty_like(c), torch.empty_like(x), torch.empty_like(weight)


def _head_sum_setup(ctx, inputs, output):
    r, c, x, weight, bias = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(r, c, x, weight)


def _head_sum_bw(ctx, gy):
    gr, gc, gx, gw = separable_head_sum_backward(gy, *ctx.saved_tensors)
    return gr, gc, gx, gw, gy.sum(0) if ctx.has_bias else None


separable_head_sum.register_autograd(_head_sum_bw, setup_context=_head_sum_setup)


# ---- the query-blocked kernels (blocked.py), their Functions' bodies run as they are ----------
class _Ctx:
    """A stand-in for an autograd Function's ctx: what its forward saves, its backward reads."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


@_op("blocked_axis", "(Tensor q, Tensor k, Tensor v, Tensor q_axis, SymInt h, SymInt w, "
     "float scale, int bq) -> (Tensor, Tensor, Tensor)")  # fmt: skip
def blocked_axis(q, k, v, q_axis, h, w, scale, bq):
    """y (B, Nh, T, dv) and the rows' max and 1 / sum (B, Nh, T, 1)."""
    ctx = _Ctx()
    with no_autocast(q.device.type), torch.no_grad():
        y = _AxisAttention.forward(ctx, q, k, v, q_axis, h, w, scale, bq)
    return y, *ctx.saved_tensors[4:]


@blocked_axis.register_fake
def _(q, k, v, q_axis, h, w, scale, bq):
    stats = q.new_empty(*q.shape[:3], 1)
    return q.new_empty(*q.shape[:3], v.shape[-1]), stats, torch.empty_like(stats)


@_op("blocked_axis_backward", "(Tensor dy, Tensor q, Tensor k, Tensor v, Tensor q_axis, "
     "Tensor rmax, Tensor rden, SymInt h, SymInt w, float scale, int bq) "
     "-> (Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
def blocked_axis_backward(dy, q, k, v, q_axis, rmax, rden, h, w, scale, bq):
    ctx = _Ctx(saved_tensors=(q, k, v, q_axis, rmax, rden), hw=(h, w), scale=scale, bq=bq)
    return _AxisAttention.backward(ctx, dy)[:4]


@blocked_axis_backward.register_fake
def _(dy, q, k, v, q_axis, rmax, rden, h, w, scale, bq):
    zeros = torch.zeros_like
    return zeros(q), _column_major_zeros(k), _column_major_zeros(v), zeros(q_axis)


def _blocked_axis_setup(ctx, inputs, output):
    q, k, v, q_axis, *ctx.args = inputs
    ctx.save_for_backward(q, k, v, q_axis, *output[1:])


def _blocked_axis_bw(ctx, dy, _dmax, _dden):
    grads = blocked_axis_backward(dy, *ctx.saved_tensors, *ctx.args)
    return *grads, None, None, None, None


blocked_axis.register_autograd(_blocked_axis_bw, setup_context=_blocked_axis_setup)

GAUSS_IN = "Tensor q, Tensor k, Tensor v, Tensor ctr, Tensor prec, Tensor coords"
GAUSS_ARGS = "float scale, int bq, Tensor? drop, float p_drop"


@_op("blocked_gaussian", f"({GAUSS_IN}, {GAUSS_ARGS}) -> (Tensor, Tensor, Tensor)")
def blocked_gaussian(q, k, v, ctr, prec, coords, scale, bq, drop, p_drop):
    """y (B, Nh, T, dv) and the rows' max and 1 / sum (B, Nh, T, 1)."""
    ctx = _Ctx()
    with no_autocast(q.device.type), torch.no_grad():
        y = _GaussianAttention.forward(ctx, q, k, v, ctr, prec, coords, scale, bq, drop, p_drop)
    return y, *ctx.saved_tensors[6:8]


@blocked_gaussian.register_fake
def _(q, k, v, ctr, prec, coords, scale, bq, drop, p_drop):
    stats = q.new_empty(*q.shape[:3], 1)
    return q.new_empty(*q.shape[:3], v.shape[-1]), stats, torch.empty_like(stats)


@_op("blocked_gaussian_backward", f"(Tensor dy, {GAUSS_IN}, Tensor rmax, Tensor rden, "
     f"{GAUSS_ARGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")  # fmt: skip
def blocked_gaussian_backward(dy, q, k, v, ctr, prec, coords, rmax, rden, scale, bq, drop, p_drop):
    saved = (q, k, v, ctr, prec, coords, rmax, rden, *(() if drop is None else (drop,)))
    ctx = _Ctx(saved_tensors=saved, scale=scale, bq=bq, p_drop=p_drop)
    return _GaussianAttention.backward(ctx, dy)[:5]


@blocked_gaussian_backward.register_fake
def _(dy, q, k, v, ctr, prec, coords, rmax, rden, scale, bq, drop, p_drop):
    cols = _column_major_zeros
    return torch.zeros_like(q), cols(k), cols(v), torch.empty_like(ctr), torch.zeros_like(prec)


def _blocked_gaussian_setup(ctx, inputs, output):
    *tensors, ctx.scale, ctx.bq, drop, ctx.p_drop = inputs
    ctx.has_drop = drop is not None
    ctx.save_for_backward(*tensors, *output[1:], *(() if drop is None else (drop,)))


def _blocked_gaussian_bw(ctx, dy, _dmax, _dden):
    *saved, drop = ctx.saved_tensors if ctx.has_drop else (*ctx.saved_tensors, None)
    args = (ctx.scale, ctx.bq, drop, ctx.p_drop)
    grads = blocked_gaussian_backward(dy, *saved, *args)
    return *grads, *(None,) * 5  # coords, scale, bq, drop, p_drop


blocked_gaussian.register_autograd(_blocked_gaussian_bw, setup_context=_blocked_gaussian_setup)
