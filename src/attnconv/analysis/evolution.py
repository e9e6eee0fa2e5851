"""How the quadratic heads evolve over training (Cordonnier et al. 2020, fig. 3-4): from a run's
``centers.jsonl`` (every head's centre Delta and precision alpha, logged each epoch), per logged
step and per layer:

- displacement: mean over heads of |Delta_t - Delta_0| (tokens), how far the centres moved;
- center distance: mean over heads of |Delta_t| (tokens), how far from the query they sit
  (fig. 4: toward the query in early layers, away from it deeper);
- peak mass: per head, the top key's share of its mass for a query in the middle of the grid
  (a head is sharp above 0.5, analysis/grid.py), and the number of sharp heads;
- grid score: distinct 3x3 / 5x5 offsets held by sharp heads (analysis/grid.py);
- mean distance: the expected distance (tokens) from the query to the keys a head attends to,
  averaged over heads (fig. 4: local early layers, wider deeper ones);
- travel3: how far the centres still are from a 3x3 convolution's layout, the mean distance a
  head must move to hold its own offset of the 3x3 kernel (analysis/grid.py, grid_travel); NaN
  for a layer of more than 9 heads, which cannot each hold one of the 9 offsets.

Position-only quadratic attention does not depend on the input, so these are exact functions of
(Delta, alpha): each logged pair is loaded into a quadratic layer and scored by the same code as
a trained model (``grid.layer_grid_score``), no checkpoint or image needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..layers.mhsa2d import MultiHeadSelfAttention2d
from .grid import grid_travel, layer_grid_score, middle_query_probs

__all__ = ["read_evolution", "head_evolution", "last_heads", "evolution_figure"]


def read_evolution(path: str | Path) -> list[dict]:
    """The records of a centre log that carry alpha, sorted by step (older logs: [])."""
    path = Path(path)
    recs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if "alpha" in rec:
                recs.append(
                    {"step": int(rec["step"]), "layers": rec["layers"], "alpha": rec["alpha"]}
                )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{n}: bad centre-log line ({e})") from None
    return sorted(recs, key=lambda r: r["step"])


@torch.no_grad()
def _layer(centers: list, alpha: list) -> MultiHeadSelfAttention2d:
    """A position-only quadratic layer holding these heads (eq. 9)."""
    layer = MultiHeadSelfAttention2d(
        1, 1, len(alpha), positional="quadratic", content=False, value="identity"
    )
    enc = layer.positional_encoding
    enc.centers.copy_(torch.tensor(centers, dtype=torch.float32))
    enc.set_alpha(torch.tensor(alpha, dtype=torch.float64))
    return layer


@torch.no_grad()
def mean_distance(layer: MultiHeadSelfAttention2d, h: int, w: int) -> float:
    """Expected query-key distance (tokens) for the middle query, averaged over the heads."""
    probs = middle_query_probs(layer, h, w)  # (Nh, T)
    r, c = torch.meshgrid(torch.arange(h) - h // 2, torch.arange(w) - w // 2, indexing="ij")
    dist = (r.float() ** 2 + c.float() ** 2).sqrt().reshape(-1)  # (T,)
    return float((probs.float() * dist).sum(-1).mean())


def head_evolution(path: str | Path, grid: tuple[int, int] = (16, 16)) -> list[dict]:
    """Per logged step: {"step", "layers": [{"displacement", "peak_mass", "sharp_heads", "grid3",
    "grid5", "mean_distance", "center_distance", "travel3"} per layer]} (see the module
    docstring; travel3 is NaN for a layer of more than 9 heads)."""
    recs = read_evolution(path)
    if not recs:
        raise ValueError(f"{path}: no centre-log line with alpha (a run of an older version?)")
    first = [torch.tensor(c) for c in recs[0]["layers"]]
    out = []
    for rec in recs:
        layers = []
        for li, (ctr, alpha) in enumerate(zip(rec["layers"], rec["alpha"])):
            layer, delta = _layer(ctr, alpha), torch.tensor(ctr)  # delta: (Nh, 2)
            g = layer_grid_score(layer, *grid)
            moved = (delta - first[li]).norm(dim=-1).mean()
            layers.append(
                dict(
                    displacement=float(moved),
                    peak_mass=g.peak_mass,
                    sharp_heads=g.sharp_heads,
                    grid3=g.grid3,
                    grid5=g.grid5,
                    mean_distance=mean_distance(layer, *grid),
                    center_distance=float(delta.norm(dim=-1).mean()),
                    travel3=grid_travel(delta) if len(delta) <= 9 else float("nan"),  # 9 taps
                )
            )
        out.append({"step": rec["step"], "layers": layers})
    return out


@torch.no_grad()
def last_heads(path: str | Path, grid: tuple[int, int] = (16, 16)) -> tuple[int, list[dict]]:
    """The last logged step and, per layer, its heads there: "maps" (Nh, h, w) the middle query's
    probabilities, "centers" (Nh, 2) Delta in tokens (row, col), "score" the GridScore."""
    rec = read_evolution(path)[-1]
    h, w = grid
    out = []
    for ctr, alpha in zip(rec["layers"], rec["alpha"]):
        layer = _layer(ctr, alpha)
        probs = middle_query_probs(layer, h, w)
        out.append(
            dict(
                maps=probs.view(-1, h, w).float(),
                centers=torch.tensor(ctr),
                score=layer_grid_score(layer, h, w),
            )
        )
    return rec["step"], out


def _thousands(v: float, _pos=None) -> str:
    """A step axis' label: 0, 500, 10k, 37.5k."""
    return f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}"


def evolution_figure(evo: list[dict], path: str | Path) -> Path:
    """Six panels against training steps, one line per layer: centre displacement, centre
    distance from the query, travel left to a 3x3 grid, largest peak mass of a head, mean
    attention distance, 3x3 grid score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    steps = [e["step"] for e in evo]
    n = len(evo[0]["layers"])
    panels = [
        ("displacement", "centre displacement from step 0 (tokens)", lambda d: d),
        ("center_distance", "centre distance from the query |Delta| (tokens)", lambda d: d),
        ("travel3", "travel left to a 3x3 grid (tokens)", lambda d: d),
        ("peak_mass", "largest top-key share of a head", max),
        ("mean_distance", "mean attention distance (tokens)", lambda d: d),
        ("grid3", "3x3 grid score (of 9)", lambda d: d),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    axes = axes.ravel()
    colors = plt.get_cmap("viridis")([i / max(n - 1, 1) for i in range(n)])
    for ax, (key, title, agg) in zip(axes, panels):
        for li in range(n):
            ax.plot(
                steps,
                [agg(e["layers"][li][key]) for e in evo],
                color=colors[li],
                label=f"layer {li + 1}",
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))  # 150,000 steps: "150k"
        ax.xaxis.set_major_formatter(FuncFormatter(_thousands))
    axes[3].axhline(0.5, color="grey", lw=0.8, ls="--")  # sharp above
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
