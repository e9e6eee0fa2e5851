"""What each model the experiments page compares costs: its parameters and the FLOPs of one forward
of a 32x32 image (the report's section; from each run folder's config.yaml, the registry model
built as it trained).

FLOPs are counted by torch.utils.flop_counter.FlopCounterMode over ``model(x)`` for one
3x32x32 image in eval mode, every attention layer on its ``reference`` backend (the plain
equations: unfold and batched matrix products), so the count does not depend on the kernel a
machine picks. It counts matrix products and convolutions, two FLOPs per multiply-add;
softmax, normalization, activations, pooling and element-wise products are not counted (for the
position-only sa_quadratic that leaves out its attention logits, the same for every image)."""

from __future__ import annotations

import json
import re
from pathlib import Path

TITLE = "### What the compared models cost: parameters and FLOPs"


def build(config: Path):
    """The registry model a run trained (config.yaml's model section), in eval mode, its
    attention layers on their reference backend."""
    import yaml

    from attnconv.models import create_model

    cfg = yaml.safe_load(config.read_text())["model"]
    model = create_model(cfg["name"], **{"num_classes": 10, **cfg["kwargs"]}).eval()
    for m in model.modules():
        if "reference" in getattr(m, "BACKENDS", ()) and hasattr(m, "backend"):
            m.backend = "reference"
    return model


def cost(model, size: int = 32) -> tuple[int, int]:
    """(parameters, FLOPs of one forward of a 3 x size x size image) of ``model``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in model.parameters())
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.zeros(1, 3, size, size))
    return params, counter.get_total_flops()


def model_args(config: Path) -> tuple[str, dict]:
    """The registry name and arguments of a run's model, its dropout rates and init left out
    (they change neither its parameters nor an eval forward)."""
    import yaml

    cfg = yaml.safe_load(config.read_text())["model"]
    skip = ("dropout", "init")
    return cfg["name"], {k: v for k, v in cfg["kwargs"].items() if not any(s in k for s in skip)}


def runs_cell(names: list[str]) -> str:
    """Run names with their seed repeats folded into the seed-0 run beside them: 'sasa_k7 (3
    seeds), sasa_k9' (a named seed without its seed-0 run stays as it is)."""
    bases: dict[str, int] = {}
    for n in names:
        base = re.sub(r"_seed\d+$", "", n)
        base = base if base in names else n
        bases[base] = bases.get(base, 0) + 1
    return ", ".join(f"`{b}`" + (f" ({k} seeds)" if k > 1 else "") for b, k in bases.items())


def cost_section(lines: list[str], runs: Path) -> None:
    """One row per distinct model among the run folders under ``runs``."""
    groups: dict[str, list[Path]] = {}
    for cfg in sorted(runs.glob("*/config.yaml")):
        groups.setdefault(json.dumps(model_args(cfg), sort_keys=True), []).append(cfg)
    models: list[list] = []  # [name, kwargs, params, flops, run names]
    for cfgs in groups.values():
        name, kwargs = model_args(cfgs[0])
        params, flops = cost(build(cfgs[0]))
        names = [c.parent.name for c in cfgs]
        for m in models:  # an argument spelled out at its default: the same model
            same = m[0] == name and m[2:4] == [params, flops]
            if same and (kwargs.items() <= m[1].items() or m[1].items() <= kwargs.items()):
                m[1], m[4] = max(m[1], kwargs, key=len), m[4] + names
                break
        else:
            models.append([name, kwargs, params, flops, names])
    if not models:
        return
    rows = [
        f"| {name} | {', '.join(f'{a}={v}' for a, v in kwargs.items()) or 'defaults'} | "
        f"{runs_cell(sorted(names))} | {params / 1e6:.3f}M | {flops / 1e6:,.1f} |"
        for name, kwargs, params, flops, names in sorted(models, key=lambda m: (m[0], m[2]))
    ]
    lines += [
        TITLE,
        "",
        "Every model the runs below trained, built from its run folder's config.yaml: its "
        "parameters and the FLOPs of one forward of a 3x32x32 image, counted by "
        "`torch.utils.flop_counter.FlopCounterMode` in eval mode with the attention on its "
        "reference backend (matrix products and convolutions, 2 FLOPs per multiply-add; "
        "softmax, normalization, activations, pooling and element-wise products not counted; "
        "benchmarks/experiments_cost.py says how).",
        "",
        "| registry model | arguments | runs | params | forward MFLOPs per image |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
