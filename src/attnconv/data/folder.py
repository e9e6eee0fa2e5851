"""Image datasets laid out ``split/class/file`` in a folder or a .zip (like the shared CIFAR zip).

Class indices are the sorted class folder names over all splits, so train and test agree.
Every image is decoded once with Pillow to uint8 (3, H, W); a file that is not a readable image,
or has another size than the first one, is an error naming the file.
"""

from __future__ import annotations

import io
import logging
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, UnidentifiedImageError

from attnconv.progress import Progress

log = logging.getLogger(__name__)

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"}


class _Tree:
    """File names (posix, relative) of a folder or zip, and a way to read them."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = None
        self.dirs: set[str] = set()  # top-level folders (a split may be an empty folder)
        if path.is_dir():
            self.names = [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
            self.dirs = {p.name for p in path.iterdir() if p.is_dir()}
        elif path.is_file():
            try:
                self.zip = zipfile.ZipFile(path)
                self.names = [i.filename for i in self.zip.infolist() if not i.is_dir()]
            except (zipfile.BadZipFile, OSError) as e:
                raise ValueError(f"{path}: not a readable zip archive ({e})") from None
        else:
            raise FileNotFoundError(f"{path}: no such dataset folder or zip")
        self.names = [n for n in self.names if PurePosixPath(n).suffix.lower() in IMAGE_EXTS]
        # allow one common top-level folder (e.g. cifar10/train/cat/0001.jpg)
        parts = [PurePosixPath(n).parts for n in self.names]
        if parts and all(len(p) == 4 for p in parts) and len({p[0] for p in parts}) == 1:
            self.prefix = parts[0][0] + "/"
            parts = [p[1:] for p in parts]
        else:
            self.prefix = ""
        self.files: dict[str, dict[str, list[str]]] = {}  # split -> class -> names
        for p in parts:
            if len(p) == 3:
                self.files.setdefault(p[0], {}).setdefault(p[1], []).append("/".join(p))

    def read(self, name: str) -> bytes:
        full = self.prefix + name
        try:
            if self.zip is not None:
                return self.zip.read(full)
            return (self.path / full).read_bytes()
        except (zipfile.BadZipFile, OSError, KeyError) as e:
            raise ValueError(f"{self.path}: cannot read {full!r} ({e})") from None


def read_image_folder(
    path: str | Path, split: str, *, max_per_class: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, 3, H, W) uint8, labels (N,) int64, class names of ``split``."""
    path = Path(path)
    t = _Tree(path)
    if split not in t.files and split in t.dirs:
        raise ValueError(f"{path}: split {split!r} is empty (no images)")
    if split not in t.files:
        have = ", ".join(sorted(t.files)) or "none"
        raise ValueError(
            f"{path}: no split {split!r} (splits found: {have}; expected split/class/image files)"
        )
    classes = sorted({c for s in t.files.values() for c in s})
    per_class = t.files[split]
    names, labels = [], []
    for ci, c in enumerate(classes):
        files = sorted(per_class.get(c, []))
        if max_per_class is not None:
            files = files[:max_per_class]
        names += files
        labels += [ci] * len(files)
    if not names:
        raise ValueError(f"{path}: split {split!r} is empty (no images)")
    out = None
    bar = Progress(len(names), f"decoding {path.name}:{split}", unit="img", logger=log, leave=False)
    for i, name in enumerate(names):
        data = t.read(name)
        try:
            with Image.open(io.BytesIO(data)) as im:
                a = np.asarray(im.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
            raise ValueError(f"{path}: corrupt image {t.prefix + name!r} ({e})") from None
        if out is None:
            out = np.empty((len(names), 3, a.shape[0], a.shape[1]), dtype=np.uint8)
        if a.shape[:2] != out.shape[2:]:
            raise ValueError(
                f"{path}: image {t.prefix + name!r} is {a.shape[0]}x{a.shape[1]}, the first image "
                f"is {out.shape[2]}x{out.shape[3]} (all images of a dataset must have one size)"
            )
        out[i] = a.transpose(2, 0, 1)
        bar.update(1)
    bar.close()
    return out, np.asarray(labels, dtype=np.int64), classes
