"""How many aten ops one training step launches, per paper model, on the CPU's plan and on a
GPU's (a GPU step of these small models is launch-bound: its time follows the op count).

    python benchmarks/step_ops.py [--models sa_quadratic sa_learned ...] [--batch 8]
                                  [--attn-dropout 0.0] [--out DIR]

Each model at the Table 1 CPU scale (configs/experiments/_sa_small.yaml: hidden 64, feed-forward
128, 6 layers, 9 heads, 2x2 space-to-depth) takes one forward (cross-entropy on random labels)
and backward pass in training mode, float32, after one warm-up step; a TorchDispatchMode counts
every aten op it dispatches (views and detaches left out: they launch nothing). "GPU plan": the
kernel each attention layer would take on CUDA (``plan.layer_case`` asked for device "cuda"),
run on this CPU's tensors, so the count needs no GPU (except for the content models, whose GPU
kernel, FlexAttention, has no backward on a CPU). The count does not depend on the batch.
Writes benchmarks/results/step_ops.md and .json (``--out`` for another folder).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from unittest.mock import patch

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnconv.layers import mhsa2d
from attnconv.models import create_model, list_models

ROOT = Path(__file__).resolve().parents[1]
FREE = {torch.ops.aten.view.default, torch.ops.aten.detach.default}  # launch nothing
_LAYER_CASE = mhsa2d.plan.layer_case
SA = ["sa_quadratic", "sa_learned", "sa_learned_content"]  # the Table 1 attention models


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, views and detaches left out."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func not in FREE
        return func(*args, **(kwargs or {}))


def _on_cuda_plan(layer, x, term, p_drop, device=None, tokens=False):
    return _LAYER_CASE(layer, x, term, p_drop, "cuda", tokens)


def step_ops(name: str, batch: int, attn_dropout: float, gpu_plan: bool) -> int | None:
    """aten ops of one training step (forward, loss, backward) of model ``name``; None where a
    GPU's kernel cannot run backward on a CPU (FlexAttention, the content models')."""
    torch.manual_seed(0)
    kw = (
        dict(
            hidden_size=64,
            num_layers=6,
            num_heads=9,
            ff_size=128,
            downsample=2,
            attn_dropout=attn_dropout,
        )
        if name in SA
        else {}
    )  # another model: its defaults
    model = create_model(name, num_classes=10, **kw).train()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    with patch.object(mhsa2d.plan, "layer_case", _on_cuda_plan if gpu_plan else _LAYER_CASE):
        try:
            F.cross_entropy(model(x), y).backward()  # warm-up: caches, lazily built tables
        except NotImplementedError:  # FlexAttention: no backward on a CPU
            return None
        model.zero_grad(set_to_none=True)
        with OpCount() as count:
            F.cross_entropy(model(x), y).backward()
    return count.n


def _cell(n: int | None) -> str:
    return "n/a (FlexAttention: its backward needs CUDA)" if n is None else str(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=[*SA, "resnet18_cifar"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attn-dropout", type=float, default=0.0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    if a.batch < 1:
        raise SystemExit(f"--batch {a.batch}: must be at least 1")
    if unknown := [m for m in a.models if m not in list_models()]:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}")
    rows = []
    for name in a.models:
        cpu, gpu = (step_ops(name, a.batch, a.attn_dropout, g) for g in (False, True))
        rows.append({"model": name, "cpu_plan": cpu, "gpu_plan": gpu})
        print(f"{name}: {cpu} ops on the CPU's plan, {_cell(gpu)} on a GPU's", flush=True)
    cmd = "python benchmarks/step_ops.py" + (
        f" --attn-dropout {a.attn_dropout}" if a.attn_dropout else ""
    )
    table = [f"| {r['model']} | {r['cpu_plan']} | {_cell(r['gpu_plan'])} |" for r in rows]
    lines = [
        f"aten ops of one training step (forward, cross-entropy, backward; views and "
        f"detaches left out), Table 1 CPU scale, attention dropout {a.attn_dropout}; "
        f"`{cmd}`.",
        "",
        "| model | CPU plan | GPU plan |",
        "|---|---|---|",
        *table,
    ]
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "step_ops" + ("_dropout" if a.attn_dropout else "")
    (a.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (a.out / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
