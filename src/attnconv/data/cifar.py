"""CIFAR-10 / CIFAR-100 from the official Python batches (Krizhevsky, 2009), no torchvision.

Reads the extracted folder (``cifar-10-batches-py/``, ``cifar-100-python/``) or the ``.tar.gz``
archive directly, and downloads the archive (md5-checked) when asked and a network is available.
The batches are pickles of plain dicts; they are read with a restricted unpickler that can only
rebuild numpy arrays, never run arbitrary code.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnconv.catalog import file_digest

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


@dataclass(frozen=True)
class Archive:
    url: str
    filename: str
    md5: str
    folder: str  # top-level folder inside the archive
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_key: bytes
    meta: str
    names_key: bytes


ARCHIVES = {
    "cifar10": Archive(
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        filename="cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        folder="cifar-10-batches-py",
        train=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test=("test_batch",),
        label_key=b"labels",
        meta="batches.meta",
        names_key=b"label_names",
    ),
    "cifar100": Archive(
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        filename="cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        folder="cifar-100-python",
        train=("train",),
        test=("test",),
        label_key=b"fine_labels",
        meta="meta",
        names_key=b"fine_label_names",
    ),
}

# the only globals a CIFAR batch pickle may reference (numpy array reconstruction)
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")


def load_batch(data: bytes, source: str) -> dict:
    """Unpickle one official batch (a dict) with only numpy reconstruction allowed."""
    try:
        d = _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as e:  # noqa: BLE001 - any failure is a corrupt file for the user
        raise ValueError(
            f"{source}: not a readable CIFAR batch ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(d, dict):
        raise ValueError(f"{source}: not a CIFAR batch (a {type(d).__name__}, expected a dict)")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}


def _batch_arrays(d: dict, label_key: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    key = label_key.decode()
    if "data" not in d or key not in d:
        raise ValueError(f"{source}: CIFAR batch without 'data' or {key!r} (keys: {sorted(d)})")
    x = np.asarray(d["data"])
    y = np.asarray(d[key], dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x):
        raise ValueError(
            f"{source}: CIFAR batch data must be uint8 (N, 3072) with N labels, "
            f"got {x.dtype} {tuple(x.shape)} and {len(y)} labels"
        )
    return x.reshape(-1, 3, 32, 32), y  # (N, 3, 32, 32) uint8, planes R, G, B


MAX_BATCH_BYTES = 256 << 20  # a CIFAR batch file: 31 MB (CIFAR-10), 154 MB (CIFAR-100 train)


def _check_batch_size(size: int, what: str) -> None:
    """Before reading (from the declared size) and after: a batch file is bounded."""
    if size > MAX_BATCH_BYTES:
        raise ValueError(
            f"{what} is {size} bytes, a CIFAR batch file holds at most {MAX_BATCH_BYTES}"
        )


class _Source:
    """Members of an extracted folder or of the .tar.gz, by file name."""

    def __init__(self, path: Path, arch: Archive):
        self.path, self.arch = path, arch
        self.tar = None
        if path.is_file():
            try:
                self.tar = tarfile.open(path, "r:*")
                self.members = {Path(m.name).name: m for m in self.tar.getmembers() if m.isfile()}
            except (tarfile.TarError, OSError, EOFError) as e:
                raise ValueError(f"{path}: not a readable .tar.gz archive ({e})") from None

    def read(self, name: str) -> bytes:
        if self.tar is None:
            f = self.path / name
            if not f.is_file():
                raise FileNotFoundError(f"{f}: missing CIFAR batch file")
            _check_batch_size(f.stat().st_size, f"{f}")
            return f.read_bytes()
        if name not in self.members:
            raise ValueError(f"{self.path}: archive has no {name!r} (is it {self.arch.filename}?)")
        _check_batch_size(self.members[name].size, f"{self.path}: member {name!r}")  # declared
        try:
            data = self.tar.extractfile(self.members[name]).read(MAX_BATCH_BYTES + 1)
            _check_batch_size(len(data), f"{self.path}: member {name!r}")  # what it held
            return data
        except (tarfile.TarError, OSError, EOFError, ValueError) as e:
            raise ValueError(f"{self.path}: corrupt archive member {name!r} ({e})") from None


def read_cifar(
    path: str | Path, which: str, split: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, 3, 32, 32) uint8, labels (N,) int64 and class names of one split."""
    arch = ARCHIVES[which]
    if split not in ("train", "test"):
        raise ValueError(f"CIFAR split must be 'train' or 'test', got {split!r}")
    src = _Source(Path(path), arch)
    xs, ys = [], []
    for name in arch.train if split == "train" else arch.test:
        x, y = _batch_arrays(load_batch(src.read(name), f"{path}:{name}"), arch.label_key, name)
        xs.append(x)
        ys.append(y)
    try:
        meta = load_batch(src.read(arch.meta), f"{path}:{arch.meta}")
        classes = [
            c.decode() if isinstance(c, bytes) else str(c) for c in meta[arch.names_key.decode()]
        ]
    except (FileNotFoundError, KeyError, ValueError):
        classes = list(CIFAR10_CLASSES) if which == "cifar10" else [str(i) for i in range(100)]
    return np.concatenate(xs), np.concatenate(ys), classes


def find_cifar(which: str, root: str | Path) -> Path | None:
    """The extracted folder or the archive of ``which`` under ``root`` (or ``root`` itself)."""
    arch = ARCHIVES[which]
    root = Path(root)
    for p in (root, root / arch.folder, root / arch.filename):
        if p.is_dir() and (p / arch.meta).is_file():
            return p
        if p.is_file() and p.name == arch.filename:
            return p
    return None


def download(
    which: str, root: str | Path, *, url: str | None = None, md5: str | None = None
) -> Path:
    """Download the official archive into ``root`` (atomic, md5-checked); returns its path."""
    arch = ARCHIVES[which]
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    dest = root / arch.filename
    want = md5 or arch.md5
    if dest.is_file() and file_digest(dest, "md5") == want:
        return dest
    url = url or arch.url
    fd, tmp = tempfile.mkstemp(dir=root, prefix=arch.filename + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        got = file_digest(Path(tmp), "md5")
        if got != want:
            raise ValueError(f"download of {url} has md5 {got}, expected {want} (file discarded)")
        os.replace(tmp, dest)
    except OSError as e:
        raise FileNotFoundError(f"cannot download {url} ({e}); offline? put {dest} there") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
