"""``attnconv.cli.main`` run in process as the console script runs it, for the CLI tests."""

from __future__ import annotations


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``attnconv ARGV`` (SystemExit -> its code)."""
    from attnconv.cli import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err
