"""`attnconv build-kernels`: build the fused C++ CPU kernels now, not at first use."""

from __future__ import annotations

import argparse
import sys

HELP = "build the fused C++ CPU kernels ahead of first use (once per machine and version)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p  # no options: the build is keyed by the sources, torch and the CPU (kernels/build.py)


def run(args: argparse.Namespace) -> int:
    import warnings

    from attnconv.layers.kernels import fused

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = fused.extension()
    if module is None:
        why = caught[-1].message if caught else f"{fused.DISABLE}=1 is set"
        print(f"attnconv build-kernels: not built: {why}", file=sys.stderr)
        return 1
    print(
        "attnconv build-kernels: the fused CPU kernels are ready "
        f"({module.__file__}; {fused.EXTENSION.name})"
    )
    return 0
