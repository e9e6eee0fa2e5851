"""benchmarks/denormal_ab.py's arguments: --analyze without a checkpoint, or of no image, is one
line before anything is loaded (its measurements: benchmarks/results/denormal_ab.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "denormal_ab.py"


def _main():
    spec = importlib.util.spec_from_file_location("denormal_ab", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize(
    "argv",
    [["--analyze", "100"], ["--checkpoint", "nope", "--analyze", "0"], ["--rounds", "0"]],
)
def test_bad_arguments_are_one_line(argv):
    with pytest.raises(SystemExit) as e:
        _main()(argv)
    message = str(e.value.code)
    assert message.startswith("denormal_ab: ") and "\n" not in message
