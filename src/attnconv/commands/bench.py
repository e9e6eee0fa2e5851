"""`attnconv bench --suite NAME [options] [-- suite options]`: run a benchmark suite;
`attnconv bench --list`: what it can run (the suites, and in a source checkout the scripts of
benchmarks/, read from its README's index).

The suite is the module ``attnconv.bench.NAME``; its ``main(argv)`` receives the common options
below (re-encoded as ``--quick``, ``--threads N``, ...) followed by anything after ``--``.
"""

from __future__ import annotations

import argparse
import importlib
import re

from attnconv.bench import SUITES

from .options import check_output_folder

HELP = f"run a benchmark suite ({', '.join(SUITES)}): time, memory, GFLOP/s; --list: all it can run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--suite",
        default="layers",
        metavar="SUITE",
        help="; ".join(f"{k}: {v}" for k, v in SUITES.items()) + " (default: layers)",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the suites and, in a source checkout, the scripts of benchmarks/; run nothing",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (CI smoke test)")
    p.add_argument("--threads", type=int, help="torch threads per case")
    p.add_argument("--repeats", type=int, help="timed repeats per case (median is reported)")
    from attnconv.bench.common import add_output_options

    add_output_options(p)
    p.add_argument("--budget-gb", type=float, help="skip cases estimated to need more memory")
    p.add_argument("suite_args", nargs=argparse.REMAINDER, help="after --: suite options")


def suite_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--quick"] if args.quick else []
    argv += ["--update-results"] if args.update_results else []
    for opt in ("threads", "repeats", "out_dir", "budget_gb"):
        val = getattr(args, opt)
        if val is not None:
            argv += ["--" + opt.replace("_", "-"), str(val)]
    rest = list(args.suite_args or [])
    return argv + (rest[1:] if rest[:1] == ["--"] else rest)


def scripts() -> list[tuple[str, str, str]] | None:
    """(script, what it answers, how to run it) for each row of benchmarks/README.md's tables
    before its Retired section; None where no source checkout is beside the package."""
    from attnconv.bench.common import RESULTS_DIR

    readme = RESULTS_DIR.parent / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text().split("\n## Retired", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.+?) \| (.+?) \|$", text, re.M)
    return [(name, what.replace("`", ""), how.replace("`", "")) for name, what, how in rows]


def listing() -> str:
    """What `attnconv bench` can run: the suites, then benchmarks/'s scripts where present."""
    out = ["suites (attnconv bench --suite NAME [-- suite options]):"]
    out += [f"  {name:<9} {what}" for name, what in SUITES.items()]
    found = scripts()
    if found is None:
        out.append("scripts of benchmarks/: only in a source checkout (none beside this package)")
        return "\n".join(out)
    out.append("scripts of benchmarks/ (from a source checkout; benchmarks/README.md):")
    for name, what, how in found:
        out += [f"  {name:<26} {what}", f"  {'':<26} run: {how}"]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(listing())
        return 0
    name = args.suite
    if name not in SUITES:
        raise ValueError(f"unknown benchmark suite {name!r} (suites: {', '.join(SUITES)})")
    for opt in ("threads", "repeats"):
        if getattr(args, opt) is not None and getattr(args, opt) < 1:
            raise ValueError(f"--{opt} must be >= 1, got {getattr(args, opt)}")
    if args.budget_gb is not None and not args.budget_gb > 0:
        raise ValueError(f"--budget-gb must be > 0, got {args.budget_gb}")
    check_output_folder("--out", args.out_dir)  # before the cases run, not after (their results)
    mod = importlib.import_module(f"attnconv.bench.{name}")
    return int(mod.main(suite_argv(args)) or 0)
