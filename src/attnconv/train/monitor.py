"""What a run shows and records: progress bar, metrics.csv, TensorBoard, centres.jsonl.

Files in the run folder (written by rank 0):
  metrics.csv      kind (train | eval), epoch, step, lr, loss, acc, images_per_s, seconds
  centers.jsonl    per epoch {"epoch", "step", "layers": [[[row, col] per head] per layer]}
                   from ``attention_centers()`` of each quadratic layer (Cordonnier fig. 3)
On resume, rows / lines after the resumed step are dropped (they will be written again).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import torch.nn as nn

from attnconv.layers.centers import head_centers

from .runfolder import open_nofollow

COLUMNS = ["kind", "epoch", "step", "lr", "loss", "acc", "images_per_s", "seconds"]


def _truncate_csv(path: Path, step: int) -> None:
    if not path.is_file():
        return
    with open_nofollow(path, "r", newline="") as f:
        rows = list(csv.reader(f))
    keep = [r for r in rows[1:] if r and int(r[2]) <= step]
    with open_nofollow(path, "w", newline="") as f:
        csv.writer(f).writerows([COLUMNS] + keep)


def _truncate_jsonl(path: Path, step: int) -> None:
    if not path.is_file():
        return
    with open_nofollow(path, "r") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    keep = [ln for ln in lines if json.loads(ln)["step"] <= step]
    with open_nofollow(path, "w") as f:
        f.write("".join(ln + "\n" for ln in keep))


class Monitor:
    """Rank 0's logs. ``enabled=False`` (other ranks) makes every method a no-op."""

    def __init__(
        self,
        out: Path,
        *,
        enabled: bool,
        resume_step: int | None,
        progress: bool,
        tensorboard: bool,
        total_steps: int,
    ):
        self.enabled, self.total = enabled, total_steps
        self.progress = progress and enabled
        self.tty = sys.stderr.isatty()
        self.csv_path, self.centres_path = out / "metrics.csv", out / "centers.jsonl"
        self.t0 = time.time()
        self.tb = None
        if not enabled:
            return
        out.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            for p in (self.csv_path, self.centres_path):
                p.unlink(missing_ok=True)
        else:
            _truncate_csv(self.csv_path, resume_step)
            _truncate_jsonl(self.centres_path, resume_step)
        if not self.csv_path.is_file():
            with open_nofollow(self.csv_path, "w", newline="") as f:
                csv.writer(f).writerow(COLUMNS)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ValueError(
                    "train.tensorboard=true needs the tensorboard package "
                    "(pip install 'attnconv[tensorboard]')"
                ) from None
            self.tb = SummaryWriter(str(out / "tb"), purge_step=resume_step)

    def row(
        self,
        kind: str,
        epoch: int,
        step: int,
        lr: float,
        loss: float,
        acc: float,
        images_per_s: float,
    ) -> None:
        if not self.enabled:
            return
        vals = [
            kind,
            epoch,
            step,
            f"{lr:.6g}",
            f"{loss:.6f}",
            f"{acc:.6f}",
            f"{images_per_s:.1f}",
            f"{time.time() - self.t0:.1f}",
        ]
        with open_nofollow(self.csv_path, "a", newline="") as f:
            csv.writer(f).writerow(vals)
        if self.tb is not None:
            self.tb.add_scalar(f"{kind}/loss", loss, step)
            self.tb.add_scalar(f"{kind}/acc", acc, step)
            if kind == "train":
                self.tb.add_scalar("train/lr", lr, step)
                self.tb.add_scalar("train/images_per_s", images_per_s, step)
        if kind == "eval":
            self.message(f"epoch {epoch} step {step}: eval loss {loss:.4f} acc {100 * acc:.2f}%")

    def bar(self, epoch: int, step: int, loss: float, acc: float, ips: float) -> None:
        """One progress line: step/total, epoch, loss, accuracy, images/s."""
        if not self.progress:
            return
        done = step / max(1, self.total)
        filled = int(20 * done)
        line = (
            f"[{'#' * filled}{'.' * (20 - filled)}] {step}/{self.total} ep {epoch} "
            f"loss {loss:.4f} acc {100 * acc:5.1f}% {ips:7.1f} img/s"
        )
        if self.tty:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
        else:
            print(line, file=sys.stderr, flush=True)

    def centers(self, model: nn.Module, epoch: int, step: int) -> None:
        if not self.enabled:
            return
        layers = [c.tolist() for c in head_centers(model)]
        if not layers:
            return
        with open_nofollow(self.centres_path, "a") as f:
            f.write(json.dumps({"epoch": epoch, "step": step, "layers": layers}) + "\n")
        if self.tb is not None:
            for i, layer in enumerate(layers):
                dist = [(r * r + c * c) ** 0.5 for r, c in layer]
                self.tb.add_scalar(f"centers/layer{i}_mean_distance", sum(dist) / len(dist), step)

    def message(self, text: str) -> None:
        if self.enabled:
            if self.progress and self.tty:
                sys.stderr.write("\n")
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
