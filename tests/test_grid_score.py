"""Grid score: distinct kernel offsets held by sharp quadratic heads (Theorem 1's grid)."""

from __future__ import annotations

import torch

import attnconv
from attnconv.analysis.grid import grid_scores, layer_grid_score
from attnconv.convert import conv_to_attention


def test_converted_convolutions_score_their_kernel():
    a3 = conv_to_attention(torch.nn.Conv2d(4, 4, 3, padding=1), alpha=50.0)
    (s,) = grid_scores(a3, (16, 16))
    assert (s.sharp_heads, s.grid3, s.grid5) == (9, 9, 9)
    assert sorted(map(tuple, s.offsets)) == [(r, c) for r in (-1, 0, 1) for c in (-1, 0, 1)]
    a5 = conv_to_attention(torch.nn.Conv2d(2, 2, 5, padding=2), alpha=50.0)
    (s5,) = grid_scores(a5, (12, 12))
    assert (s5.sharp_heads, s5.grid3, s5.grid5) == (25, 9, 25)


def test_soft_or_duplicate_heads_do_not_count():
    torch.manual_seed(0)
    m = attnconv.create_model("sa_quadratic", hidden_size=18, num_layers=2, ff_size=8)
    scores = grid_scores(m, m.attention_grid)
    assert len(scores) == 2 and all(s.sharp_heads == 0 and s.grid5 == 0 for s in scores)
    enc = m.layers[0].attn.positional_encoding
    with torch.no_grad():
        enc.centers.copy_(torch.tensor([[0.0, 1.0]] * 8 + [[3.0, 0.0]]))  # 8 heads on one pixel
        enc.set_alpha(20.0)
    s = layer_grid_score(m.layers[0].attn, 16, 16)
    assert s.sharp_heads == 9 and s.grid3 == 1 and s.grid5 == 1  # (3, 0) is outside the 5x5
    learned = attnconv.create_model("sa_learned", hidden_size=18, num_layers=1)
    assert grid_scores(learned, (16, 16)) == []
