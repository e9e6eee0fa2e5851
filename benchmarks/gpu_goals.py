"""Issue 45's GPU goals read from a GPU run's results (attnconv.bench.gpu_goals): each goal per
case, measured, target, met or not, and the fastest path a case.

    python benchmarks/gpu_goals.py DIR     # DIR: where `attnconv bench --suite cuda` wrote its
                                           # .json files; writes DIR/gpu_goals.md and prints it
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnconv.bench import gpu_goals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="where the cuda suite wrote its .json files")
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"gpu_goals: {args.folder} is not a folder")
    print(gpu_goals.write(args.folder), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
