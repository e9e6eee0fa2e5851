"""Options several subcommands share, defined once."""

from __future__ import annotations

import argparse


def add_device(p: argparse.ArgumentParser) -> None:
    """``--device``, resolved by ``attnconv.train.device.resolve_device``."""
    p.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:N or mps (default: cuda if available, else cpu)",
    )
