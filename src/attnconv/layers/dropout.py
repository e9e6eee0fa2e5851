"""Hidden dropout with a counter-hash mask: ``nn.Dropout``'s distribution (each element zeroed
with probability p independently, the rest scaled by 1 / (1 - p)), with the mask a pure function
of one seed drawn from the default generator and the element's index (``functional.
dropped_elements``, the hash of the attention dropout's links).

On CPU the fused kernel (kernels/dropout.cpp) draws the mask and scales in one vectorized pass,
and backward redraws it from the seed: no mask is stored, and no ``bernoulli_``, which draws its
numbers one at a time on CPU (far slower, and a large share of the paper model's CPU training
step: docs/benchmarks.md, "Figures behind the code's comments"). Without a
compiler the plain equations, ``hash_dropout_reference``, draw the same mask. ``hash_dropout``
hashes on every device; the module ``HashDropout`` runs torch's own fused dropout off the CPU
(on CUDA the hash's dozen integer passes would cost more than the whole dropout), so its masks
there are torch's stream, as ``nn.Dropout``'s.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .first_order import compiling
from .functional import drop_threshold, dropout_seed, dropped_elements, seed_tensor
from .kernels import fused, plan

__all__ = ["HashDropout", "hash_dropout", "hash_dropout_reference"]


def hash_dropout_reference(x: torch.Tensor, p: float, seed, offset: int = 0) -> torch.Tensor:
    """The plain equations: x o keep / (1 - p), keep = not ``dropped_elements`` (counters from
    ``offset``), computed in the opmath type (float32 for bfloat16 / float16 inputs) and rounded
    once, as the kernel does."""
    dropped = dropped_elements(x.numel(), p, x.device, seed, offset).view(x.shape)
    acc = torch.promote_types(x.dtype, torch.float32)
    # x * 0 as nn.Dropout (NaN stays NaN); the scale a Python number (a CUDA tensor made from
    # one is a synchronizing copy)
    return (x.to(acc) * (~dropped).to(acc) * (1.0 / (1.0 - p))).to(x.dtype)


class _HashDropout(torch.autograd.Function):
    """y = x o M / (1 - p); dx = dy o M / (1 - p) with M redrawn from the seed (any order of
    derivative: backward is this function again)."""

    @staticmethod
    def forward(ctx, x, p: float, seed: int, offset: int):
        ctx.args = (p, seed, offset)
        return fused.extension().hash_dropout(x.contiguous(), p, seed, drop_threshold(p), offset)

    @staticmethod
    def backward(ctx, dy):
        return _HashDropout.apply(dy, *ctx.args), None, None, None


def hash_dropout(
    x: torch.Tensor, p: float, training: bool = True, seed: int | None = None, offset: int = 0
) -> torch.Tensor:
    """Dropout of x with ``dropped_elements``' mask (seed: drawn from the default generator when
    None; counters from ``offset``). The fused kernel on CPU when it built, the plain equations
    otherwise."""
    kernel = plan.choose(
        plan.DropoutCase(x.device.type, transformed=plan.transforms_active()),
        plan.DROPOUT_TABLE,
    )
    return _dropout(x, p, training, seed, offset, kernel)


def _dropout(x: torch.Tensor, p: float, training: bool, seed: int | None, offset: int, kernel: str):
    """``hash_dropout`` with its kernel chosen (DROPOUT_TABLE's "fused" or "reference")."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if compiling():  # a seed tensor of the graph; the kernel as one custom op (kernels/ops.py)
        seed = seed_tensor(seed)
        if kernel == "fused":
            return torch.ops.attnconv.hash_dropout(x, p, seed, offset)
        return hash_dropout_reference(x, p, seed, offset)
    seed = dropout_seed() if seed is None else seed
    if kernel == "fused":
        return _HashDropout.apply(x, p, seed, offset)
    return hash_dropout_reference(x, p, seed, offset)


class HashDropout(nn.Dropout):
    """A drop-in ``nn.Dropout`` (same p, same distribution, same state dict) whose mask on CPU
    is the counter hash of ``hash_dropout``; torch's own dropout on other devices."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        if inplace:
            raise ValueError("HashDropout does not run in place (inplace=True)")
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = plan.choose(
            plan.DropoutCase(x.device.type, True, plan.transforms_active()), plan.DROPOUT_TABLE
        )
        if kernel == "torch":  # see the module docstring
            return F.dropout(x, self.p, self.training)
        return _dropout(x, self.p, self.training, None, 0, kernel)  # the table chosen once
