"""One entry point for every dataset: ``load_dataset(spec, split)`` -> uint8 tensors in memory.

``spec`` is ``"cifar10"`` / ``"cifar100"`` (official Python batches, found under ``root`` or
downloaded there), ``"sample"`` (the embedded CIFAR-10 sample shipped in the package), or a path:
an extracted CIFAR folder, an official ``.tar.gz``, or a folder / ``.zip`` laid out
``split/class/file``. Images are decoded once and cached on disk as ``.npz`` (no pickle) keyed by
the source's path, size and modification time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnconv.catalog import CIFAR_ZIP, CIFAR_ZIP_HINT, cifar_zip, dataset_path

from .cifar import ARCHIVES, download, find_cifar, read_cifar
from .folder import folder_files, read_image_folder

SAMPLE_PATH = Path(__file__).resolve().parent / "sample" / "cifar10_sample.zip"
CACHE_VERSION = 1
log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """Where decoded datasets are cached (and official CIFAR is looked for and downloaded).

    Returns:
        ``$ATTNCONV_CACHE`` if set, else ``~/.cache/attnconv``.
    """
    return Path(os.environ.get("ATTNCONV_CACHE", Path.home() / ".cache" / "attnconv"))


@dataclass
class ArrayDataset:
    """A decoded split: ``images`` (N, 3, H, W) uint8, ``labels`` (N,) int64.

    Args:
        images: (N, 3, H, W) uint8 images.
        labels: (N,) int64 class indices into ``classes``.
        classes: the class names.
        source: the file or folder the split was read from.

    Raises:
        ValueError: ``images`` is not uint8 (N, 3, H, W), or ``labels`` is not (N,).
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    source: str = ""

    def __post_init__(self):
        if self.images.dtype != torch.uint8 or self.images.dim() != 4 or self.images.shape[1] != 3:
            raise ValueError(f"images must be uint8 (N, 3, H, W), got {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"labels must be ({self.images.shape[0]},), got {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.images.shape[2:])


def _kind(path: Path) -> str:
    for which, arch in ARCHIVES.items():
        if path.is_dir() and (path / arch.meta).is_file():
            return which
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
            if path.name == arch.filename:
                return which
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        # an archive under another name: look inside for the batch names
        import tarfile

        try:
            with tarfile.open(path, "r:*") as tf:
                names = {Path(n).name for n in tf.getnames()}
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ValueError(f"{path}: not a readable .tar.gz archive ({e})") from None
        for which, arch in ARCHIVES.items():
            if arch.meta in names and set(arch.test) <= names:
                return which
        raise ValueError(f"{path}: archive holds no CIFAR-10/100 Python batches")
    return "folder"


def stored_or_sample(spec: str) -> tuple[str, str | None]:
    """The dataset a checkpoint names, or the embedded sample where that is the full CIFAR-10
    zip (``cifar10-jpeg.zip``, as the shipped pretrained models name it) and this machine has
    none; returns (spec, a note saying so or None)."""
    if Path(spec).name != CIFAR_ZIP or Path(spec).expanduser().exists() or cifar_zip():
        return spec, None
    note = f"the full CIFAR-10 is not here: using the embedded sample instead; {CIFAR_ZIP_HINT}"
    return "sample", note


def resolve(spec: str, *, root: str | Path | None = None, download_ok: bool = False) -> Path:
    """The file or folder that ``spec`` names (downloading official CIFAR if allowed).

    Args:
        spec: ``"cifar10"`` / ``"cifar100"``, ``"sample"`` (the embedded CIFAR-10 sample), or a
            path to a file or folder (``cifar10-jpeg.zip`` where no such file is here: the one
            ``$ATTNCONV_CIFAR_ZIP`` names).
        root: where official CIFAR is looked for (default: ``default_cache_dir() / "cifar"``).
        download_ok: download official CIFAR into ``root`` when it is not there.

    Returns:
        The path of the dataset's file or folder.

    Raises:
        FileNotFoundError: nothing found (and no download allowed), or no such path.
    """
    if spec == "sample":
        if not SAMPLE_PATH.is_file():
            raise FileNotFoundError(f"embedded sample missing: {SAMPLE_PATH}")
        return SAMPLE_PATH
    if spec in ARCHIVES:
        root = Path(root) if root else default_cache_dir() / "cifar"
        found = find_cifar(spec, root)
        if found is not None:
            return found
        if download_ok:
            return download(spec, root)
        arch = ARCHIVES[spec]
        raise FileNotFoundError(
            f"{spec} not found in {root} (looked for {arch.folder}/ and {arch.filename}); "
            f"give its folder or archive as the path (--data PATH for eval / analyze / explore, "
            f"data.dataset=PATH in a training config), or set data.download=true (needs internet)"
        )
    return dataset_path(spec)  # a path (named datasets returned above)


def _content_key(path: Path, split: str) -> str:
    """What the cache's key reads of the data: a file's size and mtime; a folder's every file
    (its name, size and mtime), since adding, replacing or moving an image inside it changes
    neither the folder's own size nor its mtime."""
    if not path.is_dir():
        st = path.stat()
        return f"{st.st_size}|{st.st_mtime_ns}"
    if _kind(path) == "folder":
        names = folder_files(path, split)
    else:  # an extracted official CIFAR folder: its batch files
        names = sorted(e.name for e in os.scandir(path) if e.is_file())
    digest = hashlib.sha256()
    for name in names:
        st = (path / name).stat()
        digest.update(f"{name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _cache_file(path: Path, split: str, max_per_class: int | None, cache_dir: Path) -> Path:
    content = _content_key(path, split)
    key = f"{CACHE_VERSION}|{path.resolve()}|{content}|{split}|{max_per_class}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return cache_dir / "decoded" / f"{path.name}-{split}-{digest}.npz"


STALE_TMP_S = 3600  # a cache temp file this old belongs to a writer that was killed


def _writer_alive(name: str) -> bool:
    """Whether the process that named temp file ``PID-....npz.tmp`` still runs (True if unsure)."""
    pid = name.split("-", 1)[0]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _write_cache(cfile: Path, x: np.ndarray, y: np.ndarray, classes: list[str]) -> None:
    """Write the decoded split through a temp file + rename; the temp file never stays (a full
    disk removes it; one left by a killed writer is removed by the next write: its PID is gone,
    or it is an hour old)."""
    tmp = None
    try:
        cfile.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for old in cfile.parent.glob("*.npz.tmp"):
            with contextlib.suppress(OSError):
                if not _writer_alive(old.name) or now - old.stat().st_mtime > STALE_TMP_S:
                    old.unlink()
        fd, tmp = tempfile.mkstemp(dir=cfile.parent, prefix=f"{os.getpid()}-", suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, images=x, labels=y, classes=np.asarray(classes, dtype=str))
        os.replace(tmp, cfile)
    except OSError:
        pass  # a read-only or full cache is not an error
    finally:
        if tmp is not None and os.path.exists(tmp):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def load_dataset(
    spec: str,
    split: str,
    *,
    root: str | Path | None = None,
    download: bool = False,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    max_per_class: int | None = None,
) -> ArrayDataset:
    """Decode ``split`` of dataset ``spec`` once (then from the disk cache) into memory.

    Args:
        spec: what ``resolve`` takes: ``"cifar10"``, ``"cifar100"``, ``"sample"`` or a path (an
            extracted CIFAR folder, an official ``.tar.gz``, a ``split/class/file`` folder or
            ``.zip``).
        split: the split to read, e.g. ``"train"`` or ``"test"``.
        root: where official CIFAR is looked for (and downloaded).
        download: download official CIFAR when it is not found.
        cache_dir: the decoded-image cache (default: ``default_cache_dir()``).
        use_cache: read and write the ``.npz`` cache.
        max_per_class: keep only the first this many images of each class (None: all).

    Returns:
        The split: images (N, 3, H, W) uint8, labels (N,) int64 and the class names.

    Raises:
        ValueError: ``max_per_class`` < 1, an empty split, or labels outside the classes.
        FileNotFoundError: ``spec`` names nothing that exists.
    """
    if max_per_class is not None and max_per_class < 1:
        raise ValueError(f"max_per_class must be >= 1 or None, got {max_per_class}")
    path = resolve(spec, root=root, download_ok=download)
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    cfile = _cache_file(path, split, max_per_class, cache_dir) if use_cache else None
    if cfile is not None and cfile.is_file():
        try:
            with np.load(cfile, allow_pickle=False) as z:
                x, y, classes = z["images"], z["labels"], [str(c) for c in z["classes"]]
            return ArrayDataset(torch.from_numpy(x), torch.from_numpy(y), classes, str(path))
        except (OSError, ValueError, KeyError):
            pass  # unreadable cache: decode again and overwrite
    kind = _kind(path)
    if kind == "folder":
        x, y, classes = read_image_folder(path, split, max_per_class=max_per_class)
    else:
        x, y, classes = read_cifar(path, kind, split)
        if max_per_class is not None:
            keep = np.concatenate([np.flatnonzero(y == c)[:max_per_class] for c in np.unique(y)])
            keep.sort()
            x, y = x[keep], y[keep]
    if len(y) == 0:
        raise ValueError(f"{path}: split {split!r} is empty (no images)")
    if y.min() < 0 or y.max() >= len(classes):
        raise ValueError(f"{path}: labels outside 0..{len(classes) - 1}")
    if cfile is not None:
        _write_cache(cfile, x, y, classes)
    x = np.ascontiguousarray(x)
    return ArrayDataset(
        torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)), classes, str(path)
    )
