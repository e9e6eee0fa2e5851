"""Options several subcommands share, defined once."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_device(p: argparse.ArgumentParser) -> None:
    """``--device``, resolved by ``attnconv.device.resolve_device``."""
    p.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:N or mps (default: cuda if available, else cpu)",
    )


def check_output_file(flag: str, path: str | None) -> None:
    """A file the command will write at its end (``--json PATH``): refused before any work if
    it is a folder or a folder on its way is a file ('-' and None: nothing to write)."""
    if not path or path == "-":
        return
    if Path(path).is_dir():
        raise IsADirectoryError(f"{flag} {path} is a folder; name a file")
    check_parent_folders(flag, path)


def check_parent_folders(flag: str, path: str | Path) -> None:
    """The nearest existing folder above ``path`` is a folder, not a file (writing under a file
    would fail after the work)."""
    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(f"{flag} {path}: {parent} is a file, not a folder")
            return


def check_output_folder(flag: str, path: str | Path | None) -> None:
    """A folder the command will write into (``--out DIR``): refused before any work if it, or
    a folder on its way, is a file (None: the command's default, nothing to check)."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {p} is a file, not a folder")
    check_parent_folders(flag, path)


def check_early(
    args: argparse.Namespace,
    at_least_one: tuple[str, ...] = (),
    at_least_zero: tuple[str, ...] = (),
) -> None:
    """The options a command can check before torch is imported, said in one line at once:
    counts in range (``--batch-size`` >= 1, ...; None: the default) and ``--data`` a dataset
    that exists (a name, or a path)."""
    for names, low in ((at_least_one, 1), (at_least_zero, 0)):
        for name in names:
            value = getattr(args, name, None)
            if value is not None and value < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    if getattr(args, "data", None):
        from attnconv.catalog import dataset_path

        dataset_path(args.data)
