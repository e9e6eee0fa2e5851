"""benchmarks/denormal_ab.py's arguments: --analyze without a checkpoint, or of no image, is one
line before anything is loaded (its measurements: benchmarks/results/denormal_ab.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import denormal_ab  # noqa: E402


@pytest.mark.parametrize(
    "argv",
    [["--analyze", "100"], ["--checkpoint", "nope", "--analyze", "0"], ["--rounds", "0"]],
)
def test_bad_arguments_are_one_line(argv):
    with pytest.raises(SystemExit) as e:
        denormal_ab.main(argv)
    message = str(e.value.code)
    assert message.startswith("denormal_ab: ") and "\n" not in message
