"""The interactive attention explorer: one self-contained HTML page (no network, data inlined).

The page shows test images; clicking a pixel shows, for the query token under it, the attention
of every head of every layer (Cordonnier et al. 2020 fig. 4-6, interactively), for that image or
averaged over many test images. Everything the page needs is in the file: the template
``explorer.html`` (HTML + CSS + JS) and a JSON blob with the images (raw RGB bytes, base64) and
the attention rows of the stored queries (``encode_rows``: quantized to uint8, each row scaled
to its maximum and cut to the box of keys it attends to). Maps equal across images (position-only
attention, as in a converted CNN) are stored once per layer, and the page decodes a layer's maps
only when it draws them. A Content-Security-Policy forbids every fetch.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from .maps import Grid, iter_attention, layer_names

TEMPLATE = "explorer.html"
PLACEHOLDER = "/*__EXPLORER_DATA__*/"


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def query_subgrid(lgrid: Grid, max_queries: int) -> tuple[Grid, int, torch.Tensor]:
    """Queries kept for a layer: every ``stride``-th token (centred), at most ``max_queries``.

    Returns (query grid (qh, qw), stride, (qh*qw,) token indices into the layer's h*w tokens).
    """
    h, w = lgrid
    if max_queries < 1:
        raise ValueError(f"max_queries must be >= 1, got {max_queries}")
    s = 1
    while math.ceil(h / s) * math.ceil(w / s) > max_queries:
        s += 1
    rows = torch.arange(min(s // 2, h - 1), h, s)
    cols = torch.arange(min(s // 2, w - 1), w, s)
    idx = (rows[:, None] * w + cols[None, :]).reshape(-1)
    return (len(rows), len(cols)), s, idx


def encode_rows(rows: torch.Tensor, grid: Grid) -> dict:
    """(Nh, Q, h*w) probs of one layer -> the page's form of its maps.

    Each (head, query) row is scaled to its maximum ("peaks", float32) and quantized to uint8;
    only the smallest box of keys holding its nonzero values is kept ("boxes": row0, col0, rows,
    cols as uint16; "maps": the boxes' values, row-major, one after another). A hard (one-hot)
    head keeps one byte per row, a global one its whole map. All base64, little-endian.
    """
    h, w = (int(g) for g in grid)
    r = rows.double()
    peak = r.amax(-1, keepdim=True).clamp_min(1e-30)
    q = torch.round(r / peak * 255.0).clamp(0, 255).to(torch.uint8).reshape(-1, h, w).numpy()
    on_rows, on_cols = (q > 0).any(2), (q > 0).any(1)  # (R, h), (R, w)
    r0, c0 = on_rows.argmax(1), on_cols.argmax(1)
    nr = np.where(on_rows.any(1), h - on_rows[:, ::-1].argmax(1) - r0, 0)
    nc = np.where(on_cols.any(1), w - on_cols[:, ::-1].argmax(1) - c0, 0)
    if (nr == h).all() and (nc == w).all():
        vals = q.reshape(-1)
    elif (nr * nc <= 1).all():  # hard heads: one key (or none, in the padding) per row
        i = np.flatnonzero(nr)
        vals = q[i, r0[i], c0[i]]
    else:
        vals = np.concatenate(
            [
                q[i, r0[i] : r0[i] + nr[i], c0[i] : c0[i] + nc[i]].reshape(-1)
                for i in range(q.shape[0])
            ]
        )
    boxes = np.stack([r0 * (nr > 0), c0 * (nc > 0), nr, nc], 1).astype("<u2")
    peaks = peak[..., 0].numpy().astype("<f4")
    return {"maps": _b64(vals), "boxes": _b64(boxes), "peaks": _b64(peaks)}


def decode_rows(entry: dict, heads: int, grid: Grid) -> np.ndarray:
    """``encode_rows``'s entry back to (Nh, Q, h*w) uint8 (what the page draws)."""
    h, w = grid
    vals = np.frombuffer(base64.b64decode(entry["maps"]), np.uint8)
    boxes = np.frombuffer(base64.b64decode(entry["boxes"]), "<u2").reshape(-1, 4).astype(int)
    out = np.zeros((len(boxes), h, w), np.uint8)
    k = 0
    for i, (r0, c0, nr, nc) in enumerate(boxes):
        out[i, r0 : r0 + nr, c0 : c0 + nc] = vals[k : k + nr * nc].reshape(nr, nc)
        k += nr * nc
    return out.reshape(heads, -1, h * w)


def _viridis() -> list[list[int]]:
    import matplotlib

    lut = matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3]
    return np.round(lut * 255).astype(int).tolist()


def build_data(
    images: torch.Tensor,
    single: Sequence[Sequence[torch.Tensor]],
    average: Sequence[torch.Tensor] | None,
    grid: Grid,
    *,
    num_prefix_tokens: int = 0,
    layer_grids: Sequence[Grid] | None = None,
    names: Sequence[str] | None = None,
    num_average: int = 0,
    labels: Sequence[str] | None = None,
    title: str = "attention explorer",
    max_queries: int = 256,
    rows: bool = False,
    note: str = "",
) -> dict:
    """The page's data from attention already computed.

    ``images`` (n, 3, H, W) uint8; ``single[i][l]`` image i's layer-l attention (Nh, T, T);
    ``average[l]`` (Nh, T, T) averaged over ``num_average`` images (or None). Instead of full
    maps, ``rows=True`` takes the stored query rows (Nh, Q, hw), as ``collect_attention`` returns.
    ``layer_grids[l]`` is layer l's token grid (``AttentionMap.grid``); default: every layer on
    ``grid``. ``names`` label the layers (default "layer 1", ...). Layer l's distinct maps
    are ``layers[l]["maps"]``; ``single[i][l]`` and ``average[l]`` index them.
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(
            f"images must be uint8 (n, 3, H, W), got {images.dtype} {tuple(images.shape)}"
        )
    if len(single) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but attention for {len(single)}")
    ref = single[0] if single else average
    layers, picks = [], []
    if layer_grids is not None and len(layer_grids) != len(ref):
        raise ValueError(f"{len(layer_grids)} layer grids for {len(ref)} attention layers")
    if names is not None and len(names) != len(ref):
        raise ValueError(f"{len(names)} layer names for {len(ref)} attention layers")
    for li, a in enumerate(ref):
        if a.dim() != 3:
            raise ValueError(f"attention of layer {li} must be (Nh, T, T), got {tuple(a.shape)}")
        lg = tuple(int(g) for g in (grid if layer_grids is None else layer_grids[li]))
        t = a.shape[-1] - (0 if rows else num_prefix_tokens)  # rows: keys without the prefix
        if t != lg[0] * lg[1]:
            raise ValueError(
                f"attention of layer {li} has {t} spatial keys, not the {lg[0]}x{lg[1]} grid"
            )
        qg, stride, idx = query_subgrid(lg, max_queries)
        name = str(names[li]) if names is not None else f"layer {li + 1}"
        layers.append(
            {
                "name": name,
                "grid": list(lg),
                "heads": int(a.shape[0]),
                "qgrid": list(qg),
                "stride": stride,
                "maps": [],
            }
        )
        picks.append(idx + num_prefix_tokens)

    def enc(attn_layers):
        if len(attn_layers) != len(layers):
            raise ValueError(f"expected {len(layers)} attention layers, got {len(attn_layers)}")
        out = []
        for L, a, idx in zip(layers, attn_layers, picks):
            hw = L["grid"][0] * L["grid"][1]
            want = (len(idx), hw) if rows else (num_prefix_tokens + hw,) * 2
            if tuple(a.shape[-2:]) != want:
                raise ValueError(
                    f"{L['name']}: attention of shape {tuple(a.shape)}, expected (Nh, {want[0]}, "
                    f"{want[1]}) like the first one"
                )
            e = encode_rows(a if rows else a[:, idx, num_prefix_tokens:], L["grid"])
            if e not in L["maps"]:  # equal maps (position-only attention) are stored once
                L["maps"].append(e)
            out.append(L["maps"].index(e))
        return out

    h, w = images.shape[2:]
    return {
        "title": str(title),
        "note": str(note),
        "image": [int(h), int(w)],
        "grid": [int(grid[0]), int(grid[1])],
        "prefix": int(num_prefix_tokens),
        "images": [
            {
                "label": str(labels[i]) if labels is not None else f"image {i}",
                "pixels": _b64(images[i].permute(1, 2, 0).numpy()),  # (H, W, 3) RGB bytes
            }
            for i in range(images.shape[0])
        ],
        "single": [enc(s) for s in single],
        "average": enc(average) if average is not None else None,
        "layers": layers,
        "num_average": int(num_average),
        "colormap": _viridis(),
    }


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float, (x / 255 - mean) / std per channel."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (images.float() / 255.0 - m) / s


@torch.no_grad()
def collect_attention(
    model: nn.Module,
    images: torch.Tensor,
    average_images: torch.Tensor | None,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    max_queries: int = 256,
    batch_size: int = 25,
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor] | None, int, list[Grid], bool]:
    """Run ``model``: the stored query rows (Nh, Q, hw) per layer of every shown image, and of
    the average over ``average_images`` (prefix keys dropped). Returns (single, average, n,
    layer grids, shared). ``shared``: the maps are position-only (batch 1, ``AttentionMap``), the
    same for every image: ``iter_attention`` runs two images only."""
    picks: list[torch.Tensor] = []
    grids: list[Grid] = []

    def pick(maps):
        if not picks:
            for m in maps:
                grids.append(m.grid)
                picks.append(query_subgrid(m.grid, max_queries)[2] + m.num_prefix_tokens)
        return [  # (B, Nh, Q, hw)
            m.probs[:, :, idx, m.num_prefix_tokens :].float() for m, idx in zip(maps, picks)
        ]

    def batches(x, desc):  # position-only maps (batch 1) come once for all images
        for start, stop, attns in iter_attention(
            model, normalize(x, mean, std), batch_size, desc=desc
        ):
            r = pick(attns)
            flags.append(stop - start > 1 and all(a.shape[0] == 1 for a in r))
            yield stop - start, r

    flags: list[bool] = []
    single = []
    for b, r in batches(images, "explore: images shown"):
        single += [[x[min(i, x.shape[0] - 1)] for x in r] for i in range(b)]
    if average_images is None or average_images.shape[0] == 0:
        return single, None, 0, grids, any(flags)
    sums, n = None, 0
    for b, r in batches(average_images, "explore: average"):
        r = [x.sum(0) * (b if x.shape[0] == 1 else 1) for x in r]  # a (1, ...) map: b images
        sums = r if sums is None else [s + x for s, x in zip(sums, r)]
        n += b
    return single, [s / n for s in sums], n, grids, any(flags)


def render_html(data: dict) -> str:
    """The page: the template with the data inlined as JSON, escaped for a <script> element."""
    blob = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    # inside <script>, "</script>" or "<!--" would end or confuse the element: escape < > &
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    template = resources.files("attnconv.analysis").joinpath(TEMPLATE).read_text(encoding="utf-8")
    if template.count(PLACEHOLDER) != 1:
        raise ValueError(f"explorer template must contain {PLACEHOLDER} exactly once")
    return template.replace(PLACEHOLDER, blob)


def write_explorer(data: dict, out: str | Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"explorer output must be an .html file, got {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(data), encoding="utf-8")
    return out


def explore_model(
    model: nn.Module,
    images: torch.Tensor,
    out: str | Path,
    *,
    average_images: torch.Tensor | None = None,
    labels: Sequence[str] | None = None,
    mean: Sequence[float],
    std: Sequence[float],
    title: str = "attention explorer",
    max_queries: int = 256,
    batch_size: int = 25,
) -> Path:
    """Compute the attention of ``model`` on ``images`` and write the explorer page.

    Args:
        model: a model whose forward takes ``return_attention=True`` (the registry's).
        images: uint8 ``(N, 3, H, W)`` images shown one by one.
        out: the page's path (one self-contained HTML file).
        average_images: uint8 images of the average view (None: no average view).
        labels: the images' class names.
        mean: the normalization's per-channel mean (the checkpoint's).
        std: the normalization's per-channel std.
        title: the page's title.
        max_queries: the most query pixels kept per layer (a grid subsampled past it).
        batch_size: images per forward.

    Returns:
        The page's path.
    """
    single, avg, n, grids, shared = collect_attention(
        model,
        images,
        average_images,
        mean=mean,
        std=std,
        max_queries=max_queries,
        batch_size=batch_size,
    )
    data = build_data(
        images,
        single,
        avg,
        tuple(model.attention_grid),
        num_prefix_tokens=int(getattr(model, "num_prefix_tokens", 0)),
        layer_grids=grids,
        names=layer_names(model, len(grids)),
        num_average=n,
        labels=labels,
        title=title,
        max_queries=max_queries,
        rows=True,
        note="Position-only attention: the same maps for every image" if shared else "",
    )
    return write_explorer(data, out)
