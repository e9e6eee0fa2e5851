"""The issue-17 anchor benchmark (bench/anchors.py): its anchors compute the layer's own
attention, its precision column and interleaved timer measure what they say."""

from __future__ import annotations

import pytest
import torch

from attnconv.bench.anchors import (
    DenseSDPA,
    anchor_cases,
    build,
    interleaved_medians,
    make_step,
    precision,
)


@pytest.mark.parametrize("positional", ["quadratic", "relative_learned"])
def test_dense_anchor_is_the_layers_attention(positional):
    layer = build("attnconv", positional, 18, 6)
    x = torch.randn(2, 18, 6, 6)
    with torch.no_grad():
        fast, dense = layer(x), DenseSDPA(layer)(x)
        layer.backend = "reference"
        torch.testing.assert_close(dense, layer(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fast, dense, rtol=1e-5, atol=1e-6)


def test_precision_column_against_float64():
    err = precision("quadratic", "fp32", 18, 8)
    assert 0 < err["dense"] < 1e-5 and err["attnconv"] <= 2 * err["dense"]
    err16 = precision("quadratic", "bf16", 18, 8)
    assert 1e-4 < err16["dense"] < 5e-2 and err16["attnconv"] <= 2 * err16["dense"]


def test_interleaved_medians_times_every_step():
    calls = {"a": 0, "b": 0}

    def tick(name):
        def step():
            calls[name] += 1

        return step

    med = interleaved_medians({"a": tick("a"), "b": tick("b")}, repeats=5)
    assert set(med) == {"a", "b"} and all(v >= 0 for v in med.values())
    assert calls == {"a": 6, "b": 6}  # one warm-up + 5 timed each


def test_cases_are_the_issue_table_and_steps_run():
    cases = anchor_cases(quick=False)
    assert len(cases) == 12
    assert {(c["positional"], c["train"], c["dtype"]) for c in cases} == {
        ("quadratic", True, "fp32"),
        ("quadratic", False, "fp32"),
        ("quadratic", False, "bf16"),
        ("relative_learned", True, "fp32"),
        ("relative_learned", False, "fp32"),
    }
    for case in anchor_cases(quick=True):
        for kind in ("attnconv", "fold", "dense"):
            make_step(kind, **case)()


@pytest.mark.parametrize("positional", ["quadratic", "relative_learned"])
def test_fold_anchor_is_the_layer_without_its_blocked_kernel(positional):
    """The "fold" kind: attnconv without its query-blocked kernels (the Python one, the fused
    C++ one in training), the same attention by another route."""
    ours, fold = build("attnconv", positional, 18, 16), build("fold", positional, 18, 16)
    x = torch.randn(2, 18, 16, 16)
    assert ours.kernel(x, 0.0) in ("blocked", "fused") and fold.kernel(x, 0.0) == "fold"
    torch.testing.assert_close(fold(x), ours(x), rtol=1e-5, atol=1e-6)
