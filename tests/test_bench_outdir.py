"""Where benchmark suites write (one rule in ``attnconv.bench.common.output_dir``): ``--out-dir``,
else ``./attnconv-bench/``; the committed ``benchmarks/results/`` only with ``--update-results``
from a source checkout, never with ``--quick``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from attnconv.bench import common
from attnconv.cli import main


def _args(*argv: str) -> argparse.Namespace:
    return common.suite_parser("layers", None, ["sweep"]).parse_args(list(argv))


def test_default_is_under_the_current_directory():
    assert common.output_dir(_args()) == Path("attnconv-bench")
    assert not common.output_dir(_args()).is_absolute()
    assert common.output_dir(_args("--out-dir", "x/y")) == Path("x/y")


def test_update_results_is_the_source_checkouts_results():
    assert common.output_dir(_args("--update-results")) == common.RESULTS_DIR
    assert common.RESULTS_DIR.is_dir() and (common.RESULTS_DIR / "convert.md").is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--update-results", "--quick"), "quick sizes are not results"),
        (("--update-results", "--out-dir", "d"), "drop --out-dir"),
    ],
)
def test_update_results_refusals(argv, message):
    with pytest.raises(ValueError, match=message):
        common.output_dir(_args(*argv))


def test_update_results_outside_a_checkout(monkeypatch, tmp_path):
    """An installed package (no benchmarks/results/ beside it) refuses, naming --out-dir."""
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "site-packages" / "results")
    with pytest.raises(ValueError, match="needs a source checkout.*--out-dir"):
        common.output_dir(_args("--update-results"))


@pytest.mark.parametrize("suite", ["layers", "local", "convert"])
def test_cli_refuses_quick_results_before_running(suite, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--suite", suite, "--quick", "--update-results"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "quick sizes are not results" in err[0]
    assert list(tmp_path.iterdir()) == []
