"""Is bf16 autocast training faster, and as exact, for each model of the Table 1 experiment?

    python benchmarks/bf16_check.py [--batch 32] [--repeats 5]

For every model at the experiment geometry (configs/experiments/_sa_small.yaml): the relative
error of the logits and of the parameter gradients against a float64 copy of the same model on
one real CIFAR-10 batch, in fp32 and under bf16 autocast, for the fast path (impl="auto") and the
plain dense path (impl="reference"); and the training-step throughput (forward, cross-entropy,
backward, SGD step; one thread; fp32 and bf16 interleaved in one process, medians of repeats).
A path is "as exact under bf16" when its bf16 error is within 2x of the reference path's under
the same autocast (bf16's own rounding, which every bf16 training has). Writes bf16.md into
--out-dir (default ./attnconv-bench/; benchmarks/results/ with --update-results) and prints it.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from attnconv.bench.common import add_output_options, output_dir
from attnconv.catalog import RECIPES
from attnconv.models import create_model
from experiments_runs import default_data  # beside this file

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("sa_quadratic", "sa_learned", "sa_learned_content", "resnet18_cifar")


def geometry() -> dict:
    cfg = yaml.safe_load((RECIPES / "experiments" / "_sa_small.yaml").read_text())
    return dict(cfg["model"]["kwargs"])


def build(name: str, **kw) -> torch.nn.Module:
    if name.startswith("resnet"):
        return create_model(name, widths=[16, 32, 64, 128])
    return create_model(name, **geometry(), **kw)


def batch(data: Path, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n real CIFAR-10 test images, normalized as in training."""
    from attnconv.data.datasets import load_dataset

    ds = load_dataset(str(data), "test", max_per_class=n // 10 + 1)
    x = ds.images[:n].float() / 255  # (B, 3, 32, 32)
    mean, std = torch.tensor([0.4914, 0.4822, 0.4465]), torch.tensor([0.2023, 0.1994, 0.2010])
    return (x - mean[:, None, None]) / std[:, None, None], ds.labels[:n]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def errors(model: torch.nn.Module, x, y, bf16: bool) -> tuple[float, float]:
    """Relative error of (logits, concatenated parameter gradients) vs the float64 model."""
    ref = copy.deepcopy(model).double()
    lr = ref(x.double())
    F.cross_entropy(lr, y).backward()
    gr = torch.cat([p.grad.flatten() for p in ref.parameters()])
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        lo = model(x)
        loss = F.cross_entropy(lo.float(), y)
    loss.backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    return rel(lo, lr), rel(g, gr)


def throughput(model, x, y, repeats: int) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    times = {False: [], True: []}
    for i in range(repeats + 1):
        for bf16 in (False, True):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(x).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i:  # the first round warms up
                times[bf16].append(time.perf_counter() - t0)
    return {k: x.shape[0] / statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--data", type=Path, default=default_data())
    add_output_options(ap)
    args = ap.parse_args()
    out = output_dir(args) / "bf16.md"
    torch.set_num_threads(1)
    x, y = batch(args.data, args.batch)
    rows = [
        "| model | fp32 img/s | bf16 img/s | speed-up | logits err fp32 / bf16 (fast) "
        "| bf16 (reference path) | grad err fp32 / bf16 (fast) | bf16 (reference path) "
        "| bf16 as exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in args.models:
        torch.manual_seed(0)
        m = build(name).train()
        m.eval()  # errors without dropout noise
        e32, e16 = errors(m, x, y, False), errors(m, x, y, True)
        if name.startswith("resnet"):
            r16 = e16
        else:
            mr = build(name, impl="reference").eval()
            mr.load_state_dict(m.state_dict())
            r16 = errors(mr, x, y, True)
        tp = throughput(m.train(), x, y, args.repeats)
        ok = e16[0] <= 2 * r16[0] and e16[1] <= 2 * r16[1]
        rows.append(
            f"| {name} | {tp[False]:.1f} | {tp[True]:.1f} | {tp[True] / tp[False]:.2f}x "
            f"| {e32[0]:.1e} / {e16[0]:.1e} | {r16[0]:.1e} | {e32[1]:.1e} / {e16[1]:.1e} "
            f"| {r16[1]:.1e} | {'yes' if ok else 'NO'} |"
        )
        print(rows[-1], flush=True)
    cmd = f"python benchmarks/bf16_check.py --batch {args.batch} --repeats {args.repeats}"
    text = f"Regenerated by `{cmd}` (one thread, torch {torch.__version__}).\n\n"
    text += "\n".join(rows) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
