"""analysis/evolution.py: the head statistics read from a centre log equal those of the model
that logged them (grid score, peak mass), and the mean distance equals eq. 9's Gaussian summed
by hand in float64."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnconv.analysis.evolution import (
    evolution_figure,
    head_evolution,
    last_heads,
    read_evolution,
)
from attnconv.analysis.grid import grid_scores, grid_travel
from attnconv.layers.encodings.centers import head_alphas, head_centers
from attnconv.models import create_model


def _log_line(model, step: int) -> str:
    return json.dumps(
        {
            "epoch": step,
            "step": step,
            "layers": [c.tolist() for c in head_centers(model)],
            "alpha": [a.tolist() for a in head_alphas(model)],
        }
    )


def _model(seed: int, alpha_scale: float = 1.0):
    torch.manual_seed(seed)
    m = create_model(
        "sa_quadratic",
        num_classes=10,
        hidden_size=8,
        num_layers=2,
        num_heads=4,
        ff_size=8,
        downsample=4,
        init_centers_std=1.5,
    )
    for layer in m.layers:
        enc = layer.attn.positional_encoding
        enc.set_alpha(enc.alpha.detach().double() * alpha_scale)
    return m


@pytest.mark.parametrize("alpha_scale", [1.0, 6.0])
def test_evolution_equals_the_model_that_logged_it(tmp_path, alpha_scale):
    m0, m1 = _model(0), _model(1, alpha_scale)
    log = tmp_path / "centers.jsonl"
    log.write_text(
        _log_line(m0, 0)
        + "\n"
        + json.dumps({"epoch": 0, "layers": []})
        + "\n"
        + _log_line(m1, 100)
        + "\n"
    )
    assert [r["step"] for r in read_evolution(log)] == [0, 100]  # lines without alpha skipped
    evo = head_evolution(log, grid=(8, 8))
    for e, m in zip(evo, (m0, m1)):
        for got, want in zip(e["layers"], grid_scores(m, (8, 8))):
            assert got["peak_mass"] == want.peak_mass
            assert (got["sharp_heads"], got["grid3"], got["grid5"]) == (
                want.sharp_heads,
                want.grid3,
                want.grid5,
            )
    assert all(lay["displacement"] == 0.0 for lay in evo[0]["layers"])
    for li, lay in enumerate(evo[1]["layers"]):
        moved = (head_centers(m1)[li] - head_centers(m0)[li]).norm(dim=-1).mean()
        assert lay["displacement"] == pytest.approx(float(moved), rel=1e-6)
        assert lay["travel3"] == grid_travel(head_centers(m1)[li])
        dist = head_centers(m1)[li].norm(dim=-1).mean()
        assert lay["center_distance"] == pytest.approx(float(dist), rel=1e-6)
    if alpha_scale > 1:
        assert max(max(lay["peak_mass"]) for lay in evo[1]["layers"]) > 0.5  # some sharp heads
    # mean distance by hand: P(k) ~ exp(-alpha |k - q - Delta|^2), query (4, 4) of 8 x 8
    r, c = np.meshgrid(np.arange(8) - 4, np.arange(8) - 4, indexing="ij")
    for li, lay in enumerate(evo[1]["layers"]):
        ds = []
        for (dr, dc), a in zip(
            head_centers(m1)[li].double().numpy(), head_alphas(m1)[li].double().numpy()
        ):
            p = np.exp(-a * ((r - dr) ** 2 + (c - dc) ** 2))
            ds.append((p / p.sum() * np.sqrt(r**2 + c**2)).sum())
        assert lay["mean_distance"] == pytest.approx(float(np.mean(ds)), rel=1e-5)
    assert evolution_figure(evo, tmp_path / "evo.png").stat().st_size > 1000


def test_last_heads_are_the_last_logged_model(tmp_path):
    """The last step's maps are eq. 9's Gaussian at the middle query (normalized by hand in
    float64), with the centres and grid score of the model that logged it."""
    m0, m1 = _model(0), _model(1, 6.0)
    log = tmp_path / "centers.jsonl"
    log.write_text(_log_line(m1, 100) + "\n" + _log_line(m0, 0) + "\n")  # out of order
    step, heads = last_heads(log, grid=(8, 8))
    assert step == 100 and len(heads) == len(head_centers(m1))
    r, c = np.meshgrid(np.arange(8) - 4, np.arange(8) - 4, indexing="ij")
    for hd, ctr, alpha, want in zip(
        heads, head_centers(m1), head_alphas(m1), grid_scores(m1, (8, 8))
    ):
        torch.testing.assert_close(hd["centers"], ctr.float())
        assert hd["score"].offsets == want.offsets and hd["score"].peak_mass == want.peak_mass
        for mp, (dr, dc), a in zip(hd["maps"], ctr.double().numpy(), alpha.double().numpy()):
            p = np.exp(-a * ((r - dr) ** 2 + (c - dc) ** 2))
            np.testing.assert_allclose(mp.numpy(), p / p.sum(), atol=1e-6)


def test_a_log_without_alpha_is_a_clear_error(tmp_path):
    log = tmp_path / "centers.jsonl"
    log.write_text(json.dumps({"epoch": 0, "layers": [[[0.0, 0.0]]]}) + "\n")
    with pytest.raises(ValueError, match="no centre-log line with alpha"):
        head_evolution(log)


def test_step_axis_labels_read_in_thousands():
    """150,000 steps on a panel's axis: '150k', not six-digit labels running into each other."""
    from attnconv.analysis.evolution import _thousands

    assert [_thousands(v) for v in (0, 500, 10_000, 37_500, 150_000)] == [
        "0",
        "500",
        "10k",
        "37.5k",
        "150k",
    ]
