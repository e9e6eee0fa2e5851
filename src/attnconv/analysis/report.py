"""``analyze_model``: every figure a model has the parts for, plus ``index.md`` / ``index.html``
and ``report.json`` with the numbers behind them (what ``attnconv analyze`` writes).

One pass over N test images accumulates: the attention of the query token (single image and
average), the mean attention distance per head, conv-likeness per head. Then the figures:
query maps (Cordonnier fig. 4-6), mass contours with head centres (fig. 3), centre trajectories
(PNG + GIF, from the run's ``centers.jsonl``), mean distance vs depth and the position-embedding
/ patch-filter figures (ViT fig. 7), conv-likeness bars and table.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn

from . import figures as F
from .centers import head_centers, read_center_log
from .convlike import ConvLikeness
from .distance import MeanDistance, pixel_distances
from .explorer import normalize
from .grid import grid_scores
from .maps import MapAverage, iter_attention, query_maps
from .posemb import (
    find_patch_embedding,
    find_position_embedding,
    patch_filter_pcs,
    position_similarity,
)


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
    """Write the figures for ``model`` on ``images`` (uint8 (N, 3, H, W)) into ``out_dir``.

    ``query`` is a pixel (row, col) of the image (default: the centre); ``image_index`` picks the
    image of the single-image figures. Returns the report (also written as report.json).
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(
            f"images must be uint8 (N, 3, H, W), got {images.dtype} {tuple(images.shape)}"
        )
    n, _, H, W = images.shape
    if not 0 <= image_index < n:
        raise ValueError(f"--image {image_index} is out of range for {n} images")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    q = (H // 2, W // 2) if query is None else (int(query[0]), int(query[1]))
    if not (0 <= q[0] < H and 0 <= q[1] < W):
        raise ValueError(f"query pixel {q} is outside the {H}x{W} image")
    grid = tuple(int(g) for g in getattr(model, "attention_grid", (H, W)))
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    qtok = (q[0] * grid[0] // H, q[1] * grid[1] // W)
    ppt = (H / grid[0], W / grid[1])  # image pixels per token
    report: dict = {
        "title": title,
        "images": int(n),
        "image_size": [int(H), int(W)],
        "attention_grid": list(grid),
        "num_prefix_tokens": prefix,
        "query_pixel": list(q),
        "query_token": list(qtok),
        "figures": {},
    }
    figs = report["figures"]

    # ---- one pass over the images
    avg = MapAverage(grid, queries=[qtok])
    dist: list[MeanDistance] = []
    conv: list[ConvLikeness] = []
    single = None
    x = normalize(images, mean, std)
    for seen, stop, attns in iter_attention(model, x, batch_size, allow_empty=True):
        b = stop - seen  # no attention maps (a CNN): no batches, only the embedding figures
        if not dist:
            dist = [MeanDistance(grid, ppt) for _ in attns]
            conv = [ConvLikeness() for _ in attns]
        avg.update(attns, batch=b)
        for a, d, c in zip(attns, dist, conv):
            d.update(a, batch=b)
            c.update(a, batch=b)
        if seen <= image_index < stop:
            single = query_maps(attns, grid, qtok, image=image_index - seen)

    img = images[image_index].permute(1, 2, 0).numpy() / 255.0
    lab = labels[image_index] if labels is not None else f"image {image_index}"
    centers = head_centers(model)
    if single is not None:
        maps_avg = [m[:, 0].reshape(-1, *g) for m, g in zip(avg.result(), avg.grids)]
        where = f"query pixel {q} (token {qtok})"
        figs["attention_single"] = F.plot_query_maps(
            single, qtok, grid, out / "attention_single.png", image=img,
            title=f"attention of every head for {where}, {lab}",
        ).name  # fmt: skip
        figs["attention_average"] = F.plot_query_maps(
            maps_avg, qtok, grid, out / "attention_average.png",
            title=f"attention of every head for {where}, averaged over {n} images",
        ).name  # fmt: skip
        if zoom and any(max(m.shape[-2:]) > zoom for m in maps_avg):
            figs["attention_single_zoom"] = F.plot_query_maps(
                single, qtok, grid, out / "attention_single_zoom.png", image=img, zoom=zoom,
                title=f"{zoom}x{zoom} keys around {where}, {lab}",
            ).name  # fmt: skip
            figs["attention_average_zoom"] = F.plot_query_maps(
                maps_avg, qtok, grid, out / "attention_average_zoom.png", zoom=zoom,
                title=f"{zoom}x{zoom} keys around {where}, averaged over {n} images",
            ).name  # fmt: skip
        use_c = centers if len(centers) == len(maps_avg) else None
        figs["mass_contours"] = F.plot_mass_contours(
            maps_avg, qtok, grid, out / "mass_contours.png", centers=use_c,
            title=f"50% (solid) / 90% (dashed) of each head's mass for {where}, average of {n} "
            "images; x = head centre" if use_c else "",
        ).name  # fmt: skip
        distances = [d.result() for d in dist]
        uniform = float(pixel_distances(grid, ppt).mean())
        figs["mean_distance"] = F.plot_mean_distance(
            distances, out / "mean_distance.png", uniform=uniform,
            title=f"mean attention distance per head ({n} images)",
        ).name  # fmt: skip
        conv_res = [c.result() for c in conv]
        figs["conv_likeness"] = F.plot_convlikeness(conv_res, out / "conv_likeness.png").name
        report["layers"] = [
            {"grid": list(g), "heads": int(m.shape[0])} for g, m in zip(avg.grids, maps_avg)
        ]
        report["mean_distance_px"] = [d.tolist() for d in distances]
        report["uniform_distance_px"] = uniform
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
            for r in conv_res
        ]
        report["conv_likeness_table"] = F.convlikeness_table(conv_res)
    if centers:
        report["centers"] = [c.tolist() for c in centers]
    scores = grid_scores(model, grid)
    if scores:
        report["grid_score"] = [g.to_dict() for g in scores]
    if center_log is not None and Path(center_log).is_file():
        epochs, traj = read_center_log(center_log)
        figs["center_trajectories"] = F.plot_center_trajectories(
            epochs, traj, out / "center_trajectories.png"
        ).name
        figs["center_trajectories_gif"] = F.save_center_gif(
            epochs, traj, out / "center_trajectories.gif"
        ).name
        report["center_log"] = {"path": str(center_log), "epochs": [int(e) for e in epochs]}

    pos = find_position_embedding(model)
    if pos is not None and pos.shape[0] == prefix + grid[0] * grid[1]:
        sim = position_similarity(pos, grid, prefix)
        figs["position_similarity"] = F.plot_position_similarity(
            sim, out / "position_similarity.png"
        ).name
    pe = find_patch_embedding(model)
    if pe is not None:
        pcs, ratio = patch_filter_pcs(pe.weight, 28)
        figs["patch_pcs"] = F.plot_patch_pcs(pcs, out / "patch_pcs.png", ratios=ratio).name
        report["patch_pc_variance"] = ratio.tolist()
    if not figs:
        raise ValueError(
            f"{type(model).__name__} has no attention maps, position embeddings or patch "
            "embedding: nothing to analyze"
        )
    (out / "report.json").write_text(json.dumps(report, indent=1))
    write_index(report, out)
    return report


def _md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


CAPTIONS = {
    "attention_single": "Attention of every head (columns) of every layer (rows) for the query "
    "(red +) of one test image (Cordonnier et al. fig. 4-6).",
    "attention_single_zoom": "The same, zoomed on the keys around the query.",
    "attention_average": "The same query, attention averaged over the test images.",
    "attention_average_zoom": "The average, zoomed on the keys around the query.",
    "mass_contours": "Contours holding 50% (solid) and 90% (dashed) of each head's averaged "
    "attention around the query (star), x = the head's learned centre (quadratic layers).",
    "center_trajectories": "Head centres over training (o = first logged epoch, x = last) "
    "(Cordonnier et al. fig. 3).",
    "center_trajectories_gif": "Animation of the head centres over training.",
    "mean_distance": "Mean attention distance of every head against depth, in image pixels "
    "(ViT fig. 7 right); dashed: a uniform head.",
    "conv_likeness": "Conv-likeness: mass on each head's modal relative offset and how stable "
    "that offset is across queries and images (1 = exactly a convolution tap, Lemma 1).",
    "position_similarity": "Cosine similarity between the position embedding of each patch "
    "and all others (ViT fig. 7 centre).",
    "patch_pcs": "Principal components of the RGB patch-embedding filters (ViT fig. 7 left).",
}


def write_index(report: dict, out: Path) -> None:
    """index.md and index.html (self-contained, relative image links) listing the figures."""
    figs = report["figures"]
    title = report.get("title") or "attention analysis"
    intro = (
        f"{report['images']} test images of {report['image_size'][0]}x{report['image_size'][1]} "
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
        if key == "mean_distance" and "mean_distance_px" in report:
            rows = [["layer", "mean distance per head (px)"]] + [
                [str(i + 1), " ".join(f"{v:.2f}" for v in d)]
                for i, d in enumerate(report["mean_distance_px"])
            ]
            md += [_md_table(rows), ""]
            parts.append(_html_table(rows))
        if key == "conv_likeness" and "conv_likeness_table" in report:
            md += [report["conv_likeness_table"], ""]
            rows = [
                [c.strip() for c in ln.strip("|").split("|")]
                for ln in report["conv_likeness_table"].splitlines()
                if not ln.startswith("|---")
            ]
            parts.append(_html_table(rows))
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
