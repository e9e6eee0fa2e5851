"""How a training stops: the two ends that are not its last step (a signal or ``stop_at_step``:
``Interrupted``, with a resumable checkpoint; a non-finite value: ``NonFiniteLoss``), the signal
handlers of a training, and the last good checkpoint their messages name."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import torch

from attnconv.loading.checkpoint import LATEST, CheckpointError, follow_latest

from . import distributed as D


class NonFiniteLoss(RuntimeError):
    """Training diverged; the message names the step and the last good checkpoint.

    A RuntimeError raised by ``Trainer.fit`` / ``train``; weights that are not all finite are
    never saved.
    """


class Interrupted(Exception):
    """SIGINT / SIGTERM: a resumable checkpoint was saved.

    Args:
        signum: the signal that stopped the training.
        message: what was saved and how to resume.
    """

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


@contextlib.contextmanager
def stop_signals(handler):
    """SIGINT and SIGTERM call ``handler(signum, frame)`` inside the block (the previous
    handlers back after it); off the main thread, where Python takes no handlers, nothing."""
    old = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread: no handlers
        pass
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def last_good(ckdir: Path) -> str:
    """Where ``latest`` points, read as every loader reads it (never followed out of the run
    folder), for the messages that name the last good checkpoint."""
    try:
        good = follow_latest(ckdir) if (ckdir / LATEST).exists() else None
    except CheckpointError:
        good = None
    return f"last good checkpoint: {good}" if good else "no checkpoint was saved yet"


def nonfinite_weights(model: torch.nn.Module) -> list[str]:
    """The names of the model's floating-point tensors that hold a NaN or an infinity (never
    saved: the checkpoint before them stays the last good one)."""
    return [
        n
        for n, t in model.state_dict().items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def check_finite(value: torch.Tensor, what: str, where: str, ckdir: Path, info) -> None:
    """Stop training (every rank: ``info``) before the weights take a non-finite ``value``
    (the loss, the learning rate, the gradient norm): ``where`` says the step, epoch, batch."""
    bad = not bool(torch.isfinite(value).all())
    if D.any_rank(bad, info):
        raise NonFiniteLoss(
            f"non-finite {what} ({value.item() if bad else 'on another rank'}) at {where}; "
            f"training stopped, weights not updated; {last_good(ckdir)}"
        )


def check_weights(model: torch.nn.Module, step: int, ckdir: Path, info) -> None:
    """Weights that are not all finite (on any rank) are never saved: training stops and
    ``latest`` keeps naming the last verified checkpoint."""
    bad = nonfinite_weights(model)
    if D.any_rank(bool(bad), info):
        raise NonFiniteLoss(
            f"non-finite weights ({', '.join(bad[:2]) or 'on another rank'}) after step "
            f"{step}; training stopped without saving them; {last_good(ckdir)}"
        )
