"""Deterministic, resumable, rank-sharded batches from an in-memory uint8 dataset.

Everything random is a pure function of (seed, epoch, step): the epoch's permutation and each
global batch's augmentation (random crop with zero padding, horizontal flip) are drawn for the
whole global batch, then each rank takes its contiguous slice. So a run on 1 process and on N
processes see the same global batches, and a run resumed at (epoch, step) continues the exact
data order of an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from .datasets import ArrayDataset

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded by a hash of ``keys`` (one stream per (seed, epoch, step))."""
    h = hashlib.sha256(repr(tuple(int(k) for k in keys)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))


def augment_params(
    n: int, pad: int, flip: bool, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Crop offsets (n, 2) in [0, 2*pad] and flip flags (n,) for a batch."""
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=g)
    flips = torch.rand(n, generator=g) < 0.5 if flip else torch.zeros(n, dtype=torch.bool)
    return offsets, flips


def augment(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int) -> torch.Tensor:
    """Random crop with zero padding + horizontal flip of a batch, one gather. x: (B, C, H, W).

    Args:
        x: the (B, C, H, W) batch (any dtype; the gather runs on its device).
        offsets: (B, 2) crop offsets (row, col) into the padded image, each in [0, 2 pad].
        flips: (B,) bool, flip that image left-right.
        pad: the zero padding on every side before the crop.

    Returns:
        (B, C, H, W) the cropped and flipped batch.
    """
    B, C, H, W = x.shape
    dev = x.device  # the gather runs where the images are (a GPU when the data sits there)
    offsets, flips = offsets.to(dev), flips.to(dev)
    xp = F.pad(x, (pad, pad, pad, pad)) if pad else x  # (B, C, H+2p, W+2p)
    rows = offsets[:, 0:1] + torch.arange(H, device=dev)  # (B, H)
    cols = torch.arange(W, device=dev).expand(B, W)
    cols = torch.where(flips[:, None], W - 1 - cols, cols) + offsets[:, 1:2]  # (B, W)
    b = torch.arange(B, device=dev)[:, None, None, None]
    c = torch.arange(C, device=dev)[None, :, None, None]
    return xp[b, c, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)


def augment_reference(
    x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int
) -> torch.Tensor:
    """Plain per-image version of :func:`augment` (pad, slice, flip).

    Args:
        x: the (B, C, H, W) batch.
        offsets: (B, 2) crop offsets (row, col) into the padded image, each in [0, 2 pad].
        flips: (B,) bool, flip that image left-right.
        pad: the zero padding on every side before the crop.

    Returns:
        (B, C, H, W) the same batch as ``augment`` gives.
    """
    H, W = x.shape[2:]
    out = []
    for img, (oy, ox), f in zip(x, offsets.tolist(), flips.tolist()):
        p = F.pad(img, (pad, pad, pad, pad))[:, oy : oy + H, ox : ox + W]
        out.append(p.flip(-1) if f else p)
    return torch.stack(out)


def data_device(device: torch.device, *splits: ArrayDataset) -> torch.device:
    """Where the loaders keep ``splits``: on a CUDA ``device`` when they fit in a quarter of its
    free memory (checked before anything is copied), else on the CPU (batches then move to the
    device one at a time)."""
    if device.type != "cuda":
        return torch.device("cpu")
    need = sum(d.images.nbytes + d.labels.nbytes for d in splits)
    free, _ = torch.cuda.mem_get_info(device)
    return device if need <= free // 4 else torch.device("cpu")


class Loader:
    """Batches of ``(images float (b, 3, H, W) normalized, labels (b,))`` for one rank.

    ``batch_size`` is the global batch (all ranks together). Training loaders (``shuffle=True``)
    drop the last incomplete batch and need ``batch_size % world_size == 0``; evaluation
    loaders keep every image and split each batch as evenly as possible over the ranks.
    ``device``: where the uint8 images live and the crop, flip and normalization run (a GPU:
    the split is copied there once, so the accelerator is not fed by the CPU); the random
    draws stay on the CPU, so every device yields the same batches.

    Args:
        ds: the split, uint8 images in memory.
        batch_size: the global batch, all ranks together.
        shuffle: a new permutation every epoch and the last incomplete batch dropped
            (training); False: every image in order (evaluation).
        seed: the seed of the permutations and the augmentation.
        augment: random crop (zero padding ``pad``) and horizontal flip.
        pad: the crop's zero padding on every side.
        flip: flip half the images left-right (with ``augment``).
        mean: the normalization's per-channel mean (R, G, B), on [0, 1] images.
        std: the normalization's per-channel std.
        rank: this process's rank.
        world_size: the number of processes the global batch is split over.
        device: where the images live and the batches are made.
        max_steps: the most batches per epoch (None: a whole pass).

    Raises:
        ValueError: ``batch_size`` < 1, a rank outside the world, a training batch not
            divisible by ``world_size`` or larger than the split, or mean / std not 3 values.
    """

    def __init__(
        self,
        ds: ArrayDataset,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        augment: bool = False,
        pad: int = 4,
        flip: bool = True,
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        max_steps: int | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if shuffle and batch_size % world_size:
            raise ValueError(
                f"global batch_size {batch_size} is not divisible by world size {world_size}"
            )
        if shuffle and len(ds) < batch_size:
            raise ValueError(f"{ds.source}: {len(ds)} images, fewer than one batch of {batch_size}")
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("mean and std need 3 values (R, G, B)")
        self.ds, self.batch_size, self.shuffle, self.seed = ds, batch_size, shuffle, seed
        self.augment, self.pad, self.flip = augment, pad, flip
        self.device = torch.device(device)
        self.images = ds.images.to(self.device)  # (N, 3, H, W) uint8, copied once
        self.labels = ds.labels.to(self.device)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.mean = torch.tensor(mean, **f32).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std, **f32).view(1, 3, 1, 1) * 255
        self.rank, self.world_size = rank, world_size
        n = len(ds) // batch_size if shuffle else -(-len(ds) // batch_size)
        self.steps = min(n, max_steps) if max_steps else n

    def __len__(self) -> int:
        return self.steps

    def order(self, epoch: int) -> torch.Tensor | None:
        """The epoch's permutation of the dataset (None when not shuffling).

        Args:
            epoch: the epoch, which with the seed fixes the permutation.

        Returns:
            (N,) the permutation of the dataset's indices, or None.
        """
        if not self.shuffle:
            return None
        return torch.randperm(len(self.ds), generator=generator(self.seed, epoch))

    def indices(self, order: torch.Tensor | None, step: int) -> tuple[torch.Tensor, slice]:
        """Indices of global batch ``step`` and the slice of it that is this rank's shard.

        Args:
            order: the epoch's permutation (``order(epoch)``), or None for dataset order.
            step: the global batch's index in the epoch.

        Returns:
            ``(indices, shard)``: the global batch's dataset indices and this rank's slice of
            them.
        """
        B, ws = self.batch_size, self.world_size
        if order is not None:
            glob = order[step * B : (step + 1) * B]
            return glob, slice(self.rank * (B // ws), (self.rank + 1) * (B // ws))
        glob = torch.arange(step * B, min((step + 1) * B, len(self.ds)))
        sizes = [len(t) for t in glob.tensor_split(ws)]
        lo = sum(sizes[: self.rank])
        return glob, slice(lo, lo + sizes[self.rank])

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches of ``epoch`` from global step ``start`` on.

        Args:
            epoch: the epoch (its permutation and augmentation draws).
            start: the first global step, to resume in the middle of an epoch.

        Yields:
            ``(images, labels)``: float32 (b, 3, H, W) normalized images and (b,) int64 labels,
            on the loader's device.
        """
        order = self.order(epoch)
        for step in range(start, self.steps):
            glob, sl = self.indices(order, step)
            idx = glob[sl].to(self.device)
            x = self.images[idx]  # (b, 3, H, W) uint8
            if self.augment:
                g = generator(self.seed, epoch, step, 1)
                offsets, flips = augment_params(len(glob), self.pad, self.flip, g)
                x = augment(x, offsets[sl], flips[sl], self.pad)
            x = (x.float() - self.mean) / self.std
            yield x, self.labels[idx]
