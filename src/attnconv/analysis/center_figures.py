"""Figures of where the heads look, in offsets (key - query) on the token grid (Cordonnier et al.
2020 fig. 3): each head's mass contours around the query, and its centre's trajectory over
training (PNG and GIF). A head keeps one colour in every panel, named by the figure's legend."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.lines import Line2D

from .centers import contour_lines
from .figures import _head_colors, _np, _plain, _save, integer_ticks, plt
from .maps import scale_query


def _offset_axes(ax, radius: float, label: bool = True):
    ax.plot([0], [0], marker="*", color="black", markersize=10, zorder=5)
    ax.set_xlim(-radius, radius)
    ax.set_ylim(radius, -radius)  # image convention: rows grow downwards
    ax.set_aspect("equal")
    ax.grid(True, lw=0.3, alpha=0.5)
    integer_ticks(ax)
    if label:
        ax.set_xlabel("column offset (tokens)", fontsize=8)
        ax.set_ylabel("row offset (tokens)", fontsize=8)
    ax.tick_params(labelsize=7)


LEGEND_IN = 1.6  # inches kept at the right of the panels for the legend


def _panels(n: int, width: float, height: float):
    """A figure of ``n`` panels, 3 to a row (the spare ones hidden), room for a legend."""
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fw, fh = width * cols + LEGEND_IN, height * rows + 0.6
    fig, axes = plt.subplots(rows, cols, figsize=(fw, fh), squeeze=False)
    fig.subplots_adjust(right=1 - LEGEND_IN / fw, top=1 - 0.7 / fh, bottom=0.5 / fh, hspace=0.4)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, axes


def _legend(fig, heads: int, extra: Sequence[Line2D] = ()) -> None:
    """One legend for the figure: a colour per head, then what the line styles and markers mean."""
    colors = _head_colors(heads)
    handles = [Line2D([], [], color=colors[h], lw=2, label=f"head {h + 1}") for h in range(heads)]
    x, y = 1 - (LEGEND_IN - 0.15) / fig.get_figwidth(), 1 - 0.7 / fig.get_figheight()
    fig.legend(
        handles=handles + list(extra),
        loc="upper left",
        bbox_to_anchor=(x, y),
        fontsize=8,
        frameon=False,
    )


def _contours(p: np.ndarray, fractions: Sequence[float]) -> list[tuple[np.ndarray, str]]:
    """(polyline, line style) of one head's contours, solid then dashed; none for a head with no
    mass on the grid (a converted conv whose tap lies in the padding at a border query)."""
    if not p.sum() > 0:
        return []
    return [(ln, ls) for f, ls in zip(fractions, ("-", "--")) for ln in contour_lines(p, f)]


def plot_mass_contours(
    maps: Sequence[torch.Tensor],
    query: Sequence[int],
    grid: Sequence[int],
    out: str | Path,
    *,
    centers: Sequence[torch.Tensor] | None = None,
    fractions: tuple[float, float] = (0.5, 0.9),
    title: str = "",
    names: Sequence[str] | None = None,
) -> Path:
    """Per layer, each head's contours holding 50% (solid) and 90% (dashed) of its mass around
    the query (star), in offsets (key - query) on the token grid; crosses = ``centers`` (Delta).
    A head without mass on the grid (its key in a converted conv's padding) draws no contour.
    ``names`` title the panels (default "layer 1", ...)."""
    nl = len(maps)
    fig, axes = _panels(nl, 3.6, 3.5)
    for li, m in enumerate(maps):
        m = _np(m).astype(np.float64)
        qr, qc = scale_query(query, grid, m.shape[-2:])
        ax = axes.flat[li]
        colors = _head_colors(m.shape[0])
        radius = 2.0
        for hd in range(m.shape[0]):
            lines = _contours(m[hd], fractions)
            for ln, ls in lines:  # a head with no mass: none
                ax.plot(ln[:, 1] - qc, ln[:, 0] - qr, ls=ls, color=colors[hd], lw=1.2)
                radius = max(
                    radius, float(np.abs(ln[:, 0] - qr).max()), float(np.abs(ln[:, 1] - qc).max())
                )
            if centers is not None and li < len(centers):
                cr, cc = _np(centers[li])[hd]
                ax.plot([cc], [cr], marker="x", color=colors[hd], markersize=7, mew=2)
                radius = max(radius, abs(cr), abs(cc))
        _offset_axes(ax, radius + 0.8)
        ax.set_title(_plain(names[li]) if names is not None else f"layer {li + 1}", fontsize=9)
    keys = [
        Line2D([], [], color="gray", ls=ls, label=f"{int(f * 100)}% of the mass")
        for f, ls in zip(fractions, ("-", "--"))
    ]
    keys.append(Line2D([], [], color="black", marker="*", ls="", label="query"))
    if centers is not None:
        keys.append(Line2D([], [], color="gray", marker="x", ls="", mew=2, label="head centre"))
    _legend(fig, max(int(m.shape[0]) for m in maps), keys)
    fig.suptitle(
        _plain(title)
        or f"{int(fractions[0] * 100)}% (solid) / {int(fractions[1] * 100)}% (dashed) mass "
        "contours per head; star = query, x = centre",
        fontsize=10,
    )
    return _save(fig, out)


def _trajectory_frame(fig, axes, layers, upto: int, epochs, radius: float, unit: str = "epoch"):
    """The centres' paths up to epoch index ``upto``: each path drawn over its markers, a small
    hollow circle where it starts and an arrowhead on its last move, pointing where it went."""
    for li, traj in enumerate(layers):
        ax = axes.flat[li]
        ax.clear()
        colors = _head_colors(traj.shape[1])
        for hd in range(traj.shape[1]):
            t = traj[: upto + 1, hd]
            c = colors[hd]
            ax.plot(t[:, 1], t[:, 0], color=c, lw=1.2, zorder=3)
            ax.plot([t[0, 1]], [t[0, 0]], marker="o", mfc="none", mec=c, ms=5, mew=1, zorder=2)
            moved = np.flatnonzero(np.abs(t - t[-1]).max(1) > 1e-6)
            if len(moved):  # from the last point that differs from the end
                ax.annotate(
                    "",
                    xy=(t[-1, 1], t[-1, 0]),
                    xytext=(t[moved[-1], 1], t[moved[-1], 0]),
                    arrowprops={
                        "arrowstyle": "-|>",
                        "color": c,
                        "lw": 1.2,
                        "shrinkA": 0,
                        "shrinkB": 0,
                    },
                    zorder=4,
                )
        _offset_axes(ax, radius)
        ax.set_title(f"layer {li + 1}", fontsize=9)
    fig.suptitle(
        f"head centres, {unit} {epochs[upto]} (o = start, arrow = now, star = query)", fontsize=10
    )


def _trajectory_figure(layers, unit: str = "epoch"):
    fig, axes = _panels(len(layers), 3.4, 3.3)
    keys = [
        Line2D([], [], color="gray", marker="o", mfc="none", ls="", label=f"first {unit}"),
        Line2D([], [], color="gray", marker=">", ls="", label="last move"),
        Line2D([], [], color="black", marker="*", ls="", label="query"),
    ]
    _legend(fig, max(t.shape[1] for t in layers), keys)
    radius = max(2.0, max(float(np.abs(t).max()) for t in layers)) + 0.5
    return fig, axes, radius


def plot_center_trajectories(
    epochs: np.ndarray, layers: Sequence[np.ndarray], out: str | Path, *, unit: str = "epoch"
) -> Path:
    """Per layer, the trajectories (E, Nh, 2) of the head centres over the logged epochs (or
    steps: ``unit`` names what ``epochs`` counts)."""
    fig, axes, radius = _trajectory_figure(layers, unit)
    _trajectory_frame(fig, axes, layers, len(epochs) - 1, epochs, radius, unit)
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
