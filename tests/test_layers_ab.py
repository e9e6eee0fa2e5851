"""benchmarks/layers_ab.py's --after-patch: the lines it runs in the after process set the named
module constant; a malformed one is refused in one line before any tree is timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import layers_ab  # noqa: E402


def test_after_patch_sets_the_module_constant():
    from attnconv.layers import shared_position

    before = shared_position.BLOCK_MAX_THREADS
    try:
        exec(layers_ab.patch_lines(["attnconv.layers.shared_position:BLOCK_MAX_THREADS=8"]))
        assert shared_position.BLOCK_MAX_THREADS == 8
    finally:
        shared_position.BLOCK_MAX_THREADS = before
    assert layers_ab.patch_lines([]) == ""


@pytest.mark.parametrize("bad", ["BLOCK_MAX_THREADS=8", "attnconv.layers:=8", "a.b:X"])
def test_malformed_after_patch_is_refused_before_timing(bad, tmp_path, monkeypatch):
    timed = []
    monkeypatch.setattr(layers_ab, "run_tree", lambda *a, **k: timed.append(a) or {})
    root = str(Path(__file__).resolve().parents[1])
    with pytest.raises(SystemExit, match="--after-patch wants module:NAME=VALUE"):
        layers_ab.main(["--before", root, "--after", root, "--after-patch", bad])
    assert timed == []
