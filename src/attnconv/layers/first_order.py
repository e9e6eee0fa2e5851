"""Kernels with a first derivative only say so in one line, never a raw PyTorch error.

PyTorch's fused attention kernel (``F.scaled_dot_product_attention``, our ``backend="sdpa"``) has no
second derivative: a double backward through it (``create_graph=True``, e.g. a gradient
penalty) fails deep in autograd with "derivative ... not implemented". :func:`first_order_only`
passes its inputs through a node whose backward, when a graph of the gradient is being built,
raises :class:`HigherOrderGradError` naming the fix (``backend="reference"``, the plain path, is
differentiable any number of times).

Our kernels' autograd Functions are also not transform-aware (``torch.func``'s grad, vmap, jacrev
need every Function written for them, forward-mode AD a ``jvp``): :func:`transforms_active`
tells the plan (kernels/plan.py) and the attention function to run the plain equations then.
"""

from __future__ import annotations

import torch


class HigherOrderGradError(RuntimeError):
    """A second derivative through a kernel that only has a first one."""


MESSAGE = (
    "attnconv: {what} has no second derivative (backward with create_graph=True); build the "
    "layer with backend='reference' (the plain path) for double backward, e.g. gradient penalties"
)


class _FirstOrderOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, what: str, *xs: torch.Tensor):
        ctx.what = what
        ctx.set_materialize_grads(False)
        out = tuple(x.view_as(x) for x in xs)
        # an input without a gradient stays so: the kernel's Function then computes none for it
        ctx.mark_non_differentiable(*(o for o, x in zip(out, xs) if not x.requires_grad))
        return out

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():  # the caller asked for a differentiable gradient
            raise HigherOrderGradError(MESSAGE.format(what=ctx.what))
        return (None, *grads)


def transforms_active() -> bool:
    """A ``torch.func`` transform (grad, vmap, jacrev, jvp, functionalize) wraps this call, the
    condition under which torch refuses an autograd Function without ``setup_context``, or a
    forward-mode AD level is open (``torch.autograd.forward_ad.dual_level``: our Functions have
    no ``jvp``)."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    dual_level = getattr(torch.autograd.forward_ad, "_current_level", -1)
    return bool(active and active()) or dual_level >= 0


def compiling() -> bool:
    """``torch.compile`` traces this call (not ``torch.export``): the kernels then run as the
    custom ops of kernels/ops.py, which Dynamo and AOTAutograd trace through (an export keeps
    the plain torch paths it always took)."""
    return torch.compiler.is_compiling() and not exporting()


def exporting() -> bool:
    """``torch.export`` traces this call: ``torch.compiler.is_exporting()`` read from its flag,
    since torch 2.8's Dynamo answers that call with True under ``torch.compile`` too (every
    kernel would then take its export path there: graph breaks)."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


def first_order_only(what: str, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``xs`` unchanged (views); a double backward through them raises HigherOrderGradError.
    A no-op when no gradient is recorded (inference, export, compile)."""
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    if tracing or not torch.is_grad_enabled() or not any(x.requires_grad for x in xs):
        return xs
    return _FirstOrderOnly.apply(what, *xs)
