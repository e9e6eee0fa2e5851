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
