"""``export_model``: an attnconv model as a ``torch.export`` program for inference.

Under ``torch.export`` every attention layer takes kernels of plain torch ops (``plan.tracing``:
no C++ kernel, no Python loop over blocks, no custom op), so the program runs wherever torch
runs and saves with ``torch.export.save``. The batch is dynamic; the image size (and a
sequence's length) is the example's: the positional tables and a converted convolution's
geometry are specialised to it. What cannot export is one line (``ExportUnsupported``), never
the tracer's output: a layer option refused before tracing (``blocker``), or the tracer's own
failure, its first line (the rest stays on the exception's ``__cause__``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

# backend -> why a model with a layer on it does not export
BLOCKERS = {"triton": "its Triton kernels run outside traced graphs"}
# the tracer's own errors (a layer's ValueError about its input stays one)
TRACER_MODULES = ("torch._dynamo", "torch._export", "torch.export", "torch.fx", "torch._subclasses")


class ExportUnsupported(RuntimeError):
    """A model, or an option of one, that ``torch.export`` cannot trace (one line)."""


def blocker(model: nn.Module) -> str | None:
    """The first layer option of ``model`` that cannot export, in one line naming it, or None."""
    for name, m in model.named_modules():
        backend = getattr(m, "backend", None) if hasattr(m, "BACKENDS") else None
        if backend in BLOCKERS:
            where = f" (layer {name})" if name else ""
            return f"backend={backend!r}{where} does not export: {BLOCKERS[backend]}"
    return None


def _tracer_error(error: BaseException) -> bool:
    return type(error).__module__.startswith(TRACER_MODULES)


def export_model(
    model: nn.Module, *example: torch.Tensor, dynamic_batch: bool = True
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``model`` in eval mode (its mode is restored after).

    Args:
        model: any attnconv model or layer (a converted CNN included), or a module holding one.
        *example: the forward's tensor arguments at the size the program serves (the batch
            aside).
        dynamic_batch: dimension 0 of every example is one symbolic batch (any size >= 1);
            False: the example's batch too is fixed.

    Returns:
        The ``ExportedProgram``; ``.module()(x)`` runs it, ``torch.export.save`` writes it.

    Raises:
        ExportUnsupported: one line, for a layer option that cannot export (``blocker``) or a
            model the tracer refuses (its first line; the full error is the ``__cause__``).
    """
    name = type(model).__name__
    why = blocker(model)
    if why is not None:
        raise ExportUnsupported(f"attnconv: {name} cannot export: {why}")
    if not example or not all(isinstance(x, torch.Tensor) for x in example):
        raise ExportUnsupported(f"attnconv: export_model({name}, ...) needs example tensors")
    shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1)
        shapes = tuple({0: batch} for _ in example)
    training = model.training
    model.eval()
    try:
        return torch.export.export(model, tuple(example), dynamic_shapes=shapes)
    except Exception as e:
        if not _tracer_error(e):
            raise
        first = (str(e).strip().splitlines() or [""])[0][:200]
        msg = f"attnconv: {name} cannot export ({type(e).__name__}: {first})"
        raise ExportUnsupported(msg) from e
    finally:
        model.train(training)
