"""Matplotlib figures (Agg backend) of the analyses: each ``plot_*`` writes a PNG, returns its path.

Cordonnier et al. 2020 fig. 3-6 (query maps, centres, contours, trajectories) and Dosovitskiy et al.
2021 fig. 7 (patch-filter PCs, position-embedding similarity, mean attention distance).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from .centers import contour_lines  # noqa: E402
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
) -> Path:
    """Layers x heads grid of one query's attention maps (Nh, h, w) per layer, query marked.

    ``image`` (H, W, 3) in [0, 1] adds a first column showing the input with the query's token.
    ``zoom`` crops each map to a zoom x zoom window of keys around the query. One colour scale
    per layer (colourbar at the row's end), in attention probability.
    """
    nl, nh = len(maps), max(int(m.shape[0]) for m in maps)
    extra = 1 if image is not None else 0
    fig, axes = plt.subplots(
        nl,
        nh + extra,
        figsize=(1.5 * (nh + extra) + 1.0, 1.5 * nl + 0.8),
        squeeze=False,
        layout="constrained",
    )
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
            ax.set_xticks([]) if li < nl - 1 else ax.set_xlabel("key col", fontsize=7)
            if hd > 0:
                ax.set_yticks([])
            else:
                ax.set_ylabel("key row" if extra else f"layer {li + 1}\nkey row", fontsize=7)
            ax.tick_params(labelsize=6)
            if li == 0:
                ax.set_title(f"head {hd + 1}", fontsize=8)
        if im is not None:
            cb = fig.colorbar(im, ax=list(axes[li, extra:]), fraction=0.02, pad=0.01)
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
            ax.set_ylabel(f"layer {li + 1}", fontsize=8)
            if li == 0:
                ax.set_title("query", fontsize=8)
    if title:
        fig.suptitle(_plain(title), fontsize=10)
    return _save(fig, out)


def _offset_axes(ax, radius: float, label: bool = True):
    ax.plot([0], [0], marker="*", color="black", markersize=10, zorder=5)
    ax.set_xlim(-radius, radius)
    ax.set_ylim(radius, -radius)  # image convention: rows grow downwards
    ax.set_aspect("equal")
    ax.grid(True, lw=0.3, alpha=0.5)
    if label:
        ax.set_xlabel("column offset (tokens)", fontsize=8)
        ax.set_ylabel("row offset (tokens)", fontsize=8)
    ax.tick_params(labelsize=7)


def plot_mass_contours(
    maps: Sequence[torch.Tensor],
    query: Sequence[int],
    grid: Sequence[int],
    out: str | Path,
    *,
    centers: Sequence[torch.Tensor] | None = None,
    fractions: tuple[float, float] = (0.5, 0.9),
    title: str = "",
) -> Path:
    """Per layer, each head's contours holding 50% (solid) and 90% (dashed) of its mass around
    the query (star), in offsets (key - query) on the token grid; crosses = ``centers`` (Delta)."""
    nl = len(maps)
    cols = min(nl, 3)
    rows = (nl + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.5 * rows + 0.6), squeeze=False)
    for li, m in enumerate(maps):
        m = _np(m).astype(np.float64)
        qr, qc = scale_query(query, grid, m.shape[-2:])
        ax = axes.flat[li]
        colors = _head_colors(m.shape[0])
        radius = 2.0
        for hd in range(m.shape[0]):
            for f, ls in zip(fractions, ("-", "--")):
                for ln in contour_lines(m[hd], f):
                    ax.plot(ln[:, 1] - qc, ln[:, 0] - qr, ls=ls, color=colors[hd], lw=1.2)
                    radius = max(
                        radius,
                        float(np.abs(ln[:, 0] - qr).max()),
                        float(np.abs(ln[:, 1] - qc).max()),
                    )
            if centers is not None and li < len(centers):
                cr, cc = _np(centers[li])[hd]
                ax.plot([cc], [cr], marker="x", color=colors[hd], markersize=7, mew=2)
                radius = max(radius, abs(cr), abs(cc))
        _offset_axes(ax, radius + 0.8)
        ax.set_title(f"layer {li + 1}", fontsize=9)
    for ax in list(axes.flat)[nl:]:
        ax.axis("off")
    fig.suptitle(
        _plain(title)
        or f"{int(fractions[0] * 100)}% (solid) / {int(fractions[1] * 100)}% (dashed) mass "
        "contours per head; star = query, x = centre",
        fontsize=10,
    )
    return _save(fig, out)


def _trajectory_frame(fig, axes, layers, upto: int, epochs, radius: float):
    for li, traj in enumerate(layers):
        ax = axes.flat[li]
        ax.clear()
        colors = _head_colors(traj.shape[1])
        for hd in range(traj.shape[1]):
            t = traj[: upto + 1, hd]
            ax.plot(t[:, 1], t[:, 0], color=colors[hd], lw=1.0, alpha=0.8)
            ax.plot([t[0, 1]], [t[0, 0]], marker="o", color=colors[hd], markersize=3)
            ax.plot([t[-1, 1]], [t[-1, 0]], marker="x", color=colors[hd], markersize=7, mew=2)
        _offset_axes(ax, radius)
        ax.set_title(f"layer {li + 1}", fontsize=9)
    fig.suptitle(
        f"head centres, epoch {epochs[upto]} (o = start, x = now, star = query)", fontsize=10
    )


def _trajectory_figure(layers):
    nl = len(layers)
    cols = min(nl, 3)
    rows = (nl + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.3 * rows + 0.5), squeeze=False)
    for ax in list(axes.flat)[nl:]:
        ax.axis("off")
    radius = max(2.0, max(float(np.abs(t).max()) for t in layers)) + 0.5
    return fig, axes, radius


def plot_center_trajectories(
    epochs: np.ndarray, layers: Sequence[np.ndarray], out: str | Path
) -> Path:
    """Per layer, the trajectories (E, Nh, 2) of the head centres over the logged epochs."""
    fig, axes, radius = _trajectory_figure(layers)
    _trajectory_frame(fig, axes, layers, len(epochs) - 1, epochs, radius)
    return _save(fig, out)


def save_center_gif(
    epochs: np.ndarray,
    layers: Sequence[np.ndarray],
    out: str | Path,
    *,
    max_frames: int = 40,
    ms: int = 200,
) -> Path:
    """Animated GIF (Pillow) of the head centres moving over training, one frame per epoch."""
    from PIL import Image

    n = len(epochs)
    idx = sorted({int(round(i)) for i in np.linspace(0, n - 1, min(n, max_frames))})
    fig, axes, radius = _trajectory_figure(layers)
    frames = []
    for i in idx:
        _trajectory_frame(fig, axes, layers, i, epochs, radius)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=70)
        buf.seek(0)
        frames.append(Image.open(buf).convert("P", palette=Image.Palette.ADAPTIVE))
    plt.close(fig)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=ms, loop=0)
    return out


def plot_mean_distance(
    distances: Sequence[torch.Tensor],
    out: str | Path,
    *,
    uniform: float | None = None,
    title: str = "",
) -> Path:
    """Mean attention distance (pixels) of every head (dots) against depth (layer index)."""
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    nh = max(len(d) for d in distances)
    colors = _head_colors(nh)
    for li, d in enumerate(distances):
        d = _np(d)
        for hd, v in enumerate(d):
            ax.scatter(
                [li + 1], [v], color=colors[hd], s=22, label=f"head {hd + 1}" if li == 0 else None
            )
    if uniform is not None:
        ax.axhline(uniform, color="gray", ls="--", lw=1, label="uniform attention")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(range(1, len(distances) + 1))
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


def plot_convlikeness(results: Sequence[LayerConvLikeness], out: str | Path) -> Path:
    """Bar chart per layer and head: mass on the modal offset (top) and its stability (bottom)."""
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
                    label=f"head {hd + 1}" if li == 0 else None,
                )
            if key == "head_scores":
                ax.plot([li + 0.6, li + 1.4], [r.score] * 2, color="black", lw=1.2)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(lab, fontsize=8)
        ax.axhline(1.0, color="gray", ls=":", lw=0.8)
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    axes[1].set_xticks(range(1, nl + 1))
    axes[1].set_xlabel("layer")
    axes[0].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[0].set_title(
        "conv-likeness per head (black line = layer score; 1 = a convolution)", fontsize=9
    )
    return _save(fig, out)


def convlikeness_rows(results: Sequence[LayerConvLikeness]) -> list[list[str]]:
    """Table rows (header first): one per layer (score, distinct offsets, kernel) with per-head
    details."""
    rows = [
        ["layer", "score", "min head", "stability", "distinct offsets", "kernel", "modal offsets"]
    ]
    for li, r in enumerate(results):
        kern = (
            f"{r.kernel}x{r.kernel}" + (f" dil {r.dilation}" if r.dilation > 1 else "")
            if r.kernel
            else "-"
        )
        rows.append([
            str(li + 1), f"{r.score:.3f}", f"{min(r.head_scores):.3f}",
            f"{sum(r.stability) / len(r.stability):.3f}", "yes" if r.distinct else "no", kern,
            " ".join(f"({a},{b})" for a, b in r.offsets),
        ])  # fmt: skip
    return rows
