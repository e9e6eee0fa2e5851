"""Matplotlib figures (Agg backend) of the analyses: each ``plot_*`` writes a PNG, returns its path.

Cordonnier et al. 2020 fig. 4-6 (query maps) and Dosovitskiy et al. 2021 fig. 7 (patch-filter PCs,
position-embedding similarity, mean attention distance); the head-centre figures (fig. 3: mass
contours, trajectories) are center_figures.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .convlike import LayerConvLikeness  # noqa: E402
from .maps import crop, scale_query  # noqa: E402

CMAP = "viridis"


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _plain(text: str) -> str:
    """A caller's text (class names, model and folder names) shown as written: a ``$`` would
    start matplotlib math text (and ``$\\x$`` crashes its parser)."""
    return text.replace("$", r"\$")


def _save(fig, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def _head_colors(n: int):
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def plot_query_maps(
    maps: Sequence[torch.Tensor],
    query: Sequence[int],
    grid: Sequence[int],
    out: str | Path,
    *,
    title: str = "",
    image: np.ndarray | None = None,
    zoom: int | None = None,
    names: Sequence[str] | None = None,
) -> Path:
    """Layers x heads grid of one query's attention maps (Nh, h, w) per layer, query marked.

    ``image`` (H, W, 3) in [0, 1] adds a first column showing the input with the query's token.
    ``zoom`` crops each map to a zoom x zoom window of keys around the query. One colour scale
    per layer (colourbar at the row's end), in attention probability. ``names`` label the rows
    (default "layer 1", ...). The layout is fixed in inches (a converted ResNet18 has 20 x 9
    maps: matplotlib's constrained layout took seconds for them).
    """
    nl, nh = len(maps), max(int(m.shape[0]) for m in maps)
    names = list(names) if names is not None else [f"layer {i + 1}" for i in range(nl)]
    extra = 1 if image is not None else 0
    cell, left, right, top, bottom = 1.5, 0.9, 1.0, 0.7 if title else 0.45, 0.55
    fw, fh = left + cell * (nh + extra) + right, top + cell * nl + bottom
    fig = plt.figure(figsize=(fw, fh))
    axes = fig.add_gridspec(
        nl,
        nh + extra,
        left=left / fw,
        right=1 - right / fw,
        top=1 - top / fh,
        bottom=bottom / fh,
        wspace=0.3,
        hspace=0.3,
    ).subplots(squeeze=False)
    for li, m in enumerate(maps):
        m = _np(m).astype(np.float64)
        lg = m.shape[-2:]
        qr, qc = scale_query(query, grid, lg)
        sub, r0, c0 = crop(torch.from_numpy(m), (qr, qc), zoom)
        sub = sub.numpy()
        vmax = max(float(sub.max()), 1e-12)
        ext = (c0 - 0.5, c0 + sub.shape[-1] - 0.5, r0 + sub.shape[-2] - 0.5, r0 - 0.5)
        im = None
        for hd in range(nh):
            ax = axes[li, hd + extra]
            if hd >= m.shape[0]:
                ax.axis("off")
                continue
            im = ax.imshow(
                sub[hd], cmap=CMAP, vmin=0.0, vmax=vmax, extent=ext, interpolation="nearest"
            )
            ax.plot([qc], [qr], marker="+", color="red", markersize=9, mew=2)
            integer_ticks(ax)
            ax.set_xticks([]) if li < nl - 1 else ax.set_xlabel("key col", fontsize=7)
            if hd > 0:
                ax.set_yticks([])
            else:
                ax.set_ylabel("key row" if extra else f"{names[li]}\nkey row", fontsize=7)
            ax.tick_params(labelsize=6)
            if li == 0:
                ax.set_title(f"head {hd + 1}", fontsize=8)
        if im is not None:
            box = axes[li, nh + extra - 1].get_position()
            cax = fig.add_axes((box.x1 + 0.1 / fw, box.y0, 0.1 / fw, box.height))
            cb = fig.colorbar(im, cax=cax)
            cb.ax.tick_params(labelsize=6)
            cb.set_label("attention", fontsize=7)
        if image is not None:
            ax = axes[li, 0]
            ax.imshow(np.clip(image, 0, 1), interpolation="nearest")
            ih, iw = image.shape[:2]
            th, tw = ih / lg[0], iw / lg[1]
            ax.add_patch(
                Rectangle((qc * tw - 0.5, qr * th - 0.5), tw, th, fill=False, ec="red", lw=1.5)
            )
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_ylabel(names[li], fontsize=8)
            if li == 0:
                ax.set_title("query", fontsize=8)
    if title:
        fig.suptitle(_plain(title), fontsize=10, y=1 - 0.2 / fh)
    return _save(fig, out)


def layer_ticks(ax, n: int, names: Sequence[str] | None) -> None:
    """Layers 1..n on the x axis: their names (module names, turned) or numbers."""
    if names is None or list(names) == [f"layer {i + 1}" for i in range(n)]:
        ax.set_xticks(range(1, n + 1))
        ax.set_xlabel("network depth (layer)")
        return
    ax.set_xticks(range(1, n + 1), [_plain(x) for x in names], rotation=90)
    ax.tick_params(axis="x", labelsize=7)


def integer_ticks(ax) -> None:
    """Ticks on whole tokens only (a 4x4 map otherwise gets ticks at 0.5, 1.5, ...)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def plot_mean_distance(
    distances: Sequence[torch.Tensor],
    out: str | Path,
    *,
    uniform: float | None = None,
    title: str = "",
    names: Sequence[str] | None = None,
) -> Path:
    """Mean attention distance (pixels) of every head (dots) against depth (layer index;
    ``names`` label the layers)."""
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    nh = max(len(d) for d in distances)
    colors = _head_colors(nh)
    for li, d in enumerate(distances):
        d = _np(d)
        for hd, v in enumerate(d):
            first = hd >= max((len(x) for x in distances[:li]), default=0)  # legend: each head once
            ax.scatter(
                [li + 1], [v], color=colors[hd], s=22, label=f"head {hd + 1}" if first else None
            )
    if uniform is not None:
        ax.axhline(uniform, color="gray", ls="--", lw=1, label="uniform attention")
    ax.set_ylabel("mean attention distance (pixels)")
    layer_ticks(ax, len(distances), names)
    ax.set_ylim(bottom=0)
    ax.grid(True, lw=0.3, alpha=0.5)
    ax.legend(fontsize=6, ncol=2, loc="best")
    ax.set_title(_plain(title) or "mean attention distance per head", fontsize=10)
    return _save(fig, out)


def plot_position_similarity(sim: torch.Tensor, out: str | Path) -> Path:
    """(h, w) grid of (h, w) maps: cosine similarity of each patch's position embedding to all."""
    s = _np(sim).astype(np.float64)
    h, w = s.shape[:2]
    mosaic = np.full((h * (h + 1) - 1, w * (w + 1) - 1), np.nan)
    for i in range(h):
        for j in range(w):
            mosaic[i * (h + 1) : i * (h + 1) + h, j * (w + 1) : j * (w + 1) + w] = s[i, j]
    fig, ax = plt.subplots(figsize=(6.0, 5.2))
    cmap = plt.get_cmap(CMAP).with_extremes(bad="white")
    im = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([j * (w + 1) + (w - 1) / 2 for j in range(w)], [str(j + 1) for j in range(w)])
    ax.set_yticks([i * (h + 1) + (h - 1) / 2 for i in range(h)], [str(i + 1) for i in range(h)])
    ax.tick_params(labelsize=7)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03).set_label("cosine similarity")
    ax.set_title("position embedding similarity", fontsize=10)
    return _save(fig, out)


def plot_patch_pcs(
    pcs: torch.Tensor, out: str | Path, *, ratios: torch.Tensor | None = None
) -> Path:
    """Principal components (k, C, P, Q) of the patch-embedding filters as small RGB images."""
    p = _np(pcs).astype(np.float64)
    k = p.shape[0]
    cols = min(k, 7)
    rows = (k + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(1.2 * cols, 1.35 * rows + 0.5), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= k:
            ax.axis("off")
            continue
        c = p[i]
        c = (c - c.min()) / max(c.max() - c.min(), 1e-12)  # min-max per component
        ax.imshow(
            c.transpose(1, 2, 0) if c.shape[0] == 3 else c[0], cmap="gray", interpolation="nearest"
        )
        lab = f"PC {i + 1}" + (f" ({100 * float(ratios[i]):.0f}%)" if ratios is not None else "")
        ax.set_title(lab, fontsize=6)
    fig.suptitle(f"RGB embedding filters: first {k} principal components", fontsize=9)
    return _save(fig, out)


def plot_convlikeness(
    results: Sequence[LayerConvLikeness], out: str | Path, names: Sequence[str] | None = None
) -> Path:
    """Bar chart per layer (``names``) and head: mass on the modal offset (top) and its
    stability (bottom)."""
    nl = len(results)
    nh = max(len(r.head_scores) for r in results)
    colors = _head_colors(nh)
    width = 0.8 / nh
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * nl + 2), 5.5), sharex=True)
    for key, ax, lab in (
        ("head_scores", axes[0], "mass on modal offset"),
        ("stability", axes[1], "stability of modal offset"),
    ):
        for li, r in enumerate(results):
            vals = getattr(r, key)
            for hd, v in enumerate(vals):
                x = li + 1 - 0.4 + width * (hd + 0.5)
                ax.bar(
                    [x],
                    [v],
                    width=width,
                    color=colors[hd],
                    label=f"head {hd + 1}"
                    if hd >= max((len(q.head_scores) for q in results[:li]), default=0)
                    else None,
                )
            if key == "head_scores":
                ax.plot([li + 0.6, li + 1.4], [r.score] * 2, color="black", lw=1.2)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(lab, fontsize=8)
        ax.axhline(1.0, color="gray", ls=":", lw=0.8)
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    layer_ticks(axes[1], nl, names)
    axes[0].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[0].set_title(
        "conv-likeness per head (black line = layer score; 1 = a convolution)", fontsize=9
    )
    return _save(fig, out)


def convlikeness_rows(
    results: Sequence[LayerConvLikeness], names: Sequence[str] | None = None
) -> list[list[str]]:
    """Table rows (header first): one per layer (its name, score, distinct offsets, kernel) with
    per-head details."""
    rows = [
        ["layer", "score", "min head", "stability", "distinct offsets", "kernel", "modal offsets"]
    ]
    for li, r in enumerate(results):
        kern = (
            f"{r.kernel}x{r.kernel}" + (f" dil {r.dilation}" if r.dilation > 1 else "")
            if r.kernel
            else "-"
        )
        rows.append(
            [
                names[li] if names is not None else str(li + 1),
                f"{r.score:.3f}",
                f"{min(r.head_scores):.3f}",
                f"{sum(r.stability) / len(r.stability):.3f}",
                "yes" if r.distinct else "no",
                kern,
                " ".join(f"({a},{b})" for a, b in r.offsets),
            ]
        )
    return rows
