"""The port between the paper models and the reference code's ``BertImage``, both directions,
against a re-statement of the reference's forward and state-dict layout (bench/reference_algo.py:
names, shapes, the row/column roles of its learned tables, read from models/bert.py)."""

from __future__ import annotations

import pytest
import torch

import attnconv
from attnconv.bench.reference_algo import ReferenceBertImage, check_equal, kind_of
from attnconv.models.reference_port import from_reference, to_reference

SMALL = dict(hidden_size=12, num_layers=2, num_heads=3, ff_size=8)
NAMES = ["sa_quadratic", "sa_learned", "sa_learned_content"]


@pytest.mark.parametrize("name", NAMES)
def test_ours_to_reference_computes_the_same_logits(name):
    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL).double()
    assert check_equal(m, ReferenceBertImage(m), batch=3, tol=1e-12) < 1e-12


@pytest.mark.parametrize("name", NAMES)
def test_reference_to_ours_computes_the_same_logits(name):
    """A reference state dict (its own parameters, its persistent relative_indices buffers) loads
    into our model, which then computes the reference's logits."""
    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL).double()
    ref = ReferenceBertImage(m).eval()
    with torch.no_grad():  # parameters of its own, not ours
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    state = ref.state_dict()
    if kind_of(m) != "gaussian":
        for i in range(len(ref.encoder.layer)):
            state[f"encoder.layer.{i}.attention.self.relative_indices"] = torch.zeros(16, 16)
    dst = attnconv.create_model(name, **SMALL).double().eval()
    dst.load_state_dict(from_reference(state, dst))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), ref(x), rtol=1e-12, atol=1e-12)


def test_position_only_learned_tables_swap_axes():
    """The position-only reference layer broadcasts its row_scores along the image columns: its
    row tables are our column tables (and head keys), not our row tables."""
    torch.manual_seed(0)
    m = attnconv.create_model("sa_learned", **SMALL)
    enc = m.layers[0].attn.positional_encoding
    ref = to_reference(m)
    p = "encoder.layer.0.attention.self."
    assert torch.equal(ref[p + "row_embeddings.weight"], enc.tables.rel_col)
    assert torch.equal(ref[p + "head_keys_row.weight"], enc.head_keys_col.weight)
    c = attnconv.create_model("sa_learned_content", **SMALL)
    assert torch.equal(to_reference(c)[p + "row_embeddings.weight"],
                       c.layers[0].attn.positional_encoding.tables.rel_row)  # fmt: skip
