"""The attention kernels of MultiHeadSelfAttention2d, each a plain function of one signature
``(q, k, v, term, grid, scale, *, p_drop)`` with its ``probs`` for ``return_attention``
(``(q, k, v, term, grid, scale)`` -> (B|1, Nh, T, T), before dropout); plan.py picks one.

``layout``: "tokens" kernels read q, k, v (B, Nh, T, d) and return (B, T, Nh, Dv);
"head_major" ones read v (Nh|1, D, H, B, W) (separable.head_major) and return (Nh, D, H, B, W);
"projected" ones (forward_tokens' (H, W, B, C) tokens) read v (Nh|1, H, W, B, Dv) and the output
projection and return (H, W, B, Cout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from . import content, ops, position, shared_position, triton_axis, triton_ops
from .plan import Case, choose


class Kernel(NamedTuple):
    run: Callable
    probs: Callable
    layout: str = "tokens"


KERNELS = {
    "reference": Kernel(position.reference, position.reference_probs),
    "shift": Kernel(position.shift, position.shift_probs, "head_major"),
    "separable_tokens": Kernel(
        shared_position.separable_projected, position.separable_probs, "projected"
    ),
    "separable": Kernel(position.separable, position.separable_probs, "head_major"),
    "shared": Kernel(position.shared, position.shared_probs),
    "triton": Kernel(content.triton, content.content_probs),
    "fused": Kernel(content.fused, content.content_probs),
    "dense_dropout": Kernel(content.dense_dropout, content.content_probs),
    "flex_gaussian": Kernel(content.flex_gaussian, content.content_probs),
    "flex": Kernel(content.flex, content.content_probs),
    "shared_bias": Kernel(content.shared_bias, content.content_probs),
    "blocked": Kernel(content.blocked, content.content_probs),
    "blocked_gaussian": Kernel(content.blocked_gaussian, content.content_probs),
    "fold": Kernel(content.fold, content.content_probs),
}

__all__ = ["Case", "KERNELS", "Kernel", "choose", "ops", "triton_ops"]  # the custom ops (compile)


def backend_off_device(backend: str | None, device) -> str | None:
    """One line when ``backend`` runs on no layer on ``device`` (the Triton kernels need CUDA, or
    ``TRITON_INTERPRET=1``), saying what runs instead; None when it can run there."""
    dev = torch.device(device).type
    if backend != "triton" or dev == "cuda" or triton_axis.interpreted():
        return None
    return (
        f"model.backend='triton': the Triton kernels run on CUDA, not {dev}; every attention "
        f"layer runs the kernel the plan picks on {dev} instead, as with model.backend unset "
        "(the same results)"
    )
