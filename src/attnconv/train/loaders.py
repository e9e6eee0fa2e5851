"""The training and evaluation loaders a config describes, on this rank: the splits read once
(rank 0 downloads, the others wait), held where the device can crop and flip them."""

from __future__ import annotations

import logging

from attnconv.data import Loader, data_device, load_dataset

from . import distributed as D
from .config import Config

log = logging.getLogger(__name__)


def model_kwargs_for(cfg: Config, num_classes: int) -> dict:
    """The model's kwargs for data of ``num_classes`` classes (the data sets it); a
    ``model.kwargs.num_classes`` other than the data's is one line."""
    kwargs = cfg.model.kwargs
    if kwargs.get("num_classes", num_classes) != num_classes:
        raise ValueError(
            f"model.kwargs.num_classes is {kwargs['num_classes']!r}, the dataset has "
            f"{num_classes} classes (leave it out: the data sets it)"
        )
    return {"num_classes": num_classes, **kwargs}


def build_loaders(cfg: Config, info: D.DistInfo) -> tuple[Loader, Loader]:
    """The shuffled, augmented training loader and the evaluation loader of ``cfg.data`` at
    ``cfg.train``'s batch sizes, this rank's share of each."""
    d, t = cfg.data, cfg.train
    common = dict(root=d.root, download=d.download and info.is_main, cache_dir=d.cache_dir)
    if info.enabled and d.download:  # rank 0 downloads, the others wait
        if info.is_main:
            load_dataset(d.dataset, d.train_split, **common)
        D.barrier(info)
    train_ds = load_dataset(d.dataset, d.train_split, max_per_class=d.max_per_class, **common)
    eval_ds = load_dataset(d.dataset, d.eval_split, max_per_class=d.eval_max_per_class, **common)
    dev = data_device(info.device, train_ds, eval_ds)  # a GPU holds CIFAR whole: not starved
    if info.is_main and dev.type != "cpu":
        log.info(f"data: both splits on {dev} (uint8), crop and flip there")
    shard = dict(rank=info.rank, world_size=info.world_size, device=dev)
    loader = train_loader(cfg, train_ds, max_steps=t.steps_per_epoch, **shard)
    eval_loader = Loader(eval_ds, t.eval_batch_size, shuffle=False, mean=d.mean, std=d.std, **shard)
    return loader, eval_loader


def train_loader(cfg: Config, ds, **options) -> Loader:
    """The shuffled, augmented, normalized training loader ``cfg`` describes over ``ds``
    (``options``: Loader's rank, world_size, device, max_steps)."""
    d, t = cfg.data, cfg.train
    return Loader(
        ds,
        t.batch_size,
        shuffle=True,
        seed=t.seed,
        augment=d.augment,
        pad=d.crop_padding,
        flip=d.flip,
        mean=d.mean,
        std=d.std,
        **options,
    )
