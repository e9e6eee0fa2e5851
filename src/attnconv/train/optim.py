"""Optimizers (SGD / AdamW) with weight decay only where it belongs, and the schedules.

Never decayed: the parameters a module lists in its ``no_weight_decay`` attribute (the Gaussian
heads' centres Delta and spreads / precision factors: Cordonnier et al. 2020, sec. 4, "no weight
decay on Delta and alpha", as the reference code does), plus the names in ``optim.no_decay`` (a
parameter's name or a dotted part of names; one that names no parameter is an error).
Norms and biases (parameters with <= 1 dimension) are exempt unless ``optim.decay_1d`` (the
reference code decays them). The learning rate is a pure function of the global step (or, with
``schedule.per_epoch``, of its epoch), so resuming at step s continues the schedule exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import OptimConfig, ScheduleConfig


def never_decayed(model: nn.Module) -> set[int]:
    """ids of the parameters that modules declare in ``no_weight_decay`` (positional geometry)."""
    ids = set()
    for m in model.modules():
        for n in getattr(m, "no_weight_decay", ()):
            ids.add(id(getattr(m, n)))
    return ids


def param_groups(
    model: nn.Module, weight_decay: float, no_decay: list[str], decay_1d: bool = False
) -> list[dict]:
    """Two groups: with decay (weights), without (declared geometry, ``no_decay`` names, and
    norms and biases unless ``decay_1d``)."""
    decay, plain = [], []
    fixed = never_decayed(model)
    params = list(model.named_parameters())
    unmatched = [e for e in no_decay if not any(_names(e, name) for name, _ in params)]
    if unmatched:
        raise ValueError(
            f"optim.no_decay: {', '.join(map(repr, unmatched))} names no parameter of the model "
            "(a name as model.named_parameters() prints it, or a dotted part, e.g. 'rel_row')"
        )
    for name, p in params:
        if not p.requires_grad:
            continue
        named = any(_names(e, name) for e in no_decay)
        if id(p) in fixed or (p.ndim <= 1 and not decay_1d) or named:
            plain.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]


def _names(entry: str, name: str) -> bool:
    """``entry`` is ``name`` or a dotted part of it ("rel_row", "tables.rel_row", "layers.0")."""
    e, parts = entry.split("."), name.split(".")
    return any(parts[i : i + len(e)] == e for i in range(len(parts) - len(e) + 1))


def no_decay_names(model: nn.Module, no_decay: list[str], decay_1d: bool = False) -> list[str]:
    """Names of the parameters that get no weight decay (for logs and tests)."""
    ids = {id(p) for p in param_groups(model, 0.0, no_decay, decay_1d)[1]["params"]}
    return [n for n, p in model.named_parameters() if id(p) in ids]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, list(cfg.no_decay), cfg.decay_1d)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.name == "adamw":
        if len(cfg.betas) != 2:
            raise ValueError(f"optim.betas needs 2 values, got {cfg.betas}")
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    raise ValueError(f"optim.name must be 'sgd' or 'adamw', got {cfg.name!r}")


def lr_at(step: int, base_lr: float, cfg: ScheduleConfig, total_steps: int, steps_per_epoch: int):
    """Learning rate of (0-based) global ``step``: linear warm-up, then cosine / multistep.

    ``cfg.per_epoch``: the reference code's schedule, stepped once per epoch: epoch e of E gets
    base * e / W during a staircase warm-up of W = round(warmup * E) epochs (epoch 0 at lr 0),
    then the cosine of (e - W) / (E - W)."""
    if cfg.per_epoch and cfg.name == "cosine":
        spe = max(1, steps_per_epoch)
        epoch, epochs = step // spe, max(1, -(-total_steps // spe))
        warm_e = int(round(cfg.warmup * epochs))
        if epoch < warm_e:
            return base_lr * epoch / warm_e
        t = (epoch - warm_e) / max(1, epochs - warm_e)
        return cfg.min_lr + (base_lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    warm = int(round(cfg.warmup * total_steps))
    if step < warm:
        return base_lr * (step + 1) / warm
    if cfg.name == "cosine":
        t = (step - warm) / max(1, total_steps - warm)
        return cfg.min_lr + (base_lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    if cfg.name == "multistep":
        epoch = step // max(1, steps_per_epoch)
        return base_lr * cfg.gamma ** sum(1 for m in cfg.milestones if epoch >= m)
    return base_lr


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr
