"""Issue 45's GPU goals read from the cuda suite's files (attnconv.bench.gpu_goals): the rows
here are in the suite's format (bench/cuda.py, bench/cuda_models.py), their values chosen to sit
on either side of each target."""

from __future__ import annotations

import json

from attnconv.bench import gpu_goals


def _content(hw=32, dtype="bf16", train=True, **ms):
    row = dict(group="content", name=f"case {hw} {dtype} {train}", hw=hw, dtype=dtype, train=train)
    return row | ms


def test_content_goals_take_the_faster_kernel_and_the_issue_targets():
    rows = [  # Triton faster than Flex here: its ratios are the goals'
        _content(
            attnconv_ms=4.0,
            triton_ms=2.0,
            dense_ms=4.0,
            flash_ms=1.0,
            attnconv_mb=30.0,
            triton_mb=20.0,
            dense_mb=100.0,
        ),
        _content(
            hw=16, attnconv_ms=1.0, dense_ms=1.1, flash_ms=0.5, attnconv_mb=10.0, dense_mb=20.0
        ),
        _content(dtype="fp32", attnconv_ms=2.0, dense_ms=1.0),
        _content(train=False, attnconv_ms=1.0, triton_ms=3.0, dense_ms=1.0),
    ]
    goals = {(g.what, g.case): g for g in gpu_goals._content_goals(rows)}
    first = "case 32 bf16 True (triton)"
    assert goals["bf16 training: x dense SDPA + bias", first].value == 2.0
    assert goals["bf16 training: x dense SDPA + bias", first].met  # >= 1.5
    assert goals["bf16 training: peak memory / dense", first].value == 0.2
    assert goals["bf16 training: peak memory / dense", first].met  # <= 0.25
    assert goals["bf16 training: x SDPA without positions", first].met is False  # 0.5 < 0.6
    small = goals["bf16 training: x dense SDPA + bias", "case 16 bf16 True (attnconv)"]
    assert small.target == 1 and small.met  # 16x16: >= 1x
    assert goals["fp32 training: x dense SDPA + bias", "case 32 fp32 True (attnconv)"].met is False
    assert goals["inference: x dense SDPA + bias", "case 32 bf16 False (attnconv)"].met


def test_model_goals_use_the_faster_bf16_path():
    rows = [
        dict(model="sa_learned_content", path="reference", img_s=100.0, x_ref=1.0),
        dict(model="sa_learned_content", path="attnconv fp32", img_s=130.0, x_ref=1.3),
        dict(
            model="sa_learned_content",
            path="attnconv bf16",
            img_s=300.0,
            x_ref=3.0,
            x_dense=1.0,
            mem_ref=0.6,
        ),
        dict(
            model="sa_learned_content",
            path="attnconv bf16 triton",
            img_s=450.0,
            x_ref=4.5,
            x_dense=1.5,
            mem_ref=0.4,
        ),
        dict(model="sa_learned_content", path="dense bf16", img_s=300.0, x_ref=3.0),
    ]
    goals = {g.what: g for g in gpu_goals._model_goals(rows) if g.case.startswith("sa_learned_c")}
    assert goals["bf16: x the reference algorithm in fp32"].value == 4.5
    assert "attnconv bf16 triton" in goals["bf16: x the reference algorithm in fp32"].case
    assert all(g.met for g in goals.values())
    # a path's ceiling: its counted FLOPs at the GEMM peak, over the anchor's img/s
    rows[1]["ceiling_img_s"] = 120.0  # attnconv fp32: at most 1.2x the reference, just the goal
    rows[3]["ceiling_img_s"] = 360.0  # Triton rows are not counted: here as if they were
    goals = {g.what: g for g in gpu_goals._model_goals(rows) if g.case.startswith("sa_learned_c")}
    assert goals["fp32: x the reference algorithm"].ceiling == 1.2
    assert goals["fp32: x the reference algorithm"].reachable
    assert goals["bf16: x the reference algorithm in fp32"].ceiling == 3.6
    assert goals["bf16: x the reference algorithm in fp32"].reachable is False  # 3.6 < 4
    assert goals["bf16: x the model on dense SDPA + bias"].ceiling == 1.2
    assert goals["peak memory / the reference's"].ceiling is None


def test_a_missing_file_is_not_measured_and_a_partial_one_is_read(tmp_path):
    rows = [_content(attnconv_ms=1.0, dense_ms=2.0, flash_ms=1.0, attnconv_mb=1.0, dense_mb=10.0)]
    (tmp_path / "cuda_layers_content.partial.json").write_text(json.dumps({"rows": rows}))
    text = gpu_goals.write(tmp_path)
    assert (tmp_path / "gpu_goals.md").read_text() == text
    assert "only the cases run before its time ran out" in text
    assert "| bf16 training: x dense SDPA + bias | case 32 bf16 True (attnconv) | 2.00 |" in text
    # no models file: each paper model's four goals listed, not measured
    assert "Met: 3 of 3 measured (12 not measured); 0 out of reach" in text
    none = gpu_goals._model_goals([dict(model="sa_quadratic", path="attnconv bf16", error="oom")])
    assert {g.met for g in none} == {None}


def test_the_fastest_path_a_case():
    rows = [dict(name="a", attnconv_ms=2.0, window_ms=1.0, unfold_ms=9.0), dict(name="b")]
    assert gpu_goals.fastest(rows, ("attnconv", "window", "triton", "unfold")) == [
        ("a", "window", 1.0)
    ]


def test_each_content_goal_has_no_bias_sdpas_ceiling_beside_it(tmp_path):
    """The ceiling is the ratio SDPA without positions reaches against the same anchor; where
    it misses the target the goal is marked out of reach (here: memory, no-bias SDPA at 0.3 of
    dense's, over the 0.25 target)."""
    row = _content(
        attnconv_ms=2.0, dense_ms=4.0, flash_ms=1.0, attnconv_mb=40.0, dense_mb=100.0, flash_mb=30.0
    )
    goals = {g.what: g for g in gpu_goals._content_goals([row])}
    assert goals["bf16 training: x dense SDPA + bias"].ceiling == 4.0
    assert goals["bf16 training: x dense SDPA + bias"].reachable
    memory = goals["bf16 training: peak memory / dense"]
    assert memory.ceiling == 0.3 and memory.reachable is False
    assert goals["bf16 training: x SDPA without positions"].ceiling == 1.0
    (tmp_path / "cuda_layers_content.json").write_text(json.dumps({"rows": [row]}))
    text = gpu_goals.write(tmp_path)
    assert "| 0.40 | <= 0.25 | **no** | 0.30 (out of reach) |" in text
    assert "1 out of reach on this GPU" in text
    models = gpu_goals._model_goals([])
    assert {g.ceiling for g in models} == {None}  # the paper models: no ceiling measured
