"""Head centres of quadratic-encoding layers, their mass contours and trajectories over training.

Cordonnier et al. 2020, eq. 9 and fig. 3: a quadratic head puts a Gaussian of precision alpha on
q + Delta^(h); the centres Delta move during training until they form a grid around the query.
``attention_centers() -> (Nh, 2)`` (row, col offsets) is provided by quadratic layers.

The region holding a fraction f of a head's mass is the smallest set of keys whose probabilities
sum to >= f: keys sorted by probability, cut where the cumulative sum first reaches f. Its
contour is the level set of the map at that cut's probability.

Per-epoch centre log (written by training): ``centers.jsonl`` with one JSON object per line,
``{"epoch": int, "layers": [[[row, col], ...per head], ...per layer]}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from attnconv.layers.encodings.centers import head_centers

__all__ = ["head_centers", "mass_level", "mass_region", "contour_lines", "read_center_log"]

CENTER_LOG = "centers.jsonl"


def mass_level(prob: np.ndarray | torch.Tensor, fraction: float) -> float:
    """The probability level whose super-level set {p >= level} holds ``fraction`` of the mass."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"mass fraction must be in (0, 1], got {fraction}")
    p = np.asarray(prob, dtype=np.float64).ravel()
    total = p.sum()
    if not total > 0:
        raise ValueError("attention map has no mass")
    s = np.sort(p)[::-1]
    i = int(np.searchsorted(np.cumsum(s), fraction * total - 1e-12 * total))
    return float(s[min(i, s.size - 1)])


def mass_region(prob: np.ndarray | torch.Tensor, fraction: float) -> np.ndarray:
    """Boolean mask of the smallest set of keys holding ``fraction`` of the map's mass."""
    p = np.asarray(prob, dtype=np.float64)
    return p >= mass_level(p, fraction)


def contour_lines(prob: np.ndarray | torch.Tensor, fraction: float) -> list[np.ndarray]:
    """Polylines (n, 2) in (row, col) coordinates of the contour holding ``fraction`` of the mass.

    The level is set half-way between the cut probability and the next lower one, so the contour
    separates the region's keys from the others (a one-key region gets a small closed curve).
    """
    import contourpy

    p = np.asarray(prob, dtype=np.float64)
    lev = mass_level(p, fraction)
    below = p[p < lev]
    level = 0.5 * (lev + (below.max() if below.size else 0.0))
    padded = np.pad(p, 1, constant_values=min(0.0, p.min()))  # closes contours at the border
    gen = contourpy.contour_generator(z=padded, line_type="Separate")
    return [ln[:, ::-1] - 1.0 for ln in gen.lines(level)]  # (x, y) -> (row, col), undo the pad


def read_center_log(path: str | Path) -> tuple[np.ndarray, list[np.ndarray]]:
    """Read ``centers.jsonl`` -> (epochs (E,), per layer an (E, Nh, 2) array of centres)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"centre log not found: {path}")
    epochs, rows = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            epochs.append(int(rec["epoch"]))
            rows.append(
                [np.asarray(layer, dtype=np.float64).reshape(-1, 2) for layer in rec["layers"]]
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{n}: bad centre-log line ({e})") from None
        if not rows[-1] or any(a.shape[0] == 0 for a in rows[-1]):  # nothing to draw
            raise ValueError(f"{path}:{n}: bad centre-log line (a line without layers or heads)")
    if not rows:
        raise ValueError(f"{path}: centre log is empty")
    shapes = [tuple(a.shape for a in r) for r in rows]
    if len(set(shapes)) != 1:
        raise ValueError(f"{path}: layers/heads change between lines: {sorted(set(shapes))}")
    order = np.argsort(epochs, kind="stable")
    layers = [np.stack([rows[i][li] for i in order]) for li in range(len(rows[0]))]
    return np.asarray(epochs)[order], layers


def write_center_log_line(path: str | Path, epoch: int, centers: Sequence[torch.Tensor]) -> None:
    """Append one epoch's centres (list per layer of (Nh, 2)) to a ``centers.jsonl`` log."""
    rec = {"epoch": int(epoch), "layers": [torch.as_tensor(c).tolist() for c in centers]}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def find_center_log(checkpoint: str | Path) -> Path | None:
    """The run folder's ``centers.jsonl`` for a checkpoint path, if any: the path itself (a run
    folder), or up to two folders up (``run/checkpoints/step-N``)."""
    p = Path(checkpoint)
    d = p if p.is_dir() else p.parent
    for cand in (d, d.parent, d.parent.parent):
        if (cand / CENTER_LOG).is_file():
            return cand / CENTER_LOG
    return None
