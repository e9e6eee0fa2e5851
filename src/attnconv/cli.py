"""The `attnconv` command line: one subcommand per module in ``attnconv.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> module under attnconv.commands (listed in the order `attnconv -h` shows them)
COMMANDS = ("demo", "train", "eval", "convert", "analyze", "explore", "bench", "build-kernels")


def _available() -> list[str]:
    return list(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnconv",
        description="Self-attention for vision: layers, conv<->attention conversion, training, "
        "analysis.",
    )
    from attnconv import __version__

    parser.add_argument("--version", action="version", version=f"attnconv {__version__}")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="only warnings and errors: no progress, no status lines",
    )
    loud.add_argument("-v", "--verbose", action="store_true", help="also debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _available():
        mod = importlib.import_module(f"attnconv.commands.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    from attnconv.progress import configure_logging

    configure_logging(-1 if args.quiet else 1 if args.verbose else 0)
    code = _dispatch(args)
    if (dist := sys.modules.get("attnconv.train.distributed")) is not None:
        dist.exit_worker(code)  # a torchrun worker ends here (see there); other processes return
    return code


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # the reader stopped early (`| head`): quiet, as a SIGPIPE'd tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit flush
        return 141
    except (ValueError, OSError, KeyError, TypeError) as e:
        # bad input (or an unwritable/occupied output path): one clear line, no traceback
        print(f"attnconv {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnconv {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
