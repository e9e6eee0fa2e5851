"""The Trainer's checkpoints (train/loop.py): a step's checkpoint written by rank 0 with the
training state that makes a resume exact, and a run continued from its newest one."""

from __future__ import annotations

from pathlib import Path

import torch

from attnconv.loading.checkpoint import LATEST

from . import distributed as D
from .checkpoint import atomic_write, prune_checkpoints
from .checkpoint import save_checkpoint as _save
from .resume import restore
from .stopping import check_weights

SUMS = ("ep_loss", "ep_correct", "ep_n", "win_loss", "win_correct", "win_n")


class TrainerCheckpoints:
    """Trainer's checkpoint side: whether the run folder holds one, resume from the newest,
    save the current step (the attributes are the Trainer's, loop.py)."""

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
        sums = set(self.sums)
        meta = restore(self.ckdir, self.cfg, self.model, self.opt, self.model_kwargs, sums)
        self.step = meta["state"]["step"]
        self.evaluated = meta["state"].get("evaluated", self.step)  # older checkpoints: not said
        if self.info.is_main:  # the sums over every rank (save); the others start from zero
            self.sums.update(meta["state"]["sums"])
        self.win_before = self.sums["win_n"]  # timed by the sitting that trained them
        self.seconds_before = float(meta["state"].get("seconds", 0.0))  # older: not saved
        if self._end_was_cut():  # a signal stopped the evaluation that ends an epoch
            which = "final" if self.step >= self.total else f"step {self.step}'s"
            self.resume_note = f"the {which} evaluation was interrupted: evaluating now"
        elif self.step >= self.total:  # said, not a silent exit
            self.resume_note = "the run had already finished: nothing left to train"

    def save(self) -> Path | None:
        """Rank 0 writes checkpoints/step-N, points ``latest`` at it, prunes old ones. Weights
        that are not all finite are never written: training stops (NonFiniteLoss) and ``latest``
        keeps naming the last verified checkpoint.

        Returns:
            The step folder (its path on every rank; rank 0 writes it).

        Raises:
            NonFiniteLoss: the weights are not all finite.
        """
        path = self.ckdir / f"step-{self.step:08d}"
        check_weights(self.model, self.step, self.ckdir, self.info)  # before writing them
        sums = dict(zip(SUMS, D.all_reduce_sum([self.sums[k] for k in SUMS], self.info)))
        if self.info.is_main:
            state = {
                "step": self.step,
                "epoch": self.step // len(self.loader),
                "sums": sums,
                "total_steps": self.total,
                "evaluated": self.evaluated,
                "seconds": self.mon.seconds(),
            }
            data = {
                "classes": self.classes,
                "mean": self.cfg.data.mean,
                "std": self.cfg.data.std,
                "image_size": list(self.loader.ds.image_size),
            }
            _save(
                path,
                self.model,
                self.cfg.model.name,
                self.model_kwargs,
                optimizer=self.opt,
                state=state,
                state_tensors={"rng.torch": torch.get_rng_state()},
                config=self.cfg.to_dict(),
                extra={"data": data},
            )
            atomic_write(self.ckdir / LATEST, path.name.encode())
            t = self.cfg.train
            prune_checkpoints(self.ckdir, path, t.keep_checkpoints, t.keep_every)
        D.barrier(self.info)
        return path
