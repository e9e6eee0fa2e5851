"""Model sizes checked before anything is allocated (a crafted config or checkpoint declaring
``hidden_size=10**9``, ``max_size=10**9`` or 10^5 layers must be refused in seconds, not after
gigabytes or minutes).

``probe_bytes(name, kwargs, max_bytes)`` builds the model on the meta device (shapes only, no
memory) while global registration hooks count every parameter's and buffer's bytes and every
submodule as they are registered: past ``max_bytes`` or ``MAX_MODULES`` the build stops at once
with one ValueError, so even a 10^7-layer declaration is refused after its first MAX_MODULES
modules.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

MAX_MODULES = 5_000  # the largest model here has ~1,300 (a converted ResNet-152)


@contextlib.contextmanager
def construction_budget(max_bytes: int, what: str, max_modules: int = MAX_MODULES):
    """Count the bytes of parameters and buffers and the submodules registered inside the
    block; ValueError naming ``what`` as soon as either exceeds its bound."""
    seen = {"bytes": 0, "modules": 0}

    def on_tensor(module: nn.Module, name: str, t: torch.Tensor | None):
        if t is not None:
            seen["bytes"] += t.numel() * t.element_size()
            if seen["bytes"] > max_bytes:
                raise ValueError(
                    f"{what} declares more than {max_bytes / 2**30:.2f} GiB of parameters "
                    f"(reached with {name!r} of shape {tuple(t.shape)})"
                )

    def on_module(module: nn.Module, name: str, sub: nn.Module | None):
        seen["modules"] += 1
        if seen["modules"] > max_modules:
            raise ValueError(f"{what} declares more than {max_modules} modules")

    hooks = [
        register_module_parameter_registration_hook(on_tensor),
        register_module_buffer_registration_hook(on_tensor),
        register_module_module_registration_hook(on_module),
    ]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def probe_bytes(name: str, kwargs: dict, max_bytes: int, what: str) -> int:
    """Bytes of ``create_model(name, **kwargs)``'s parameters and buffers, measured on the meta
    device under ``construction_budget`` (nothing allocated); ValueError past the bounds."""
    from .registry import create_model

    with torch.device("meta"), construction_budget(max_bytes, what) as seen:
        create_model(name, **kwargs)
    return seen["bytes"]


def training_bytes(
    name: str, kwargs: dict, batch: int, state_per_param: int, max_bytes: int, what: str
) -> int:
    """A lower bound on the bytes one training step of ``create_model(name, **kwargs)`` holds at
    ``batch``, measured on the meta device before anything is allocated: the parameters, their
    gradients and ``state_per_param`` optimizer tensors each (SGD momentum 1, AdamW 2), and each
    attention layer's output (B, T, Nh, Dv), which every kernel stores for the output
    projection's backward (T from the model's img_size / downsample, where it declares them).
    ValueError in one line past ``max_bytes``; the bytes otherwise."""
    from ..layers.mhsa2d import MultiHeadSelfAttention2d
    from .registry import create_model

    with torch.device("meta"), construction_budget(max_bytes, what) as seen:
        model = create_model(name, **kwargs)
    params = seen["bytes"] * (2 + state_per_param)
    cfg = getattr(model, "cfg", None)
    tokens = (cfg.img_size // cfg.downsample) ** 2 if hasattr(cfg, "downsample") else 0
    acts = sum(
        batch * tokens * m.num_heads * m.head_dim * 4
        for m in model.modules()
        if isinstance(m, MultiHeadSelfAttention2d)
    )
    if params + acts > max_bytes:
        raise ValueError(
            f"{what} needs at least {(params + acts) / 2**30:.1f} GiB to train at batch {batch} "
            f"(parameters, gradients and optimizer state {params / 2**30:.1f} GiB, attention "
            f"outputs {acts / 2**30:.1f} GiB); the bound here is {max_bytes / 2**30:.1f} GiB"
        )
    return params + acts
