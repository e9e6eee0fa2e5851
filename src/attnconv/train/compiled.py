"""``train.compile``: the model under ``torch.compile``, or eager with one line saying why.

Every layer's kernels trace (layers/kernels/ops.py: the C++ and Python kernels as custom ops;
triton_ops.py: the Triton kernels), so every recipe compiles, but for one layer option, refused
before the first step with one line naming it (``blocker``): ``backend="flex"`` training on a
CPU (Inductor has no CPU backward for FlexAttention). A compile that fails all the same (no C++
compiler for Inductor, a bug of the compiler) is caught at the step it fails
(``compile_failed``): one line, the run goes on eager, and the compiler's output never reaches
the screen.
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn

log = logging.getLogger(__name__)

# backend -> why a model with a layer on it does not compile (None: only on some devices)
BLOCKERS = {
    "flex": "Inductor has no CPU backward for FlexAttention",
}


def blocker(model: nn.Module, device: torch.device) -> str | None:
    """The first layer option of ``model`` that cannot compile for training on ``device``, in one
    line naming it, or None."""
    for name, m in model.named_modules():
        backend = getattr(m, "backend", None) if hasattr(m, "BACKENDS") else None
        if backend == "flex" and device.type != "cpu":
            continue
        if backend in BLOCKERS:
            where = f" (layer {name})" if name else ""
            return f"backend={backend!r}{where} does not compile: {BLOCKERS[backend]}"
    return None


def compile_net(net: nn.Module, model: nn.Module, device: torch.device) -> nn.Module:
    """``torch.compile(net)``, or ``net`` itself with one warning line when ``model`` has an
    option that cannot compile (``blocker``)."""
    why = blocker(model, device)
    if why is not None:
        log.warning("train.compile: %s; training eager", why)
        return net
    return torch.compile(net)


def compile_failed(error: BaseException) -> bool:
    """Whether ``error`` is the compiler's own (Dynamo, AOTAutograd, Inductor), not the model's:
    a ValueError of a layer's check stays one."""
    module = type(error).__module__
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))


def say_failed(error: BaseException) -> None:
    """The one line a failed compile leaves on the screen."""
    text = str(error).strip()
    first = text.splitlines()[0][:160] if text else ""
    log.warning("train.compile failed (%s: %s); training eager", type(error).__name__, first)
