"""How fast can the quadratic heads move, against the model's width? (Cordonnier et al. 2020,
fig. 3: their grid forms at hidden 400; the CPU experiments train hidden 64.)

    python benchmarks/grid_width.py [--hidden 64 128 256 400] [--batches 8] [--batch 32]
                                    [--checkpoint RUN/checkpoints/step-N ...] [--threads 1]
                                    [--heads LAYER] [--name STEM]

For each width, sa_quadratic at the experiments' geometry (6 layers, 9 heads, 2x2
space-to-depth, feed-forward 2x hidden, or the paper's 512 at hidden 400; hidden dropout 0.1,
attention dropout off, the reference init from one seed; configs/experiments/grid_long.yaml's
model, normalization and momentum) takes the loss gradient of every head's
centre Delta_h (eq. 9) on ``--batches`` batches of real CIFAR-10 training images (no
augmentation; the same images for every width). Per layer it writes:

- drift: ||E dL/dDelta_h|| over the batches (the squared norm of their mean less its noise
  share, var / n), averaged over the heads; what moves a centre.
  With SGD momentum m the steady step is lr / (1 - m) times it, so a centre moves about
  drift / (1 - m) tokens per unit of summed learning rate (docs/experiments.md's S);
- noise: the batches' spread around that mean (sqrt of E||g - mean||^2), and
  noise / sqrt(batches), the error of the drift itself: a drift below it is not resolved;
- S per token: 1 / (drift / (1 - m)), the summed learning rate at which the centres would travel
  one token at this drift (the reference recipe sums 7,500; a 3x3 grid needs ~1-2 tokens).

``--heads L`` adds, for layer L of each model, one row per head (and a figure,
<name>_heads.png): its centre Delta_h (row, col;
tokens), its precision alpha, the descent direction -E g (unit vector) when resolved (|E g| above
twice its error), its radial part (+1 straight away from the query, -1 straight in) and its part
towards the nearest integer offset (+1: towards the kernel position it sits nearest).

This is the rate at one point of training (the start, or each ``--checkpoint``: trainer
checkpoints of a run, at its width), not a trajectory: the runs (``benchmarks/experiments.py``)
measure that.
Writes benchmarks/results/grid_width.md and .json (``--out`` for another folder).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnconv.data import load_dataset
from attnconv.loading import load_model
from attnconv.models import create_model
from attnconv.train.config import load_config
from experiments_runs import CONFIGS, ROOT, default_data

# the experiment whose centres move: its geometry, normalization and optimizer momentum
GRID = load_config(CONFIGS / "grid_long.yaml")
MOMENTUM = GRID.optim.momentum


def model_for(hidden: int, seed: int) -> torch.nn.Module:
    """grid_long's sa_quadratic at width ``hidden``: feed-forward 2x hidden (the paper's 512 at
    its hidden 400), the reference init from ``seed``."""
    ff = 512 if hidden == 400 else 2 * hidden
    torch.manual_seed(seed)
    kwargs = {**GRID.model.kwargs, "hidden_size": hidden, "ff_size": ff}
    return create_model(GRID.model.name, **kwargs)


def centre_grads(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]):
    """(n_batches, layers, heads, 2) gradients of the loss w.r.t. every centre."""
    centres = [p for n, p in model.named_parameters() if n.endswith("positional_encoding.centers")]
    model.train()
    torch.manual_seed(0)  # the hidden dropout masks: the same stream for every width
    out = []
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        out.append(torch.stack([c.grad.detach().clone() for c in centres]))
    return torch.stack(out).double()


def mean_var(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Over the batches (dim 0) of centre gradients g (n, ..., 2): the mean (..., 2) and the
    spread E||g - E g||^2 (...)."""
    mean = g.mean(0)
    return mean, ((g - mean).norm(dim=-1) ** 2).sum(0) / (g.shape[0] - 1)


def layer_stats(g: torch.Tensor) -> list[dict]:
    n = g.shape[0]
    mean, var = mean_var(g)  # (L, Nh, 2), (L, Nh)
    # ||E g|| without the noise's share of ||mean||^2 (E||mean||^2 = ||E g||^2 + var / n)
    drift = (mean.norm(dim=-1) ** 2 - var / n).clamp_min(0).sqrt().mean(-1)  # (L,)
    noise = var.sqrt().mean(-1)
    rows = []
    for d, s in zip(drift.tolist(), noise.tolist()):
        per_s = d / (1 - MOMENTUM)  # tokens per unit summed lr
        rows.append(
            {
                "drift": d,
                "noise": s,
                "drift_error": s / math.sqrt(n),
                "resolved": d > 2 * s / math.sqrt(n),
                "summed_lr_per_token": 1 / per_s if per_s > 0 else None,
            }
        )
    return rows


def head_stats(g: torch.Tensor, centres: torch.Tensor, alpha: torch.Tensor) -> list[dict]:
    """One layer's heads: g (n_batches, Nh, 2) centre gradients, centres (Nh, 2) Delta_h in
    tokens, alpha (Nh,). The descent direction -E g as a unit vector, whether |E g| exceeds twice
    its error (the batches' spread / sqrt n), its cosine with Delta_h (radial: + outward) and
    with the way to the nearest integer offset (0 where the centre sits on it, or at the query
    for the radial part)."""
    mean, var = mean_var(g)
    err = (var / g.shape[0]).sqrt()  # (Nh,) the error of |E g|
    rows = []
    for h in range(g.shape[1]):
        c, m = centres[h].double(), mean[h]
        u = -m / m.norm() if m.norm() > 0 else torch.zeros(2, dtype=m.dtype)
        rows.append(
            {
                "centre": [round(float(x), 2) for x in c],
                "alpha": float(alpha[h]),
                "descent": [round(float(x), 3) for x in u],
                "pull": float(m.norm()),
                "pull_error": float(err[h]),
                "resolved": bool(m.norm() > 2 * err[h]),
                "radial": _cos(u, c),
                "to_grid": _cos(u, c.round() - c),
            }
        )
    return rows


def _cos(u: torch.Tensor, v: torch.Tensor) -> float:
    """u . v / |v| for a unit u; 0 where v is shorter than 1e-3 (no direction)."""
    return float(u @ v / v.norm()) if v.norm() > 1e-3 else 0.0


def head_lines(label: str, layer: int, rows: list[dict]) -> list[str]:
    lines = [
        f"Layer {layer} of {label}, per head (centre in tokens; descent -E g, a unit vector; "
        "radial: its cosine with Delta_h, + away from the query; to grid: with the way to "
        "the nearest integer offset; '-': |E g| within twice its error):",
        "",
        "| head | centre (row, col) | alpha | abs(E g) (error) | descent | radial | to grid |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        (c0, c1), (d0, d1) = r["centre"], r["descent"]
        way = (
            f"({d0:.2f}, {d1:.2f}) | {r['radial']:+.2f} | {r['to_grid']:+.2f}"
            if r["resolved"]
            else "- | - | -"
        )
        lines.append(
            f"| {i} | ({c0:.2f}, {c1:.2f}) | {r['alpha']:.2f} | "
            f"{r['pull']:.2g} ({r['pull_error']:.1g}) | {way} |"
        )
    return lines


def heads_figure(label: str, layer: int, rows: list[dict], path: Path) -> None:
    """The layer's heads on the token grid: each centre, its 1-sigma circle (sigma = 1 /
    sqrt(2 alpha), drawn up to 8 tokens), and an arrow one token long along its resolved
    descent direction; the query at (0, 0), the integer offsets as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ticks = range(-7, 8)
    ax.scatter(
        [c for c in ticks for _ in ticks], [r for _ in ticks for r in ticks], s=2, color="0.75"
    )
    for i, r in enumerate(rows):
        (y, x), color = r["centre"], f"C{i}"
        sigma = min(8.0, (2 * r["alpha"]) ** -0.5) if r["alpha"] > 0 else 8.0
        ax.add_patch(plt.Circle((x, y), sigma, fill=False, ls="--", lw=0.8, color=color))
        ax.plot(x, y, "o", color=color, label=f"head {i + 1} (alpha {r['alpha']:.2f})")
        if r["resolved"]:
            dy, dx = r["descent"]
            ax.annotate(
                "", (x + dx, y + dy), (x, y), arrowprops=dict(arrowstyle="->", color=color, lw=1.5)
            )
    ax.plot(0, 0, "k*", ms=12, label="query")
    ax.set(
        xlim=(-7.5, 7.5),
        ylim=(7.5, -7.5),
        aspect="equal",
        xlabel="column offset (tokens)",
        ylabel="row offset (tokens)",
    )
    ax.set_title(
        f"layer {layer}: centres, 1-sigma circles, descent (arrows: resolved)\n{label}", fontsize=8
    )
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt_layers(rows: list[dict], key: str, f: str = "{:.2g}") -> str:
    return ", ".join("-" if r[key] is None else f.format(r[key]) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 128, 256, 400])
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--checkpoint",
        type=Path,
        nargs="+",
        help="trainer checkpoints (of one run, at their steps) instead",
    )
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--heads", type=int, metavar="LAYER", help="also one row per head of this layer (1-based)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument(
        "--name",
        help="the results' file stem (default grid_width, or "
        "grid_width_checkpoint with --checkpoint)",
    )
    args = ap.parse_args()
    if args.batches < 2 or args.batch < 1:
        ap.error(f"--batches must be >= 2 and --batch >= 1, got {args.batches}, {args.batch}")
    torch.set_num_threads(args.threads)
    ds = load_dataset(str(args.data), "train")
    n = args.batches * args.batch
    if n > len(ds.labels):
        ap.error(f"--batches x --batch = {n} exceeds the {len(ds.labels)} training images")
    idx = torch.randperm(len(ds.labels), generator=torch.Generator().manual_seed(args.seed))[:n]
    x = ds.images[idx].float().div(255)  # (n, 3, 32, 32)
    mean, std = (torch.tensor(v)[:, None, None] for v in (GRID.data.mean, GRID.data.std))
    x = (x - mean) / std
    batches = list(zip(x.split(args.batch), ds.labels[idx].split(args.batch)))
    results = []
    ck_names = ["/".join(c.resolve().parts[-3:]) for c in args.checkpoint or []]
    if args.checkpoint:  # run/checkpoints/step-N: the run folder's name and the step
        todo = []
        for c, name in zip(args.checkpoint, ck_names):
            model, _ = load_model(c)
            todo.append((f"{name} (hidden {model.cfg.hidden_size})", model))
    else:
        todo = [(f"hidden {h}", model_for(h, args.seed)) for h in args.hidden]
    for label, model in todo:
        t0 = time.perf_counter()
        encs = [m for n, m in model.named_modules() if n.endswith("positional_encoding")]
        if args.heads is not None and not 1 <= args.heads <= len(encs):  # before the gradients
            ap.error(f"--heads {args.heads}: the model has layers 1 to {len(encs)}")
        grads = centre_grads(model, batches)
        rows = layer_stats(grads)
        results.append({"model": label, "seconds": time.perf_counter() - t0, "layers": rows})
        if args.heads is not None:
            enc = encs[args.heads - 1]
            with torch.no_grad():
                per_head = head_stats(grads[:, args.heads - 1], enc.centers, enc.alpha)
            results[-1]["heads"] = {"layer": args.heads, "rows": per_head}
        print(
            f"{label}: drift {fmt_layers(rows, 'drift')} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    stem = args.name or ("grid_width" if not args.checkpoint else "grid_width_checkpoint")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "batches": args.batches,
        "batch": args.batch,
        "seed": args.seed,
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    cmd = (
        "python benchmarks/grid_width.py"
        + (f" --batches {args.batches}" if args.batches != 8 else "")
        + (f" --heads {args.heads}" if args.heads is not None else "")
        + (f" --name {args.name}" if args.name else "")
    )
    if args.checkpoint:
        cmd += " --checkpoint " + " ".join(f"<run root>/{n}" for n in ck_names)
    lines = [
        f"Centre gradients of sa_quadratic, per layer (1 -> 6), {args.batches} batches of "
        f"{args.batch} CIFAR-10 training images, seed {args.seed}; `{cmd}`.",
        "",
        "| model | drift: norm of E g | drift error (noise / sqrt n) | summed lr per token "
        f"(momentum {MOMENTUM}) |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {fmt_layers(r['layers'], 'drift')} | "
            f"{fmt_layers(r['layers'], 'drift_error')} | "
            f"{fmt_layers(r['layers'], 'summed_lr_per_token', '{:.0f}')} |"
        )
    for i, r in enumerate(results):
        if "heads" in r:
            fig = args.out / f"{stem}_heads{i if len(results) > 1 else ''}.png"
            heads_figure(r["model"], r["heads"]["layer"], r["heads"]["rows"], fig)
            lines += [
                "",
                *head_lines(r["model"], r["heads"]["layer"], r["heads"]["rows"]),
                "",
                f"![layer {r['heads']['layer']} pull]({fig.name})",
            ]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
