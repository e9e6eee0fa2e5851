"""The training loop: exact resume, clean interruption, non-finite guard, one or many processes.

Run folder ``cfg.out_dir``: ``checkpoints/step-XXXXXXXX/`` (+ ``checkpoints/latest``),
``metrics.csv``, ``centers.jsonl``, ``machines.jsonl``, ``config.yaml``, ``tb/``. Everything
random is seeded (model init by ``train.seed``, data order and augmentation by (seed, epoch,
step), dropout by the torch RNG saved in each checkpoint, on ranks > 0 by (seed, step, rank)), so
a resumed run ends bit-identical to an uninterrupted one on the same CPU.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from attnconv.layers.checks import set_backend
from attnconv.layers.kernels import backend_off_device
from attnconv.loading.checkpoint import read_meta
from attnconv.models import create_model

from . import distributed as D
from .checkpoint import atomic_write
from .compiled import compile_failed, compile_net, say_failed
from .config import Config, check_training_size
from .evaluation import evaluate
from .loaders import build_loaders, model_kwargs_for
from .monitor import Monitor
from .optim import build_optimizer, lr_at, set_lr
from .resume import check_same_config
from .runfolder import RunLock, claim
from .stopping import Interrupted, check_finite, stop_signals
from .trainer_checkpoints import SUMS, TrainerCheckpoints

log = logging.getLogger(__name__)


class Trainer(TrainerCheckpoints):
    """Everything ``cfg`` describes, built in named steps (run folder, data, model, optimizer,
    resume, logs), and :meth:`fit`, which trains epoch by epoch, step by step.

    Args:
        cfg: the run's configuration (``attnconv.train.config``).
        resume: continue from the run folder's newest checkpoint.
        stop_at_step: stop (resumably, raising ``Interrupted``) once this step is reached.
        overwrite: replace a run already in the folder (refused otherwise, unless ``resume``).
        device: cpu, cuda, cuda:N, mps (default: CUDA if available).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        resume: bool = False,
        stop_at_step: int | None = None,
        overwrite: bool = False,
        device: str | None = None,
    ):
        self.cfg, self.stop_at_step = cfg, stop_at_step
        self.resume_note = ""
        t = cfg.train
        # the declared model and what a training step of it holds, measured on the meta device
        # before the data or the model is allocated (refused in seconds; models/budget.py)
        check_training_size(cfg)
        self.info = D.init_distributed(device)
        if resume:  # rank 0 alone repairs `latest` (--resume-from-intact): every rank reads after
            D.barrier(self.info)
        # threads, bf16 autocast where it speeds a step (else float32, and the summary says
        # why), subnormals, determinism
        self.bf16, self.bf16_off = D.set_up_compute(t, self.info)
        self.out = Path(cfg.out_dir or "runs/default")
        self.ckdir = self.out / "checkpoints"
        # a training began here before (its logs are there; it may have been killed before its
        # first checkpoint); a start that failed before them leaves nothing to resume
        self.started, self.lock = (self.out / "config.yaml").is_file(), None
        if resume and not (self.started or self._saved()):  # before the folder is made
            raise FileNotFoundError(f"--resume: no checkpoint in {self.ckdir}")
        if self.info.is_main:  # one training per run folder; an old run is never replaced
            self.lock = RunLock(self.out)
            if claim(self.out, self.lock, resume=resume, overwrite=overwrite):
                self.started = False  # an --overwrite killed half-way: the old run is gone now
            if resume and self._saved():  # a changed config is refused before any data is read
                try:
                    check_same_config(read_meta(self.ckdir)[1], cfg)
                except ValueError:
                    self.lock.release()
                    raise
        self._build_data()
        self._build_model()
        self._build_optimizer()
        if resume:
            self._resume()
        self._start_logs(resume)
        self.net = self.eager_net = D.wrap(self.model, self.info)
        if t.compile:  # or eager, with one line naming the option that cannot compile
            self.net = compile_net(self.net, self.model, self.info.device)
        self.stop_signal: int | None = None

    # ---- building ------------------------------------------------------------------------------
    def _build_data(self) -> None:
        """The training and evaluation splits and this rank's loaders over them."""
        if self.info.is_main:
            log.info(
                f"train: {self.cfg.model.name}, run folder {self.out}; "
                f"reading {self.cfg.data.dataset}"
            )
        self.loader, self.eval_loader = build_loaders(self.cfg, self.info)
        self.classes = self.loader.ds.classes
        self.total = self.cfg.train.epochs * len(self.loader)

    def _build_model(self) -> None:
        """The model, initialised from ``train.seed``, for the data's number of classes."""
        self.model_kwargs = model_kwargs_for(self.cfg, self.loader.ds.num_classes)
        torch.manual_seed(self.cfg.train.seed)
        self.model = create_model(self.cfg.model.name, **self.model_kwargs).to(self.info.device)
        if self.cfg.model.backend is not None:
            set_backend(self.model, self.cfg.model.backend)  # (checked on every device)
            off = backend_off_device(self.cfg.model.backend, self.info.device)
            if off is not None:  # triton on a CPU: the plan's kernels, said in one line
                set_backend(self.model, None)
                if self.info.is_main:
                    log.warning(off)

    def _build_optimizer(self) -> None:
        """The optimizer and the training state each checkpoint saves with it."""
        self.opt = build_optimizer(self.model, self.cfg.optim)
        self.step = 0
        self.evaluated = -1  # the step of the last completed evaluation
        self.sums = dict.fromkeys(SUMS, 0.0)  # epoch and log-window metric sums
        self.win_before = 0.0  # images of the log window trained before a resume (not timed)
        self.seconds_before = 0.0  # training seconds of the earlier sittings (metrics' clock)

    def _start_logs(self, resume: bool) -> None:
        """metrics.csv, centers.jsonl, TensorBoard, the run's config.yaml and the summary."""
        t, train_ds = self.cfg.train, self.loader.ds
        self.mon = Monitor(
            self.out,
            enabled=self.info.is_main,
            resume_step=self.step if resume else None,
            seconds_before=self.seconds_before,
            progress=t.progress,
            tensorboard=t.tensorboard,
            total_steps=self.total,
        )
        if self.info.is_main:
            text = yaml.safe_dump(self.cfg.to_dict(), sort_keys=False)
            atomic_write(self.out / "config.yaml", text.encode())  # replaces, never follows
        self.mon.machine(self.info.device, self.info.world_size, self.step if resume else 0)
        self.mon.summary(
            self.cfg,
            self.model,
            self.info,
            (len(train_ds), len(self.eval_loader.ds), train_ds.num_classes),
            len(self.loader),
            self.step if resume else None,
            self.resume_note,
            bf16_off=self.bf16_off,
        )

    # ---- the loop ----------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def _log_window(self, epoch: int) -> None:
        """One metrics row (and the bar) for the steps since the last one, summed over ranks."""
        s = self.sums
        loss, correct, n, before = D.all_reduce_sum(
            [s["win_loss"], s["win_correct"], s["win_n"], self.win_before], self.info
        )
        ips = (n - before) / max(time.time() - self.t0, 1e-9)  # this sitting's images only
        self.win_before = 0.0
        if n:
            self.mon.row("train", epoch + 1, self.step, self.lr, loss / n, correct / n, ips)
            self.mon.bar(epoch + 1, self.step, loss / n, correct / n, ips)
        s["win_loss"] = s["win_correct"] = s["win_n"] = 0.0
        self.t0 = time.time()

    def fit(self) -> dict:
        """Train to the end (or to ``stop_at_step``); returns the last eval metrics. The run
        folder's lock is released at the end, however the training ends.

        Returns:
            The last evaluation's metrics (``eval_loss``, ``eval_acc``, ``step``, ``epoch``,
            ``seconds``).

        Raises:
            Interrupted: a signal, or ``stop_at_step``, stopped it (a checkpoint was saved).
            NonFiniteLoss: the training diverged.
        """
        try:
            return self._fit()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _fit(self) -> dict:
        if self.step == 0:
            self.mon.centers(self.model, 0, 0)
        self.net.train()
        # the rate of the last step taken, which a redone evaluation logs (the base rate at 0)
        cfg, spe = self.cfg, len(self.loader)
        self.lr = lr_at(max(self.step - 1, 0), cfg.optim.lr, cfg.schedule, self.total, spe)
        self.last, self.out_of_time = {}, False
        with stop_signals(self._on_signal):
            self.t0 = self.t_start = time.time()
            if self._end_was_cut():  # resumed: its evaluation, centres line and checkpoint
                self._end_epoch(self.step // len(self.loader) - 1)
            while self.step < self.total and not self.out_of_time:
                self._epoch()
            if D.any_rank(self.stop_signal is not None, self.info):  # during the last epoch's
                self._interrupt()  # end: said and exited as stopped, never swallowed
        self.mon.close()
        return self.last

    def _epoch(self) -> None:
        """The rest of the current epoch (from where a resumed run stopped), then its eval,
        centres and checkpoint (in this order: a checkpoint at an epoch boundary always has its
        epoch's logs)."""
        t, steps = self.cfg.train, len(self.loader)
        epoch, start = divmod(self.step, steps)
        if start == 0:
            for k in ("ep_loss", "ep_correct", "ep_n"):
                self.sums[k] = 0.0
        for batch, (x, y) in enumerate(self.loader.batches(epoch, start), start):
            if D.any_rank(self.stop_signal is not None, self.info) or (
                self.stop_at_step is not None and self.step >= self.stop_at_step
            ):
                self._interrupt()
            if self._time_is_up(epoch):
                break
            self._step(x, y, epoch, batch)
            end_of_epoch = batch + 1 == steps
            if self.step % t.log_every == 0 or end_of_epoch:
                self._log_window(epoch)
            if t.checkpoint_every and self.step % t.checkpoint_every == 0 and not end_of_epoch:
                self.save()
        if self.step == epoch * steps > 0:  # out of time before this epoch's first step: the
            if self.evaluated < self.step:  # last one's end saved; its evaluation if not due
                self._evaluate(epoch - 1)
            return
        self._end_epoch(epoch)

    def _end_epoch(self, epoch: int) -> None:
        """Evaluation (when due), centres line, checkpoint: the end of ``epoch``."""
        if self._eval_due(epoch) or self.out_of_time:
            self._evaluate(epoch)
        self.mon.centers(self.model, epoch + 1, self.step)
        self.save()
        self.t0 = time.time()

    def _eval_due(self, epoch: int) -> bool:
        return (epoch + 1) % self.cfg.train.eval_every == 0 or self.step >= self.total

    def _end_was_cut(self) -> bool:
        """Resumed at the end of an epoch whose due evaluation a signal stopped: its eval row
        and centres line were never written (the checkpoint says what was evaluated)."""
        done, start = divmod(self.step, len(self.loader))
        return start == 0 < done and self._eval_due(done - 1) and self.evaluated < self.step

    def _time_is_up(self, epoch: int) -> bool:
        """``train.time_limit`` reached (agreed by all ranks): the window logged, said once."""
        limit = self.cfg.train.time_limit
        if limit is None or not D.any_rank(time.time() - self.t_start > limit, self.info):
            return False
        self.out_of_time = True
        self._log_window(epoch)
        self.mon.message(f"time limit of {limit:g} s reached at step {self.step}/{self.total}")
        return True

    def _step(self, x: torch.Tensor, y: torch.Tensor, epoch: int, batch: int) -> None:
        """One optimizer step on the batch (x, y): learning rate, forward, finite checks,
        backward, clipping, update, metric sums."""
        cfg, t = self.cfg, self.cfg.train
        if self.info.rank > 0:  # its own dropout masks, not rank 0's (D.rank_seed)
            torch.manual_seed(D.rank_seed(t.seed, self.step, self.info.rank))
        self.lr = lr_at(self.step, cfg.optim.lr, cfg.schedule, self.total, len(self.loader))
        self._check_finite(torch.tensor(self.lr).float(), epoch, batch, "learning rate")
        set_lr(self.opt, self.lr)
        x, y = x.to(self.info.device), y.to(self.info.device)
        try:
            logits, loss = self._forward_backward(x, y, epoch, batch)
        except Exception as e:  # the compiler's own failure: one line, then eager
            if self.net is self.eager_net or not compile_failed(e):
                raise
            say_failed(e)
            self.net = self.eager_net
            logits, loss = self._forward_backward(x, y, epoch, batch)
        if t.grad_clip:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
            self._check_finite(norm, epoch, batch, "gradient norm")
        self.opt.step()
        self.step += 1
        self.mon.advance(self.step)
        n = float(len(y))
        li, ci = loss.item() * n, (logits.argmax(-1) == y).sum().item()
        for k, v in (("loss", li), ("correct", ci), ("n", n)):
            self.sums["ep_" + k] += v
            self.sums["win_" + k] += v

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor, epoch: int, batch: int):
        """The step's forward (bf16 autocast where chosen), finite loss check and backward."""
        with torch.autocast(self.info.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.net(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=self.cfg.train.label_smoothing)
        self._check_finite(loss, epoch, batch, "loss")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        return logits, loss

    def _evaluate(self, epoch: int) -> None:
        """Evaluate, log the row, keep the metrics ``fit`` returns; a signal during evaluation
        stops now, not at its end."""
        D.sync_buffers(self.model, self.info)  # every rank evaluates the weights saved
        res = evaluate(
            self.model,
            self.eval_loader,
            self.info,
            self.bf16,
            stop=lambda: self.stop_signal is not None,
        )
        if res is None:
            self.mon.message(f"evaluation at step {self.step} stopped by a signal (not logged)")
            self._interrupt()
        loss, acc = res
        self.evaluated = self.step
        self.mon.row("eval", epoch + 1, self.step, self.lr, loss, acc, 0.0)
        self.last = {
            "eval_loss": loss,
            "eval_acc": acc,
            "step": self.step,
            "epoch": epoch + 1,
            "seconds": self.mon.seconds(),
        }

    def _check_finite(self, value: torch.Tensor, epoch: int, batch: int, what: str) -> None:
        where = f"step {self.step + 1} (epoch {epoch + 1}, batch {batch + 1})"
        check_finite(value, what, where, self.ckdir, self.info)

    def _interrupt(self) -> None:
        path = self.save()
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "stop_at_step"
        self.mon.message(
            f"stopped by {name} at step {self.step}/{self.total}; resumable checkpoint: {path} "
            f"(continue with --resume)"
        )
        self.mon.close()
        raise Interrupted(self.stop_signal or 0, str(path))
