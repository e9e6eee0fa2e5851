"""The training loop: exact resume, clean interruption, non-finite guard, one or many processes.

Run folder ``cfg.out_dir``: ``checkpoints/step-XXXXXXXX/`` (+ ``checkpoints/latest``),
``metrics.csv``, ``centers.jsonl``, ``config.yaml``, ``tb/``. Everything random is seeded
(model init by ``train.seed``, data order and augmentation by (seed, epoch, step), dropout by the
torch RNG saved in each checkpoint), so a resumed run ends bit-identical to an uninterrupted one
on CPU.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from attnconv.data import Loader, load_dataset
from attnconv.memory import memory_bytes
from attnconv.models.budget import probe_bytes
from attnconv.progress import Progress

from . import distributed as D
from .checkpoint import (
    LATEST,
    CheckpointError,
    atomic_write,
    check_fits,
    follow_latest,
    optimizer_from_tensors,
    read_checkpoint,
    read_meta,
)
from .checkpoint import save_checkpoint as _save
from .config import Config
from .monitor import Monitor
from .optim import build_optimizer, lr_at, set_lr
from .resume import check_resumable, check_same_config
from .runfolder import LOCK as LOCK_FILE
from .runfolder import (
    RunLock,
    check_fresh,
    check_no_links,
    clean_temps,
    finish_overwrite,
    remove_old_run,
)

log = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """Training diverged; the message names the step and the last good checkpoint."""


class Interrupted(Exception):
    """SIGINT / SIGTERM: a resumable checkpoint was saved."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def evaluate(model: nn.Module, loader: Loader, info: D.DistInfo, bf16: bool = False,
             stop=None):  # fmt: skip
    """(loss, accuracy) over the loader's split, summed over the ranks; None when ``stop()``
    (checked before every batch, agreed by all ranks) asks to stop half-way (a signal)."""
    was = model.training
    model.eval()
    loss_sum = correct = n = 0.0
    bar = Progress(len(loader), "eval", unit="batch", logger=log, leave=False,
                   enabled=info.is_main)  # fmt: skip
    with torch.no_grad(), bar:
        for x, y in loader.batches(0):
            if stop is not None and D.any_rank(stop(), info):
                model.train(was)
                return None
            if len(y) == 0:  # more ranks than images in the last batch
                continue
            x, y = x.to(info.device), y.to(info.device)
            with torch.autocast(info.device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x)
            loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").item()
            correct += (logits.argmax(-1) == y).sum().item()
            n += len(y)
            bar.update(1, acc=f"{100 * correct / n:.1f}%")
    model.train(was)
    loss_sum, correct, n = D.all_reduce_sum([loss_sum, correct, n], info)
    return loss_sum / max(n, 1), correct / max(n, 1)


class Trainer:
    def __init__(self, cfg: Config, *, resume: bool = False, stop_at_step: int | None = None,
                 overwrite: bool = False, device: str | None = None):  # fmt: skip
        self.cfg, self.stop_at_step = cfg, stop_at_step
        self.resume_note = ""
        t = cfg.train
        # the declared model, measured on the meta device before the data or the model is
        # allocated (a crafted width or depth is refused in seconds; models/budget.py)
        probe_bytes(cfg.model.name, dict(cfg.model.kwargs), memory_bytes() // 2,
                    f"model {cfg.model.name!r}")  # fmt: skip
        self.info = D.init_distributed(device)
        if t.threads:
            torch.set_num_threads(t.threads)
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.out = Path(cfg.out_dir or "runs/default")
        self.ckdir = self.out / "checkpoints"
        self.lock = None
        # a training was started here before (it may have been killed before its first checkpoint)
        self.started = (self.out / LOCK_FILE).is_file()
        if self.info.is_main:  # one training per run folder; an old run is never replaced
            self.lock = RunLock(self.out)
            try:
                check_no_links(self.out)
            except ValueError:
                self.lock.release()
                raise
            clean_temps(self.out)  # left by a save killed half-way
            if finish_overwrite(self.out):  # an --overwrite killed half-way: old run gone now
                self.started = False
            try:
                if not resume:
                    check_fresh(self.out, overwrite)
                elif self._saved():  # a changed config is refused before any data is read
                    check_same_config(read_meta(self.ckdir)[1], cfg)
            except ValueError:
                self.lock.release()
                raise
            if overwrite and not resume:  # nothing of the old run stays: weights, logs, config
                remove_old_run(self.out)
        d = cfg.data
        if self.info.is_main:
            log.info(f"train: {cfg.model.name}, run folder {self.out}; reading {d.dataset}")
        common = dict(root=d.root, download=d.download and self.info.is_main, cache_dir=d.cache_dir)
        if self.info.enabled and d.download:  # rank 0 downloads, the others wait
            if self.info.is_main:
                load_dataset(d.dataset, d.train_split, **common)
            D.barrier(self.info)
        train_ds = load_dataset(d.dataset, d.train_split, max_per_class=d.max_per_class, **common)
        eval_ds = load_dataset(
            d.dataset, d.eval_split, max_per_class=d.eval_max_per_class, **common
        )
        self.classes = train_ds.classes
        norm = dict(mean=d.mean, std=d.std, rank=self.info.rank, world_size=self.info.world_size)
        self.loader = Loader(
            train_ds,
            t.batch_size,
            shuffle=True,
            seed=t.seed,
            augment=d.augment,
            pad=d.crop_padding,
            flip=d.flip,
            max_steps=t.steps_per_epoch,
            **norm,
        )
        self.eval_loader = Loader(eval_ds, t.eval_batch_size, shuffle=False, **norm)
        self.total = t.epochs * len(self.loader)
        torch.manual_seed(t.seed)
        self.model_kwargs = {"num_classes": train_ds.num_classes, **cfg.model.kwargs}
        from attnconv.models import create_model

        self.model = create_model(cfg.model.name, **self.model_kwargs).to(self.info.device)
        self.opt = build_optimizer(self.model, cfg.optim)
        self.step = 0
        self.sums = {
            "ep_loss": 0.0,
            "ep_correct": 0.0,
            "ep_n": 0.0,
            "win_loss": 0.0,
            "win_correct": 0.0,
            "win_n": 0.0,
        }
        if resume:
            self._resume()
            if self.step >= self.total:  # said, not a silent exit
                self.resume_note = "the run had already finished: nothing left to train"
        self.mon = Monitor(
            self.out,
            enabled=self.info.is_main,
            resume_step=self.step if resume else None,
            progress=t.progress,
            tensorboard=t.tensorboard,
            total_steps=self.total,
        )
        if self.info.is_main:
            text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
            atomic_write(self.out / "config.yaml", text.encode())  # replaces, never follows
        self.mon.summary(cfg, self.model, self.info,
                         (len(train_ds), len(eval_ds), train_ds.num_classes), len(self.loader),
                         self.step if resume else None, self.resume_note)  # fmt: skip
        self.net = D.wrap(self.model, self.info)
        if t.compile:
            self.net = torch.compile(self.net)
        self.stop_signal: int | None = None

    # ---- checkpoints -------------------------------------------------------------------------
    def _saved(self) -> bool:
        return (self.ckdir / LATEST).exists() or any(d.is_dir() for d in self.ckdir.glob("step-*"))

    def _resume(self) -> None:
        """Continue from the newest checkpoint; a run stopped before its first checkpoint was
        complete (killed during it: only a temp folder, cleaned at start) starts again from step
        0, which is the same run (everything is seeded)."""
        if not self._saved():
            if not self.started:
                raise FileNotFoundError(f"--resume: no checkpoint in {self.ckdir}")
            self.resume_note = "no checkpoint was complete, starting again from step 0"
            return
        meta, weights, st = read_checkpoint(self.ckdir, with_state=True)
        rng = check_resumable(meta, st, self.cfg, self.model_kwargs, set(self.sums))
        check_fits(self.model, weights, meta["path"], meta["model"])
        try:
            optimizer_from_tensors(self.opt, st, meta["optimizer"])
        except CheckpointError as e:
            raise CheckpointError(f"{meta['path']}: corrupted checkpoint: {e}") from None
        self.model.load_state_dict(weights)
        bad = [n for n, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:  # never resumed from, never called "last good"
            raise CheckpointError(
                f"{meta['path']}: checkpoint holds non-finite weights ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}); resume from an earlier checkpoint"
            )
        torch.set_rng_state(rng)
        self.step = meta["state"]["step"]
        self.sums.update(meta["state"]["sums"])

    def save(self) -> Path | None:
        """Rank 0 writes checkpoints/step-N, points ``latest`` at it, prunes old ones. Weights
        that are not all finite are never written: training stops (NonFiniteLoss) and ``latest``
        keeps naming the last verified checkpoint."""
        path = self.ckdir / f"step-{self.step:08d}"
        bad = [n for n, t in self.model.state_dict().items()
               if t.is_floating_point() and not bool(torch.isfinite(t).all())]  # fmt: skip
        if D.any_rank(bool(bad), self.info):
            raise NonFiniteLoss(
                f"non-finite weights ({', '.join(bad[:2]) or 'on another rank'}) after step "
                f"{self.step}; training stopped without saving them; {self._last_good()}"
            )
        if self.info.is_main:
            _save(
                path,
                self.model,
                self.cfg.model.name,
                self.model_kwargs,
                optimizer=self.opt,
                state={
                    "step": self.step,
                    "epoch": self.step // len(self.loader),
                    "sums": self.sums,
                    "total_steps": self.total,
                },
                state_tensors={"rng.torch": torch.get_rng_state()},
                config=self.cfg.to_dict(),
                extra={
                    "data": {
                        "classes": self.classes,
                        "mean": self.cfg.data.mean,
                        "std": self.cfg.data.std,
                        "image_size": list(self.loader.ds.image_size),
                    }
                },
            )
            atomic_write(self.ckdir / LATEST, path.name.encode())
            steps = sorted(p for p in self.ckdir.glob("step-*") if p.is_dir())
            for old in steps[: -self.cfg.train.keep_checkpoints]:
                if old != path:
                    shutil.rmtree(old, ignore_errors=True)
        D.barrier(self.info)
        return path

    # ---- the loop ----------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    @contextlib.contextmanager
    def _signals(self):
        old = {}
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                old[s] = signal.signal(s, self._on_signal)
        except ValueError:  # not the main thread: no handlers
            pass
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _log_window(self, epoch: int, lr: float, t0: float) -> float:
        s = self.sums
        loss, correct, n = D.all_reduce_sum(
            [s["win_loss"], s["win_correct"], s["win_n"]], self.info
        )
        ips = n / max(time.time() - t0, 1e-9)
        if n:
            self.mon.row("train", epoch + 1, self.step, lr, loss / n, correct / n, ips)
            self.mon.bar(epoch + 1, self.step, loss / n, correct / n, ips)
        s["win_loss"] = s["win_correct"] = s["win_n"] = 0.0
        return time.time()

    def fit(self) -> dict:
        """Train to the end (or to ``stop_at_step``); returns the last eval metrics. The run
        folder's lock is released at the end, however the training ends."""
        try:
            return self._fit()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _fit(self) -> dict:
        cfg, t, L = self.cfg, self.cfg.train, len(self.loader)
        last = {}
        if self.step == 0:
            self.mon.centers(self.model, 0, 0)
        self.net.train()
        out_of_time, lr = False, cfg.optim.lr
        with self._signals():
            t0 = t_start = time.time()
            while self.step < self.total and not out_of_time:
                epoch, start = divmod(self.step, L)
                if start == 0:
                    for k in ("ep_loss", "ep_correct", "ep_n"):
                        self.sums[k] = 0.0
                for x, y in self.loader.batches(epoch, start):
                    if D.any_rank(self.stop_signal is not None, self.info) or (
                        self.stop_at_step is not None and self.step >= self.stop_at_step
                    ):
                        self._interrupt()
                    if t.time_limit is not None and D.any_rank(
                        time.time() - t_start > t.time_limit, self.info
                    ):
                        out_of_time = True
                        t0 = self._log_window(epoch, lr, t0)
                        self.mon.message(
                            f"time limit of {t.time_limit:g} s reached at step "
                            f"{self.step}/{self.total}"
                        )
                        break
                    lr = lr_at(self.step, cfg.optim.lr, cfg.schedule, self.total, L)
                    self._check_finite(torch.tensor(lr).float(), epoch, start, "learning rate")
                    set_lr(self.opt, lr)
                    x, y = x.to(self.info.device), y.to(self.info.device)
                    with torch.autocast(
                        self.info.device.type, dtype=torch.bfloat16, enabled=t.bf16
                    ):
                        logits = self.net(x)
                    loss = F.cross_entropy(logits.float(), y, label_smoothing=t.label_smoothing)
                    self._check_finite(loss, epoch, start, "loss")
                    self.opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if t.grad_clip:
                        norm = nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
                        self._check_finite(norm, epoch, start, "gradient norm")
                    self.opt.step()
                    self.step += 1
                    start += 1
                    self.mon.advance(self.step)
                    n = float(len(y))
                    li, ci = loss.item() * n, (logits.argmax(-1) == y).sum().item()
                    for p, v in (("loss", li), ("correct", ci), ("n", n)):
                        self.sums["ep_" + p] += v
                        self.sums["win_" + p] += v
                    end_of_epoch = start == L
                    if self.step % t.log_every == 0 or end_of_epoch:
                        t0 = self._log_window(epoch, lr, t0)
                    if (
                        t.checkpoint_every
                        and self.step % t.checkpoint_every == 0
                        and not end_of_epoch
                    ):
                        self.save()
                # end of epoch: eval, centres, checkpoint (in this order: a checkpoint at an
                # epoch boundary always has its epoch's logs)
                if (epoch + 1) % t.eval_every == 0 or self.step == self.total or out_of_time:
                    res = evaluate(self.model, self.eval_loader, self.info, t.bf16,
                                   stop=lambda: self.stop_signal is not None)  # fmt: skip
                    if res is None:  # a signal during evaluation: stop now, not at its end
                        self.mon.message(f"evaluation at step {self.step} stopped by a signal "
                                         "(not logged)")  # fmt: skip
                        self._interrupt()
                    el, ea = res
                    self.mon.row("eval", epoch + 1, self.step, lr, el, ea, 0.0)
                    last = {
                        "eval_loss": el,
                        "eval_acc": ea,
                        "step": self.step,
                        "epoch": epoch + 1,
                        "seconds": time.time() - t_start,
                    }
                self.mon.centers(self.model, epoch + 1, self.step)
                self.save()
                t0 = time.time()
            if D.any_rank(self.stop_signal is not None, self.info):  # during the last epoch's
                self._interrupt()  # end: said and exited as stopped, never swallowed
        self.mon.close()
        return last

    def _check_finite(self, value: torch.Tensor, epoch: int, batch: int, what: str) -> None:
        bad = not bool(torch.isfinite(value).all())
        if D.any_rank(bad, self.info):
            raise NonFiniteLoss(
                f"non-finite {what} ({value.item() if bad else 'on another rank'}) at step "
                f"{self.step + 1} (epoch {epoch + 1}, batch {batch + 1}); training stopped, "
                f"weights not updated; {self._last_good()}"
            )

    def _last_good(self) -> str:
        """Where ``latest`` points, read as every loader reads it (never followed out of the
        run folder), for the messages that name the last good checkpoint."""
        try:
            good = follow_latest(self.ckdir) if (self.ckdir / LATEST).exists() else None
        except CheckpointError:
            good = None
        return f"last good checkpoint: {good}" if good else "no checkpoint was saved yet"

    def _interrupt(self) -> None:
        path = self.save()
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "stop_at_step"
        self.mon.message(
            f"stopped by {name} at step {self.step}/{self.total}; resumable checkpoint: {path} "
            f"(continue with --resume)"
        )
        self.mon.close()
        raise Interrupted(self.stop_signal or 0, str(path))


def train(cfg: Config, *, resume: bool = False, stop_at_step: int | None = None,
          overwrite: bool = False, device: str | None = None) -> dict:  # fmt: skip
    """Build everything from ``cfg`` and train; see :class:`Trainer`. ``overwrite``: replace a
    run already in the folder (refused otherwise, unless ``resume``). ``device``: cpu, cuda,
    cuda:N, mps (default: CUDA if available)."""
    tr = Trainer(cfg, resume=resume, stop_at_step=stop_at_step, overwrite=overwrite,
                 device=device)  # fmt: skip
    try:
        last = tr.fit()
        # every rank past its last collective before gloo is torn down: a rank destroying the
        # group while a peer's final all_reduce was in flight aborted under load ("terminate
        # called without an active exception"); on the success path only, so that a failing
        # rank never waits on a peer stuck elsewhere
        D.barrier(tr.info)
        return last
    finally:
        D.shutdown(tr.info)
