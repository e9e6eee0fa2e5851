"""How close is a converted model to the original: per layer on real activations, end to end
on a test set, and Lemma 2's error against alpha. Used by ``attnconv convert`` and the bench."""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
import torch.nn as nn

from .model import unconverted_layers
from .modules import ConvAttention, conv_to_attention


@torch.no_grad()
def layer_report(
    model: nn.Module, converted: nn.Module, images: torch.Tensor
) -> list[dict[str, object]]:
    """Run ``images`` through the original model, capture every conv's input and output, and
    compare each conv with its converted module on that same real input.

    One dict per converted conv: name, kernel, stride, heads, head_dim, hard, max_abs_diff,
    max_abs_out (a conv ``convert_model(..., on_unsupported="keep")`` left as it was has none:
    ``unconverted_layers`` lists it).
    """
    kept = {path for path, _, _ in unconverted_layers(converted)}
    convs = {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, (nn.Conv1d, nn.Conv2d)) and not isinstance(m, ConvAttention)
    }
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(name: str):
        def fn(module, inputs, output) -> None:  # returns None: the output is left unchanged
            seen.setdefault(name, (inputs[0], output))

        return fn

    hooks = [m.register_forward_hook(hook(n)) for n, m in convs.items()]
    try:
        model(images)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for name in convs:
        if name not in seen or name in kept:
            continue  # a conv the forward never calls, or one left unconverted
        att = converted.get_submodule(name)
        if not isinstance(att, ConvAttention):
            raise TypeError(f"{name}: expected a ConvAttention module, got {type(att).__name__}")
        x, ref = seen[name]
        y = att(x)
        g = att.geometry
        rows.append(
            {
                "name": name,
                "kernel": list(g.kernel) if g.ndim == 2 else [g.kernel[1]],
                "stride": list(g.stride) if g.ndim == 2 else [g.stride[1]],
                "in_channels": g.in_channels,
                "out_channels": g.out_channels,
                "heads": att.attention.num_heads,
                "head_dim": att.attention.head_dim,
                "hard": att.hard,
                "rank_error": att.rank_error,
                "max_abs_diff": (y - ref).abs().max().item(),
                "max_abs_out": ref.abs().max().item(),
            }
        )
    return rows


@torch.no_grad()
def compare_predictions(
    model: nn.Module, converted: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, float | int]:
    """Accuracy of both models, the number of images whose predicted class differs, the largest
    logit difference, and the time each model took (seconds) over the same batches."""
    n = correct_a = correct_b = differ = 0
    max_diff, t_a, t_b = 0.0, 0.0, 0.0
    for x, y in batches:
        t0 = time.perf_counter()
        la = model(x)
        t1 = time.perf_counter()
        lb = converted(x)
        t_b += time.perf_counter() - t1
        t_a += t1 - t0
        pa, pb = la.argmax(-1), lb.argmax(-1)
        correct_a += (pa == y).sum().item()
        correct_b += (pb == y).sum().item()
        differ += (pa != pb).sum().item()
        max_diff = max(max_diff, (la - lb).abs().max().item())
        n += len(y)
    if n == 0:
        raise ValueError("no images to compare")
    return {
        "images": n,
        "accuracy_before": correct_a / n,
        "accuracy_after": correct_b / n,
        "predictions_differ": differ,
        "max_abs_logit_diff": max_diff,
        "seconds_before": t_a,
        "seconds_after": t_b,
    }


@torch.no_grad()
def lemma2_sweep(
    conv: nn.Module, x: torch.Tensor, alphas: Iterable[float], backend: str | None = None
) -> list[dict[str, float]]:
    """Lemma 2: the soft conversion's output error against alpha (max abs and relative to
    max|conv(x)|), the hard limit as the last row (alpha = inf)."""
    ref = conv(x)
    scale = ref.abs().max().item()
    rows = []
    for a in list(alphas) + [None]:
        y = conv_to_attention(conv, alpha=a, backend=backend)(x)
        err = (y - ref).abs().max().item()
        rows.append(
            {
                "alpha": float("inf") if a is None else float(a),
                "max_abs_err": err,
                "rel_err": err / scale,
            }
        )
    return rows
