"""A few real CIFAR-10 images from the shared zip, as a normalized NCHW batch (shared by tests)."""

from __future__ import annotations

import functools
import io
import zipfile

import numpy as np
import torch
from PIL import Image

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@functools.lru_cache(maxsize=4)
def cifar_batch(zip_path, n: int = 8, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
    """n real CIFAR-10 images of ``split`` (one per class, cycling), normalized NCHW + labels."""
    xs, ys = [], []
    with zipfile.ZipFile(zip_path) as z:
        for i in range(n):
            c = i % len(CLASSES)
            img = Image.open(io.BytesIO(z.read(f"{split}/{CLASSES[c]}/{i // 10:04d}.jpg")))
            xs.append(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0)
            ys.append(c)
    x = torch.from_numpy(np.stack(xs)).permute(0, 3, 1, 2)  # (B, 3, 32, 32)
    return ((x - 0.5) / 0.25).contiguous(), torch.tensor(ys)
