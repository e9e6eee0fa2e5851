"""Datasets without torchvision: CIFAR-10/100 Python batches, image folders/zips, the embedded
sample; decoded once to uint8 tensors, augmented batch by batch, loaded deterministically."""

from .datasets import SAMPLE_PATH, ArrayDataset, default_cache_dir, load_dataset, resolve
from .loader import CIFAR10_MEAN, CIFAR10_STD, Loader, augment, augment_reference, data_device

__all__ = [
    "SAMPLE_PATH",
    "ArrayDataset",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "Loader",
    "augment",
    "augment_reference",
    "data_device",
    "default_cache_dir",
    "load_dataset",
    "resolve",
]
