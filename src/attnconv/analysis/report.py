"""``analyze_model``: every figure a model has the parts for, plus ``index.md`` / ``index.html``
and ``report.json`` with the numbers behind them (what ``attnconv analyze`` writes).

The numbers come first, as typed data (``measure.measure_model`` -> ``AttentionAnalysis``);
``render_report`` then draws them: query maps (Cordonnier fig. 4-6), mass contours with head
centres (fig. 3), centre trajectories (PNG + GIF, from the run's ``centers.jsonl``), mean distance
vs depth and the position-embedding / patch-filter figures (ViT fig. 7), conv-likeness bars and
table.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from . import center_figures as C
from . import figures as F
from .centers import read_center_log
from .measure import AttentionAnalysis, measure_model

log = logging.getLogger(__name__)


def draw(figs: dict[str, str], key: str, plot: Callable[[], Path]) -> None:
    """``figs[key]`` = the name of the file ``plot()`` writes, said first: a figure of many
    layers takes seconds to draw."""
    log.info(f"analyze: drawing {key.replace('_', ' ')} (figure {len(figs) + 1})")
    figs[key] = plot().name


def analyze_model(
    model: nn.Module,
    images: torch.Tensor,
    out_dir: str | Path,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    labels: Sequence[str] | None = None,
    query: Sequence[int] | None = None,
    image_index: int = 0,
    zoom: int | None = 7,
    center_log: str | Path | None = None,
    title: str = "",
    batch_size: int = 25,
) -> dict:
    """Write the papers' figures of ``model``'s heads on ``images`` into ``out_dir``.

    Args:
        model: a model whose forward takes ``return_attention=True`` (the registry's).
        images: uint8 ``(N, 3, H, W)`` test images; the averages run over all of them.
        out_dir: the folder for the figures, report.json, index.md and index.html.
        mean: the normalization's per-channel mean (the checkpoint's).
        std: the normalization's per-channel std.
        labels: the images' class names, for the figures' titles.
        query: a pixel (row, col) of the image (default: the centre).
        image_index: the image of the single-image figures.
        zoom: the side of the zoomed figures' key window (None or 0: none).
        center_log: a run's centers.jsonl, for the centres' trajectories.
        title: the report's title.
        batch_size: images per forward.

    Returns:
        The report (also written as report.json): the figures' files and the tables.
    """
    res = measure_model(
        model,
        images,
        mean=mean,
        std=std,
        query=query,
        image_index=image_index,
        batch_size=batch_size,
    )
    img = images[image_index].permute(1, 2, 0).numpy() / 255.0
    lab = labels[image_index] if labels is not None else f"image {image_index}"
    return render_report(
        res,
        out_dir,
        image=img,
        label=lab,
        zoom=zoom,
        center_log=center_log,
        title=title,
        model_name=type(model).__name__,
    )


def render_report(
    res: AttentionAnalysis,
    out_dir: str | Path,
    *,
    image=None,
    label: str = "",
    zoom: int | None = 7,
    center_log: str | Path | None = None,
    title: str = "",
    model_name: str = "the model",
) -> dict:
    """Draw ``res`` into ``out_dir``: the figures, report.json, index.md and index.html. The
    figures an earlier analysis listed in the folder's report.json and this one does not draw
    are removed (nothing else is: a file the tool did not write stays)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = _figures_listed(out)
    grid, qtok, n = res.grid, res.query_token, res.images
    report: dict = {
        "title": title,
        "images": n,
        "image_size": list(res.image_size),
        "attention_grid": list(grid),
        "num_prefix_tokens": res.num_prefix_tokens,
        "query_pixel": list(res.query_pixel),
        "query_token": list(qtok),
        "figures": {},
    }
    figs = report["figures"]
    tables: dict[str, list[list[str]]] = {}
    if res.has_attention:
        single, avg, names = res.single, res.average, res.layer_names
        where = f"query pixel {res.query_pixel} (token {qtok})"
        # position-only attention (shared maps, measure_model) is the same for every image:
        # one figure, not a copy of it; equal maps of one image say nothing about the others
        same = res.shared
        report["same_for_every_image"] = same
        if not same:
            draw(
                figs,
                "attention_single",
                lambda: F.plot_query_maps(
                    single,
                    qtok,
                    grid,
                    out / "attention_single.png",
                    image=image,
                    title=f"attention of every head for {where}, {label}",
                    names=names,
                ),
            )
        every = "the same for every image (position only)" if same else f"averaged over {n} images"
        draw(
            figs,
            "attention_average",
            lambda: F.plot_query_maps(
                avg,
                qtok,
                grid,
                out / "attention_average.png",
                title=f"attention of every head for {where}, {every}",
                names=names,
            ),
        )
        if zoom and any(max(m.shape[-2:]) > zoom for m in avg):
            if not same:
                draw(
                    figs,
                    "attention_single_zoom",
                    lambda: F.plot_query_maps(
                        single,
                        qtok,
                        grid,
                        out / "attention_single_zoom.png",
                        image=image,
                        zoom=zoom,
                        title=f"{zoom}x{zoom} keys around {where}, {label}",
                        names=names,
                    ),
                )
            draw(
                figs,
                "attention_average_zoom",
                lambda: F.plot_query_maps(
                    avg,
                    qtok,
                    grid,
                    out / "attention_average_zoom.png",
                    zoom=zoom,
                    title=f"{zoom}x{zoom} keys around {where}, {every}",
                    names=names,
                ),
            )
        use_c = res.centers if len(res.centers) == len(avg) else None
        draw(
            figs,
            "mass_contours",
            lambda: C.plot_mass_contours(
                avg,
                qtok,
                grid,
                out / "mass_contours.png",
                centers=use_c,
                title=f"50% (solid) / 90% (dashed) of each head's mass for {where}, average of {n} "
                "images; x = head centre"
                if use_c
                else "",
                names=names,
            ),
        )
        draw(
            figs,
            "mean_distance",
            lambda: F.plot_mean_distance(
                res.mean_distance,
                out / "mean_distance.png",
                uniform=res.uniform_distance,
                title=f"mean attention distance per head ({n} images)",
                names=names,
            ),
        )
        draw(
            figs,
            "conv_likeness",
            lambda: F.plot_convlikeness(res.conv_likeness, out / "conv_likeness.png", names=names),
        )
        report["layers"] = [
            {"name": name, "grid": list(g), "heads": int(m.shape[0])}
            for name, g, m in zip(names, res.layer_grids, avg)
        ]
        report["mean_distance_px"] = [d.tolist() for d in res.mean_distance]
        report["uniform_distance_px"] = res.uniform_distance
        report["conv_likeness"] = [
            {
                "score": r.score,
                "head_scores": r.head_scores,
                "stability": r.stability,
                "peak": r.peak,
                "offsets": [list(o) for o in r.offsets],
                "kernel": r.kernel,
                "dilation": r.dilation,
                "distinct": r.distinct,
            }
            for r in res.conv_likeness
        ]
        tables["mean_distance"] = [["layer", "mean distance per head (px)"]] + [
            [name, " ".join(f"{v:.2f}" for v in d.tolist())]
            for name, d in zip(names, res.mean_distance)
        ]
        tables["conv_likeness"] = F.convlikeness_rows(res.conv_likeness, names)
        report["conv_likeness_table"] = _md_table(tables["conv_likeness"])
    if res.centers:
        report["centers"] = [c.tolist() for c in res.centers]
    if res.grid_scores:
        report["grid_score"] = [g.to_dict() for g in res.grid_scores]
    if center_log is not None and Path(center_log).is_file():
        epochs, traj = read_center_log(center_log)
        draw(
            figs,
            "center_trajectories",
            lambda: C.plot_center_trajectories(epochs, traj, out / "center_trajectories.png"),
        )
        draw(
            figs,
            "center_trajectories_gif",
            lambda: C.save_center_gif(epochs, traj, out / "center_trajectories.gif"),
        )
        report["center_log"] = {"path": str(center_log), "epochs": [int(e) for e in epochs]}
    if res.position_similarity is not None:
        draw(
            figs,
            "position_similarity",
            lambda: F.plot_position_similarity(
                res.position_similarity, out / "position_similarity.png"
            ),
        )
    if res.patch_pcs is not None:
        draw(
            figs,
            "patch_pcs",
            lambda: F.plot_patch_pcs(
                res.patch_pcs, out / "patch_pcs.png", ratios=res.patch_pc_variance
            ),
        )
        report["patch_pc_variance"] = res.patch_pc_variance.tolist()
    if not figs:
        raise ValueError(
            f"{model_name} has no attention maps, position embeddings or patch "
            "embedding: nothing to analyze"
        )
    (out / "report.json").write_text(json.dumps(report, indent=1))
    write_index(report, out, tables)
    for name in before - set(figs.values()):  # the last analysis's, not drawn again: stale
        (out / name).unlink(missing_ok=True)
    return report


def _figures_listed(out: Path) -> set[str]:
    """The figure files (plain .png names in ``out``) the folder's report.json lists."""
    try:
        names = json.loads((out / "report.json").read_text())["figures"].values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    return {n for n in names if isinstance(n, str) and Path(n).name == n and n.endswith(".png")}


def _md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


CAPTIONS = {
    "attention_single": "Attention of every head (columns) of every layer (rows) for the query "
    "(red +) of one test image (Cordonnier et al. fig. 4-6).",
    "attention_single_zoom": "The same, zoomed on the keys around the query.",
    "attention_average": "The same query, attention averaged over the images.",
    "attention_average_zoom": "The average, zoomed on the keys around the query.",
    "mass_contours": "Contours holding 50% (solid) and 90% (dashed) of each head's averaged "
    "attention around the query (star), x = the head's learned centre (quadratic layers).",
    "center_trajectories": "Head centres over training (o = first logged epoch, arrowhead = the "
    "last move) (Cordonnier et al. fig. 3).",
    "center_trajectories_gif": "Animation of the head centres over training.",
    "mean_distance": "Mean attention distance of every head against depth, in image pixels "
    "(ViT fig. 7 right); dashed: a uniform head.",
    "conv_likeness": "Conv-likeness: mass on each head's modal relative offset and how stable "
    "that offset is across queries and images (1 = exactly a convolution tap, Lemma 1).",
    "position_similarity": "Cosine similarity between the position embedding of each patch "
    "and all others (ViT fig. 7 centre).",
    "patch_pcs": "Principal components of the RGB patch-embedding filters (ViT fig. 7 left).",
}


def write_index(report: dict, out: Path, tables: dict[str, list[list[str]]]) -> None:
    """index.md and index.html (self-contained, relative image links) listing the figures, each
    followed by its table of ``tables`` (rows of cells, header first) if it has one."""
    figs = report["figures"]
    title = report.get("title") or "attention analysis"
    intro = (
        f"{report['images']} images of {report['image_size'][0]}x{report['image_size'][1]} "
        f"pixels, token grid {report['attention_grid'][0]}x{report['attention_grid'][1]}"
        f"{' + class token' if report['num_prefix_tokens'] else ''}; query pixel "
        f"{tuple(report['query_pixel'])} = token {tuple(report['query_token'])}."
    )
    md = [f"# {title}", "", intro, ""]
    parts = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(intro)}</p>"]
    for key, name in figs.items():
        cap = CAPTIONS.get(key, key)
        md += [f"## {key.replace('_', ' ')}", "", cap, "", f"![{key}]({name})", ""]
        parts.append(f"<h2>{html.escape(key.replace('_', ' '))}</h2><p>{html.escape(cap)}</p>")
        parts.append(
            f'<img src="{html.escape(name)}" alt="{html.escape(key)}" style="max-width:100%">'
        )
        if key in tables:
            md += [_md_table(tables[key]), ""]
            parts.append(_html_table(tables[key]))
    (out / "index.md").write_text("\n".join(md))
    page = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>'
        + html.escape(title)
        + "</title><style>body{font-family:sans-serif;max-width:1500px;margin:16px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
        "font-size:13px}</style></head><body>" + "\n".join(parts) + "</body></html>\n"
    )
    (out / "index.html").write_text(page)


def _html_table(rows: list[list[str]]) -> str:
    head, *body = rows
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    return f"<table><tr>{h}</tr>{b}</table>"
