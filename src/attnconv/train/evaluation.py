"""Evaluation over a split: loss and accuracy summed over the ranks, stoppable by a signal."""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnconv.data import Loader
from attnconv.progress import Progress

from . import distributed as D

log = logging.getLogger(__name__)


def evaluate(model: nn.Module, loader: Loader, info: D.DistInfo, bf16: bool = False, stop=None):
    """(loss, accuracy) over the loader's split, summed over the ranks; None when ``stop()``
    (checked before every batch, agreed by all ranks) asks to stop half-way (a signal).

    Args:
        model: the model (put in eval mode for the pass, its mode restored after).
        loader: an evaluation ``Loader`` (every image, split over the ranks).
        info: the process group (``attnconv.train.distributed.DistInfo``).
        bf16: run the forward under bf16 autocast.
        stop (Callable[[], bool] | None): polled before every batch; True stops the pass.

    Returns:
        (tuple[float, float] | None): ``(mean cross-entropy, accuracy)`` over every image of
            the split, or None when stopped.
    """
    was = model.training
    model.eval()
    loss_sum = correct = n = 0.0
    bar = Progress(len(loader), "eval", unit="batch", logger=log, leave=False, enabled=info.is_main)
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
