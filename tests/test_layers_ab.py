"""benchmarks/layers_ab.py's --after-patch: the lines it runs in the after process set the named
module constant; a malformed one is refused in one line before any tree is timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import layers_ab  # noqa: E402


def test_after_patch_sets_the_module_constant():
    from attnconv.layers.kernels import shared_position

    before = shared_position.BLOCK_MAX_THREADS
    try:
        exec(layers_ab.patch_lines(["attnconv.layers.kernels.shared_position:BLOCK_MAX_THREADS=8"]))
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


def test_kernel_ab_times_both_backends_and_refuses_a_bad_case(capsys):
    import kernel_ab

    assert (
        kernel_ab.main(
            [
                "--backends",
                "blocked",
                "fused",
                "--cases",
                "2x4",
                "--rounds",
                "2",
                "--inference",
                "--channels",
                "8",
                "--heads",
                "2",
            ]
        )
        == 0
    )
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| relative_learned + content, C=8, 2 heads, inference forward")
    cells = rows[2].strip("|").split("|")
    assert cells[0].strip() == "B=2, 4x4" and all(float(c) > 0 for c in cells[1:])
    with pytest.raises(SystemExit):
        kernel_ab.main(["--backends", "blocked", "fused", "--cases", "2by4"])
    with pytest.raises(SystemExit, match="--rounds must be >= 2"):
        kernel_ab.main(["--backends", "blocked", "fused", "--cases", "2x4", "--rounds", "1"])


def test_inference_run_times_every_layer_forward():
    """--inference runs the child with an eval-mode forward under inference_mode: every
    positional encoding, with and without content, gets a time."""
    from attnconv.layers.encodings import POSITIONALS

    root = Path(__file__).resolve().parents[1]
    out = layers_ab.run_tree(root, [4], inference=True)
    assert sorted(out) == sorted(f"{p}{c} 4x4" for p in POSITIONALS for c in (" +content", ""))
    assert all(t > 0 for t in out.values())


def test_layers_equal_reports_every_kind_of_difference(tmp_path):
    import torch
    from safetensors.torch import save_file

    import layers_equal

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"c/y": torch.zeros(2), "c/dx": torch.ones(2)}, a)
    save_file({"c/y": torch.zeros(2), "c/dx": torch.tensor([1.0, 1.0 + 2**-20])}, b)
    meta_a = {"c": {"keys": ["w"]}, "d": {"error": "ValueError: x"}, "e": {"keys": []}}
    meta_b = {"c": {"keys": ["w"]}, "d": {"error": "ValueError: y"}}
    diffs = layers_equal.compare((a, meta_a), (b, meta_b))
    assert diffs == [
        "case only in one tree: e",
        "d: {'error': 'ValueError: x'} != {'error': 'ValueError: y'}",
        "unequal: c/dx",
    ]
    assert layers_equal.compare((a, meta_a), (a, meta_a)) == []


def test_content_vs_dense_times_both_at_each_batch_and_precision(capsys):
    import content_vs_dense

    argv = ["--channels", "18", "--size", "4", "--batches", "1", "2", "--rounds", "2"]
    content_vs_dense.main(argv)
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("quadratic + content, C=18, 4x4, inference forward, 1 thread(s)")
    body = [r.strip("|").split("|") for r in rows[3:]]
    assert [(c[0].strip(), c[1].strip()) for c in body] == [
        ("1", "fp32"),
        ("1", "bf16"),
        ("2", "fp32"),
        ("2", "bf16"),
    ]
    for c in body:  # dense / attnconv is the quotient of the two times printed
        ours, dense, ratio = (float(x) for x in c[2:])
        assert ours > 0 and dense > 0 and abs(dense / ours - ratio) <= 0.01 * max(1, ratio)
