"""One training step's loss gradients, to compare two commits (or machines) on the same weights.

Two runs of one seed that part after some steps were parted by the code or by the machine. This
writes, for a Table 1 model at the experiments' geometry (hidden 64, 6 layers, 9 heads,
feed-forward 128, 2x2 space-to-depth), its weights and the gradients of the cross-entropy of one
seeded random batch, in float64 and float32 (one thread), to a safetensors file; run under a
second commit with ``--weights`` naming the first file, it recomputes from the same weights, and
``compare`` prints each dtype's largest relative difference (docs/experiments.md, Table 1):

    python benchmarks/step_grads.py save new.safetensors --model sa_learned_content
    git worktree add ../old REV
    PYTHONPATH=../old/src python benchmarks/step_grads.py save old.safetensors \\
        --model sa_learned_content --weights new.safetensors
    python benchmarks/step_grads.py compare new.safetensors old.safetensors
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import attnconv

GEOMETRY = dict(hidden_size=64, num_layers=6, num_heads=9, ff_size=128, downsample=2)
DTYPES = (torch.float64, torch.float32)


def save(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = attnconv.create_model(args.model, attn_dropout=0.0, **GEOMETRY)
    if args.weights:
        weights = {k[2:]: v for k, v in load_file(args.weights).items() if k.startswith("w|")}
        model.load_state_dict(weights)
    out = {f"w|{k}": v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    for dt in DTYPES:
        model = model.to(dt).train()
        model.zero_grad()
        loss = F.cross_entropy(model(x.to(dt)), y)
        loss.backward()
        out[f"{dt}|loss"] = loss.detach().reshape(1)
        out.update({f"{dt}|{n}": p.grad.detach().clone() for n, p in model.named_parameters()})
        print(f"{dt}: loss {loss.item():.17g}")
    save_file(out, args.file)


def compare(args: argparse.Namespace) -> None:
    a, b = load_file(args.a), load_file(args.b)
    for dt in DTYPES:
        worst = (0.0, "")
        for k in (k for k in a if k.startswith(f"{dt}|")):
            scale = a[k].double().abs().max().item() or 1.0
            rel = (a[k].double() - b[k].double()).abs().max().item() / scale
            worst = max(worst, (rel, k.split("|", 1)[1]))
        print(f"{dt}: largest relative difference {worst[0]:.3g} ({worst[1] or 'none'})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="weights and one step's gradients to FILE")
    s.add_argument("file")
    s.add_argument("--model", default="sa_learned_content")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--batch", type=int, default=16)
    s.add_argument("--weights", help="start from this file's weights (another commit's save)")
    c = sub.add_parser("compare", help="each dtype's largest relative gradient difference")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    save(args) if args.cmd == "save" else compare(args)


if __name__ == "__main__":
    main()
