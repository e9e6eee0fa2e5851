"""The numbers behind the analysis figures, on attention tensors built by hand (no model needed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.path import Path as MplPath

from attnconv.analysis.centers import (
    contour_lines,
    mass_level,
    mass_region,
    read_center_log,
    write_center_log_line,
)
from attnconv.analysis.convlike import ConvLikeness, conv_likeness, kernel_of
from attnconv.analysis.distance import MeanDistance, mean_attention_distance
from attnconv.analysis.maps import MapAverage, crop, query_maps
from attnconv.analysis.posemb import patch_filter_pcs, position_similarity
from attnconv.layers.attention_map import AttentionMap


def coords(grid):
    h, w = grid
    return torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(
        -1, 2
    )  # (hw, 2)


def hard_heads(grid, offsets, batch=1):
    """Heads attending only to q + offset (clamped into the image at borders): (B, Nh, T, T)."""
    h, w = grid
    pos = coords(grid)
    a = torch.zeros(batch, len(offsets), h * w, h * w, dtype=torch.float64)
    for hd, (dr, dc) in enumerate(offsets):
        r = (pos[:, 0] + dr).clamp(0, h - 1)
        c = (pos[:, 1] + dc).clamp(0, w - 1)
        a[:, hd, torch.arange(h * w), r * w + c] = 1.0
    return a


def gaussian_heads(grid, centers, alpha):
    """Quadratic-encoding heads (Cordonnier eq. 9): softmax_k(-alpha ||k - q - Delta||^2)."""
    pos = coords(grid).double()
    d = pos[None, :, :] - pos[:, None, :]  # (T, T, 2): k - q
    c = torch.as_tensor(centers, dtype=torch.float64)
    logits = -alpha * ((d[None] - c[:, None, None, :]) ** 2).sum(-1)  # (Nh, T, T)
    return torch.softmax(logits, -1)[None]


def kxk_offsets(k, dilation=1):
    r = range(-(k // 2), k - k // 2)
    return [(i * dilation, j * dilation) for i in r for j in r]


# ---------------------------------------------------------------------------- conv-likeness


@pytest.mark.parametrize("k,grid,batch", [(3, (8, 8), 1), (5, (9, 7), 3), (2, (6, 6), 2)])
def test_hard_kxk_heads_score_exactly_one(k, grid, batch):
    offs = kxk_offsets(k)
    res = conv_likeness(hard_heads(grid, offs, batch), grid)
    assert res.score == 1.0
    assert res.head_scores == [1.0] * k * k
    assert res.stability == [1.0] * k * k
    assert res.offsets == offs
    assert res.distinct and res.kernel == k and res.dilation == 1


def test_dilated_kernel_and_shared_batch():
    grid = (10, 10)
    offs = kxk_offsets(3, dilation=2)
    acc = ConvLikeness()
    shared = AttentionMap(hard_heads(grid, offs, batch=1).float(), grid)
    acc.update(shared, batch=7)  # one map shared by 7 images
    res = acc.result()
    assert res.score == 1.0 and res.kernel == 3 and res.dilation == 2


def test_prefix_mass_counts_against_the_score():
    grid = (4, 4)
    a = hard_heads(grid, kxk_offsets(3))[0]  # (Nh, 16, 16)
    t = a.shape[-1] + 1
    full = torch.zeros(1, 9, t, t, dtype=torch.float64)
    full[0, :, 1:, 1:] = 0.75 * a
    full[0, :, :, 0] += 0.25  # a quarter of every row on the class token
    full[0, :, 0, 1:] = 0.75 / 16
    res = conv_likeness(full, grid, num_prefix_tokens=1)
    assert res.kernel == 3
    assert res.head_scores == pytest.approx([0.75] * 9, abs=1e-12)


def test_soft_heads_score_below_one_and_match_bruteforce():
    grid = (7, 6)
    centers = [(0.0, 1.0), (-1.0, -1.0), (2.0, 0.0)]
    a = gaussian_heads(grid, centers, alpha=0.8)
    res = conv_likeness(a, grid)
    assert res.offsets == [(0, 1), (-1, -1), (2, 0)]
    pos = coords(grid)
    h, w = grid
    for hd, (dr, dc) in enumerate(res.offsets):
        vals = []
        for q, (r, c) in enumerate(pos.tolist()):
            if 0 <= r + dr < h and 0 <= c + dc < w:
                vals.append(float(a[0, hd, q, (r + dr) * w + c + dc]))
        assert res.head_scores[hd] == pytest.approx(sum(vals) / len(vals), rel=1e-9)
        assert res.head_scores[hd] < 1.0
    assert res.kernel == 0


@given(
    h=st.integers(2, 5),
    w=st.integers(2, 5),
    nh=st.integers(1, 4),
    b=st.integers(1, 4),
    split=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_conv_likeness_batches_equal_one_pass_and_reference(h, w, nh, b, split, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.softmax(3 * torch.randn(b, nh, h * w, h * w, generator=g, dtype=torch.float64), -1)
    one = conv_likeness(a, (h, w))
    acc = ConvLikeness()
    for part in a.tensor_split(split):
        if part.shape[0]:
            acc.update(AttentionMap(part, (h, w)))
    many = acc.result()
    assert many.offsets == one.offsets
    assert many.head_scores == pytest.approx(one.head_scores, rel=1e-12)
    assert many.stability == pytest.approx(one.stability)
    # plain reference: loops over images, heads and queries
    pos = coords((h, w)).tolist()
    for hd in range(nh):
        offs = {}
        for i in range(b):
            for q, (r, c) in enumerate(pos):
                k = int(a[i, hd, q].argmax())
                o = (k // w - r, k % w - c)
                offs[o] = offs.get(o, 0) + 1
        best = max(offs.values())
        assert offs.get(one.offsets[hd]) == best  # modal offset (ties: any of the maxima)
        dr, dc = one.offsets[hd]
        vals = [
            float(a[i, hd, q, (r + dr) * w + (c + dc)])
            for i in range(b)
            for q, (r, c) in enumerate(pos)
            if 0 <= r + dr < h and 0 <= c + dc < w
        ]
        assert one.head_scores[hd] == pytest.approx(sum(vals) / len(vals), rel=1e-9)
        peak = float(a[:, hd].max(-1).values.mean())
        assert one.peak[hd] == pytest.approx(peak, rel=1e-9)


def test_kernel_of():
    assert kernel_of(kxk_offsets(3)) == (3, 1)
    assert kernel_of(kxk_offsets(4, 3)) == (4, 3)
    assert kernel_of([(0, 0)] * 9) == (0, 0)
    assert kernel_of(kxk_offsets(3)[:-1] + [(5, 5)]) == (0, 0)


# ---------------------------------------------------------------------------- mass contours


@pytest.mark.parametrize("center", [(2.0, -3.0), (-1.4, 2.3), (0.0, 0.0)])
def test_half_mass_contour_surrounds_known_center(center):
    grid, q = (16, 16), (8, 8)
    a = gaussian_heads(grid, [center], alpha=0.3)
    m = a[0, 0, q[0] * 16 + q[1]].reshape(16, 16).numpy()
    region = mass_region(m, 0.5)
    level = mass_level(m, 0.5)
    # the smallest level set holding half the mass: without its lowest level it holds less
    assert m[region].sum() >= 0.5 and m[region & (m > level)].sum() < 0.5
    cr, cc = q[0] + center[0], q[1] + center[1]
    (line,) = contour_lines(m, 0.5)  # one closed curve
    path = MplPath(line[:, ::-1])  # (x=col, y=row)
    assert path.contains_point((cc, cr))
    assert not path.contains_point((cc + 4.0, cr))  # the centre sits inside, far pixels outside
    # the curve is centred on Delta: its vertices' mean is within half a pixel of it
    assert np.abs(line.mean(0) - (cr, cc)).max() < 0.5
    (line90,) = contour_lines(m, 0.9)
    assert MplPath(line90[:, ::-1]).contains_path(path)  # 90% contour encloses the 50% one


def test_mass_level_of_a_one_hot_map_and_errors():
    m = np.zeros((5, 5))
    m[1, 3] = 1.0
    assert mass_level(m, 0.5) == 1.0
    (line,) = contour_lines(m, 0.5)
    assert MplPath(line[:, ::-1]).contains_point((3, 1))
    with pytest.raises(ValueError, match="fraction"):
        mass_level(m, 1.5)
    with pytest.raises(ValueError, match="no mass"):
        mass_level(np.zeros((3, 3)), 0.5)


def test_center_log_roundtrip(tmp_path):
    log = tmp_path / "centers.jsonl"
    for ep in (2, 0, 1):
        write_center_log_line(log, ep, [torch.full((4, 2), float(ep)), torch.zeros(4, 2)])
    epochs, layers = read_center_log(log)
    assert epochs.tolist() == [0, 1, 2]
    assert len(layers) == 2 and layers[0].shape == (3, 4, 2)
    assert layers[0][:, 0, 0].tolist() == [0.0, 1.0, 2.0]
    log.write_text(log.read_text() + json.dumps({"epoch": 3}) + "\n")
    with pytest.raises(ValueError, match=r"centers.jsonl:4"):
        read_center_log(log)
    with pytest.raises(FileNotFoundError):
        read_center_log(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------- mean distance


@pytest.mark.parametrize("grid,ppt,prefix", [((6, 5), (2.0, 2.0), 0), ((4, 4), (4.0, 4.0), 1)])
def test_uniform_head_distance_is_mean_pixel_distance(grid, ppt, prefix):
    h, w = grid
    t = prefix + h * w
    a = torch.full((2, 3, t, t), 1.0 / t)
    d = mean_attention_distance(a, grid, num_prefix_tokens=prefix, pixels_per_token=ppt)
    # reference: mean over all pixel pairs of the image (token centres ppt apart)
    pts = [((i + 0.5) * ppt[0], (j + 0.5) * ppt[1]) for i in range(h) for j in range(w)]
    ref = sum(math.dist(p, q) for p in pts for q in pts) / len(pts) ** 2
    assert d.tolist() == pytest.approx([ref] * 3, rel=1e-5)


def test_hard_head_distance_is_its_offset_length():
    grid = (6, 6)
    a = hard_heads(grid, [(0, 0), (0, 1), (1, 1)]).float()
    d = mean_attention_distance(a, grid, pixels_per_token=(4, 4))
    # clamped at the border: (0, 1) stays put in the last column (6 of 36 queries); (1, 1) moves
    # diagonally for 25 queries, one pixel straight for 10 (last row / column), not at the corner
    expect = [0.0, 4.0 * 30 / 36, (25 * 4 * math.sqrt(2) + 10 * 4.0) / 36]
    assert d.tolist() == pytest.approx(expect, rel=1e-5)


@given(h=st.integers(1, 4), w=st.integers(1, 4), b=st.integers(1, 3), seed=st.integers(0, 999))
def test_mean_distance_matches_loops(h, w, b, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.softmax(torch.randn(b, 2, 1 + h * w, 1 + h * w, generator=g, dtype=torch.float64), -1)
    acc = MeanDistance((h, w), (3.0, 1.5))
    for part in a.split(1):
        acc.update(AttentionMap(part, (h, w), 1))
    ref = []
    for hd in range(2):
        tot = 0.0
        for i in range(b):
            for q in range(h * w):
                row = a[i, hd, 1 + q, 1:]
                row = row / row.sum()
                for k in range(h * w):
                    dy = (k // w - q // w) * 3.0
                    dx = (k % w - q % w) * 1.5
                    tot += float(row[k]) * math.hypot(dy, dx)
        ref.append(tot / (b * h * w))
    assert acc.result().tolist() == pytest.approx(ref, rel=1e-5, abs=1e-6)


# ---------------------------------------------------------------------------- maps


def test_query_maps_pick_rows_and_scale_to_coarser_layers():
    g = torch.Generator().manual_seed(0)
    a1 = torch.softmax(torch.randn(3, 2, 1 + 64, 1 + 64, generator=g), -1)
    a2 = torch.softmax(torch.randn(1, 2, 1 + 16, 1 + 16, generator=g), -1)  # 4x4: downsampled
    m1, m2 = AttentionMap(a1, (8, 8), 1), AttentionMap(a2, (4, 4), 1)
    m = query_maps([m1, m2], (8, 8), (5, 2), image=1)
    assert m[0].shape == (2, 8, 8) and m[1].shape == (2, 4, 4)
    assert torch.equal(m[0], a1[1, :, 1 + 5 * 8 + 2, 1:].reshape(2, 8, 8))
    assert torch.equal(m[1], a2[0, :, 1 + 2 * 4 + 1, 1:].reshape(2, 4, 4))
    avg = query_maps([m1], (8, 8), (5, 2))[0]
    assert torch.allclose(avg, a1[:, :, 1 + 42, 1:].mean(0).reshape(2, 8, 8))
    acc = MapAverage((8, 8), queries=[(5, 2), (0, 0)])
    acc.update([AttentionMap(a1[:2], (8, 8), 1), m2], batch=2)
    acc.update([AttentionMap(a1[2:], (8, 8), 1), m2], batch=1)
    r = acc.result()
    assert torch.allclose(r[0][:, 0], avg.reshape(2, 64))
    assert torch.allclose(r[1][:, 1], a2[0, :, 1, 1:])
    with pytest.raises(ValueError, match="outside the token grid"):
        query_maps([m1], (8, 8), (8, 0))
    with pytest.raises(ValueError, match=r"\(B, Nh, T, T\)"):
        AttentionMap(a1[0], (8, 8), 1)
    with pytest.raises(ValueError, match="does not fit a 4x4 grid with 1 prefix"):
        AttentionMap(a1, (4, 4), 1)  # a grid is never guessed: it must fit exactly
    with pytest.raises(TypeError, match="expected an AttentionMap"):
        query_maps([a1], (8, 8), (0, 0))


def test_crop_keeps_the_query_inside():
    m = torch.arange(100.0).reshape(1, 10, 10)
    sub, r0, c0 = crop(m, (1, 9), 7)
    assert sub.shape == (1, 7, 7) and (r0, c0) == (0, 3)
    assert sub[0, 1 - r0, 9 - c0] == m[0, 1, 9]
    assert crop(m, (5, 5), None)[0] is m


# ---------------------------------------------------------------------------- embeddings


def test_position_similarity_and_patch_pcs():
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(1 + 12, 16, generator=g)
    s = position_similarity(pos, (3, 4), num_prefix_tokens=1)
    assert s.shape == (3, 4, 3, 4)
    assert torch.allclose(s.reshape(12, 12).diagonal(), torch.ones(12))
    e = torch.nn.functional.normalize(pos[1:], dim=-1)
    assert torch.allclose(s[1, 2, 0, 3], e[6] @ e[3])
    with pytest.raises(ValueError, match="does not fit"):
        position_similarity(pos, (4, 4), num_prefix_tokens=1)
    # filters built from two known orthogonal directions with decreasing variance
    u = torch.linalg.qr(torch.randn(48, 2, generator=g, dtype=torch.float64))[0].T  # (2, 48)
    coef = torch.randn(200, 2, generator=g, dtype=torch.float64)
    coef = torch.linalg.qr(coef - coef.mean(0))[0] * torch.tensor(
        [10.0, 3.0]
    )  # centred, orthogonal
    wgt = (coef @ u + 1e-3 * torch.randn(200, 48, generator=g, dtype=torch.float64)).reshape(
        200, 3, 4, 4
    )
    pcs, ratio = patch_filter_pcs(wgt, n=28)
    assert pcs.shape == (28, 3, 4, 4) and ratio.shape == (28,)
    assert abs(float(pcs[0].double().flatten() @ u[0])) == pytest.approx(1.0, abs=1e-4)
    assert abs(float(pcs[1].double().flatten() @ u[1])) == pytest.approx(1.0, abs=1e-4)
    assert float(ratio[:2].sum()) > 0.999 and bool((ratio[:-1] >= ratio[1:]).all())
    assert patch_filter_pcs(torch.randn(5, 3, 2, 2), n=28)[0].shape[0] == 5


# ---------------------------------------------------------------------------- converted convs


@pytest.mark.parametrize("k,dilation", [(3, 1), (5, 1), (3, 2)])
def test_converted_convolution_scores_exactly_one(k, dilation):
    from attnconv.analysis.centers import head_centers
    from attnconv.convert import conv_to_attention

    torch.manual_seed(0)
    pad = dilation * (k // 2)
    conv = torch.nn.Conv2d(3, 4, k, padding=pad, dilation=dilation)
    layer = conv_to_attention(conv)  # hard heads (alpha -> inf), Theorem 1
    x = torch.randn(2, 3, 7, 6)
    y, attn = layer(x, return_attention=True)  # attention over the zero-padded image
    assert torch.allclose(y, conv(x), atol=1e-5)
    res = conv_likeness(attn, (7 + 2 * pad, 6 + 2 * pad))
    assert res.score == 1.0 and min(res.stability) == 1.0
    assert (res.kernel, res.dilation) == (k, dilation)
    (centers,) = head_centers(layer)  # the wrapper delegates to its one attention layer
    assert sorted(map(tuple, centers.round().int().tolist())) == sorted(res.offsets)


def test_soft_converted_convolution_approaches_one_with_alpha():
    from attnconv.convert import conv_to_attention

    conv = torch.nn.Conv2d(2, 2, 3, padding=1)
    x = torch.randn(1, 2, 6, 6)
    scores = []
    for alpha in (0.5, 2.0, 8.0):
        _, attn = conv_to_attention(conv, alpha=alpha)(x, return_attention=True)
        res = conv_likeness(attn, (8, 8))
        assert res.kernel == 3  # the modal offsets are already the 3x3 grid
        scores.append(res.score)
    assert scores[0] < scores[1] < scores[2] < 1.0 and scores[2] > 0.99  # Lemma 2


# ---------------------------------------------------------------------------- typed report


@pytest.mark.slow
def test_measure_is_typed_data_on_each_layers_own_grid(tmp_path):
    """The analysis is data first: a SASA network's strided layers are measured on their own
    (coarser) grids, read from the AttentionMaps, and the rendered report.json says the same."""
    from attnconv.analysis.measure import measure_model
    from attnconv.analysis.report import render_report
    from attnconv.models import create_model

    torch.manual_seed(0)
    kw = dict(widths=(8, 8, 8, 8), depths=(1, 1, 1, 1), num_heads=2, stem_heads=2, img_size=16)
    m = create_model("sasa_resnet26_cifar", **kw)
    images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    res = measure_model(m, images, mean=(0.5,) * 3, std=(0.25,) * 3, image_index=2)
    assert res.grid == (16, 16) and res.query_token == (8, 8)
    assert res.layer_grids == [(16, 16), (16, 16), (16, 16), (8, 8), (4, 4)]  # stem, 4 blocks
    assert [tuple(a.shape[-2:]) for a in res.average] == res.layer_grids
    assert [len(d) for d in res.mean_distance] == [a.shape[0] for a in res.average]
    rep = render_report(res, tmp_path, title="t")
    assert json.loads((tmp_path / "report.json").read_text()) == rep
    assert [tuple(layer["grid"]) for layer in rep["layers"]] == res.layer_grids
    assert rep["mean_distance_px"] == [d.tolist() for d in res.mean_distance]
    assert "| layer | score |" in (tmp_path / "index.md").read_text()
