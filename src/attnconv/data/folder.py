"""Image datasets laid out ``split/class/file`` in a folder or a .zip (like the shared CIFAR zip).

Class indices are the sorted class folder names over all splits, so train and test agree.
Every image is decoded once with Pillow to uint8 (3, H, W); a file that is not a readable image,
or has another size than the first one, is an error naming the file. Sizes are checked before
anything is decoded or allocated: a file (or zip member) over MAX_FILE_BYTES, an image side over
MAX_SIDE (decompression bombs declare huge sizes in a tiny file), or a split whose decoded array
would not fit in half the machine's memory is refused with one line.
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, UnidentifiedImageError

from attnconv.memory import memory_bytes
from attnconv.progress import Progress

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 << 20  # one image file
MAX_SIDE = 4096  # pixels, either side of one image
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"}


MAX_ENTRIES = 2_000_000  # files and folders a dataset folder may hold


def _dirs(d: Path) -> list[str]:
    """Sub-folders of ``d``, hidden ones left out (``.ipynb_checkpoints``, ``.git``)."""
    try:
        return sorted(e.name for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise ValueError(f"{d}: cannot list the dataset folder ({e})") from None


def _walk(path: Path, split: str) -> list[str]:
    """``split/class/file`` names (optionally under one top folder) of a dataset folder: the
    split's folder must be there before anything is walked, never deeper than the layout (so a
    symlink loop cannot recurse) and at most MAX_ENTRIES entries: a path such as ``/`` is refused
    at once instead of walking the file system."""
    top = _dirs(path)
    base, prefix = path, ""
    if split not in top and len(top) == 1 and split in _dirs(path / top[0]):
        base, prefix = path / top[0], top[0] + "/"
    splits = _dirs(base)
    if split not in splits:
        shown = ", ".join(splits[:8]) + (" ..." if len(splits) > 8 else "") or "none"
        raise ValueError(
            f"{path}: no split {split!r} (folders found: {shown}; expected split/class/image files)"
        )
    names, seen = [], 0
    for s in splits:
        for c in _dirs(base / s):
            with os.scandir(base / s / c) as it:
                for e in it:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        raise ValueError(
                            f"{path}: more than {MAX_ENTRIES} entries; not a dataset folder"
                        )
                    if e.is_file():
                        names.append(f"{prefix}{s}/{c}/{e.name}")
    return names


def _is_image_name(name: str) -> bool:
    """An image file's name, not macOS Finder's metadata (``__MACOSX/``, ``._*`` files) nor in a
    hidden folder (``.ipynb_checkpoints/``)."""
    p = PurePosixPath(name)
    hidden = "__MACOSX" in p.parts or any(part.startswith(".") for part in p.parts)
    return p.suffix.lower() in IMAGE_EXTS and not hidden


def folder_files(path: Path, split: str) -> list[str]:
    """Every ``split/class/file`` name of a dataset folder, sorted (what its classes and split
    are read from)."""
    return sorted(_walk(path, split))


class _Tree:
    """File names (posix, relative) of a folder or zip, and a way to read them."""

    def __init__(self, path: Path, split: str):
        self.path = path
        self.zip = None
        self.dirs: set[str] = set()  # top-level folders (a split may be an empty folder)
        if path.is_dir():
            self.names = _walk(path, split)
            self.dirs = set(_dirs(path))
        elif path.is_file():
            try:
                self.zip = zipfile.ZipFile(path)
                self.names = [i.filename for i in self.zip.infolist() if not i.is_dir()]
            except (zipfile.BadZipFile, OSError) as e:
                raise ValueError(f"{path}: not a readable zip archive ({e})") from None
        else:
            raise FileNotFoundError(f"{path}: no such dataset folder or zip")
        self.names = [n for n in self.names if _is_image_name(n)]
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
                size = self.zip.getinfo(full).file_size  # declared; reading stops there
            else:
                size = (self.path / full).stat().st_size
            if size > MAX_FILE_BYTES:
                raise ValueError(
                    f"{self.path}: {full!r} is {size} bytes, an image file holds at most "
                    f"{MAX_FILE_BYTES}"
                )
            if self.zip is not None:
                return self.zip.read(full)
            return (self.path / full).read_bytes()
        # RuntimeError: an encrypted member; NotImplementedError: an unsupported compression
        except (
            zipfile.BadZipFile,
            OSError,
            KeyError,
            RuntimeError,
            NotImplementedError,
            zlib.error,
            EOFError,
        ) as e:
            raise ValueError(f"{self.path}: cannot read {full!r} ({e})") from None


def read_image_folder(
    path: str | Path, split: str, *, max_per_class: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, 3, H, W) uint8, labels (N,) int64, class names of ``split``."""
    path = Path(path)
    t = _Tree(path, split)
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
    bad = (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError)
    for i, name in enumerate(names):
        full = t.prefix + name
        data = t.read(name)
        try:
            im = Image.open(io.BytesIO(data))  # reads the header only
        except bad as e:
            raise ValueError(f"{path}: corrupt image {full!r} ({e})") from None
        with im:
            w, h = im.size
            if max(h, w) > MAX_SIDE:
                raise ValueError(
                    f"{path}: image {full!r} declares {h}x{w} pixels (at most {MAX_SIDE} a side)"
                )
            if out is None:
                out = _allocate(path, len(names), h, w)
            if (h, w) != out.shape[2:]:
                raise ValueError(
                    f"{path}: image {full!r} is {h}x{w}, the first image is {out.shape[2]}x"
                    f"{out.shape[3]} (all images of a dataset must have one size)"
                )
            try:
                a = rgb8(im, full)
            except bad as e:
                raise ValueError(f"{path}: corrupt image {full!r} ({e})") from None
        if a.shape[:2] != out.shape[2:]:  # a header that lied about the size
            raise ValueError(f"{path}: corrupt image {full!r} (decoded size differs from header)")
        out[i] = a.transpose(2, 0, 1)
        bar.update(1)
    bar.close()
    return out, np.asarray(labels, dtype=np.int64), classes


WIDE = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # 16-bit (and 32-bit integer) grey images


def rgb8(im: Image.Image, name: str) -> np.ndarray:
    """(H, W, 3) uint8 of an image. 16-bit images are scaled to 8 bits (v / 257, rounded: 65535
    is white), not clipped (PIL's convert("RGB") turns every value above 255 white); float
    images are refused: their range (0-1, 0-255, HDR) cannot be known, and PIL would turn 0-1
    values black."""
    if im.mode == "F":
        raise ValueError(f"image {name!r} has float pixels (mode F): save it as 8- or 16-bit")
    if im.mode in WIDE:
        a = np.asarray(im).astype(np.int64)
        if a.min() < 0 or a.max() > 65535:
            raise ValueError(f"image {name!r}: integer pixels outside 0..65535 (mode {im.mode})")
        g = ((a + 128) // 257).astype(np.uint8)  # round(v * 255 / 65535)
        return np.repeat(g[..., None], 3, axis=-1)
    return np.asarray(im.convert("RGB"))


def _memory() -> int:
    return memory_bytes()


def _allocate(path: Path, n: int, h: int, w: int) -> np.ndarray:
    """The (n, 3, h, w) uint8 array of a split, if it fits in half the machine's memory."""
    need, have = n * 3 * h * w, _memory()
    if need > have // 2:
        raise ValueError(
            f"{path}: {n} images of {h}x{w} need {need / 2**30:.1f} GiB decoded, more than half "
            f"this machine's memory ({have / 2**30:.1f} GiB)"
        )
    return np.empty((n, 3, h, w), dtype=np.uint8)
