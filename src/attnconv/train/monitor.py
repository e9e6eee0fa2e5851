"""What a run shows and records: start-up summary and progress (attnconv.progress: a tqdm bar on
a terminal, plain log lines elsewhere), metrics.csv, TensorBoard, centres.jsonl.

Files in the run folder (written by rank 0):
  metrics.csv      kind (train | eval), epoch, step, lr, loss, acc, images_per_s, seconds
                   (seconds: the run's training time, over its sittings)
  centers.jsonl    per epoch {"epoch", "step", "layers": [[[row, col] per head] per layer],
                   "alpha": [[alpha per head] per layer] (isotropic quadratic layers)}
                   from ``attention_centers()`` of each quadratic layer (Cordonnier fig. 3)
  machines.jsonl   per start or resume {"step", "time", "device", "name", "threads", "processes",
                   "torch", "attnconv"}: where the steps from "step" on trained (a run resumed
                   on another CPU or GPU rounds differently from there on)
On resume, rows / lines after the resumed step are dropped (they will be written again).
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn as nn

from attnconv import __version__
from attnconv.cpuinfo import cpu_name
from attnconv.layers.encodings.centers import head_alphas, head_centers
from attnconv.progress import Progress

from .runfolder import open_nofollow

log = logging.getLogger(__name__)

COLUMNS = ["kind", "epoch", "step", "lr", "loss", "acc", "images_per_s", "seconds"]


def _csv_row_ok(r: list[str]) -> bool:
    """A complete metrics row: every column, a known kind, numbers where numbers go."""
    if len(r) != len(COLUMNS) or r[0] not in ("train", "eval"):
        return False
    try:
        int(r[1]), int(r[2]), [float(v) for v in r[3:]]
    except ValueError:
        return False
    return True


def _truncate_csv(path: Path, step: int) -> None:
    """Keep the complete rows up to ``step``; a torn or garbled row (a kill mid-write, an edit)
    is dropped with a warning naming the file and line, never kept or fatal."""
    if not path.is_file():
        return
    with open_nofollow(path, "r", newline="") as f:
        rows = list(csv.reader(f))
    keep = []
    for n, r in enumerate(rows[1:], 2):
        if not r:
            continue
        if not _csv_row_ok(r):
            log.warning(f"{path}:{n}: dropped a torn or malformed metrics row {','.join(r)[:60]!r}")
        elif int(r[2]) <= step:
            keep.append(r)
    with open_nofollow(path, "w", newline="") as f:
        csv.writer(f).writerows([COLUMNS] + keep)


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep a JSON-lines log's lines up to ``step``; a torn line is dropped with a warning."""
    if not path.is_file():
        return
    with open_nofollow(path, "r") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    keep = []
    for n, ln in enumerate(lines, 1):
        try:
            rec = json.loads(ln)
            ok = isinstance(rec, dict) and isinstance(rec.get("step"), int)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            log.warning(f"{path}:{n}: dropped a torn or malformed line")
        elif rec["step"] <= step:
            keep.append(ln)
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
        seconds_before: float = 0.0,
    ):
        self.enabled, self.total, self.out = enabled, total_steps, out
        self.progress = Progress(
            total_steps,
            "train",
            unit="step",
            initial=resume_step or 0,
            logger=log,
            enabled=progress and enabled,
        )
        self.csv_path, self.centres_path = out / "metrics.csv", out / "centers.jsonl"
        self.machines_path = out / "machines.jsonl"
        self.t0 = time.time() - seconds_before  # the run's clock goes on over its sittings
        self.tb = None
        if not enabled:
            return
        out.mkdir(parents=True, exist_ok=True)
        if not resume_step:  # a new run, or one killed before its first checkpoint (step 0)
            for p in (self.csv_path, self.centres_path, self.machines_path):
                p.unlink(missing_ok=True)
        else:
            _truncate_csv(self.csv_path, resume_step)
            for p in (self.centres_path, self.machines_path):
                _truncate_jsonl(p, resume_step)
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
            f"{self.seconds():.1f}",
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

    def seconds(self) -> float:
        """The run's training seconds so far: this sitting's and the saved ones of those before
        (a resume goes on from its checkpoint's; the time a run was stopped is not counted)."""
        return time.time() - self.t0

    def advance(self, step: int) -> None:
        """The run is at ``step`` (called after every optimizer step)."""
        self.progress.update(step - self.progress.n)

    def bar(self, epoch: int, step: int, loss: float, acc: float, ips: float) -> None:
        """New numbers for the progress display: epoch, loss and accuracy of the last window,
        images/s (elapsed time and ETA come with it)."""
        self.progress.update(
            step - self.progress.n,
            epoch=epoch,
            loss=f"{loss:.4f}",
            acc=f"{100 * acc:.1f}%",
            **{"img/s": f"{ips:.1f}"},
        )

    def summary(
        self,
        cfg,
        model: nn.Module,
        info,
        data: tuple[int, int, int],
        steps_per_epoch: int,
        resume_step: int | None,
        resume_note: str = "",
        bf16_off: str | None = None,
    ) -> None:
        """The start-up block, one aligned ``name  value`` line each: model and parameters,
        device, dtype, data (``data``: training images, evaluation images, classes), steps,
        run folder. ``bf16_off``: why train.bf16's autocast was passed over (None: it runs
        where asked)."""
        d, t = cfg.data, cfg.train
        n_params = sum(p.numel() for p in model.parameters())
        where = "" if resume_step is None else f", resuming at step {resume_step}"
        where += f" ({resume_note})" if resume_note else ""
        rows = [
            ("model", f"{cfg.model.name}, {n_params / 1e6:.2f}M parameters"),
            (
                "device",
                f"{info.device} x{info.world_size} process(es), "
                f"{torch.get_num_threads()} thread(s) each",
            ),
            (
                "dtype",
                "bfloat16 autocast (float32 weights)"
                if t.bf16 and not bf16_off
                else "float32"
                + (
                    f" (train.bf16's bfloat16 autocast passed over: {bf16_off}; it would slow "
                    "the step)"
                    if bf16_off
                    else ""
                ),
            ),
            (
                "data",
                f"{d.dataset}: {data[0]} {d.train_split} images, {data[1]} "
                f"{d.eval_split} images, {data[2]} classes",
            ),
            (
                "steps",
                f"{self.total} ({t.epochs} epoch(s) of {steps_per_epoch} steps, batch "
                f"{t.batch_size}){where}",
            ),
            ("run folder", str(self.out)),
        ]
        width = max(len(k) for k, _ in rows)
        self.message("\n".join(f"  {k:<{width}}  {v}" for k, v in rows))

    def machine(self, device: torch.device, processes: int, step: int) -> None:
        """One machines.jsonl line for this start or resume at ``step``: the device's name (the
        CPU's, or the GPU's) and the software that trains the steps from here on."""
        if not self.enabled:
            return
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
        rec = {
            "step": step,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": str(device),
            "name": name,
            "threads": torch.get_num_threads(),
            "processes": processes,
            "torch": torch.__version__,
            "attnconv": __version__,
        }
        with open_nofollow(self.machines_path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def centers(self, model: nn.Module, epoch: int, step: int) -> None:
        if not self.enabled:
            return
        layers = [c.tolist() for c in head_centers(model)]
        if not layers:
            return
        row = {"epoch": epoch, "step": step, "layers": layers}
        alphas = head_alphas(model)
        if alphas and all(a is not None for a in alphas):  # sharpness over training (fig. 3)
            row["alpha"] = [a.tolist() for a in alphas]
        with open_nofollow(self.centres_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for i, layer in enumerate(layers):
                dist = [(r * r + c * c) ** 0.5 for r, c in layer]
                self.tb.add_scalar(f"centers/layer{i}_mean_distance", sum(dist) / len(dist), step)

    def message(self, text: str) -> None:
        if self.enabled:
            log.info(text)

    def close(self) -> None:
        self.progress.close()
        if self.tb is not None:
            self.tb.close()
