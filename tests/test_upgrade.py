"""Old checkpoints of the quadratic encodings load through one table (encodings/upgrade.py): a
whole model's state dict with the old names loads with plain ``load_state_dict`` and through
``upgrade_state_dict`` alike; the hook survives pickling."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import attnconv
from attnconv.layers.encodings.upgrade import UPGRADES, upgrade_state_dict

SMALL = dict(hidden_size=12, num_layers=2, num_heads=3, ff_size=8, img_size=8)


def _old(state: dict, name: str) -> dict:
    """``state`` as the old parametrization wrote it: alpha (Nh,) or the factor L = A^T."""
    out = {}
    for k, v in state.items():
        if k.endswith("positional_encoding.spread"):
            old = k.removesuffix("spread")
            if name == "sa_quadratic":
                out[old + "alpha"] = v.square() / 2
            else:
                out[old + "precision_factor"] = v.transpose(-1, -2).contiguous()
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_quadratic_generalized"])
def test_a_whole_model_loads_its_old_names(name):
    torch.manual_seed(0)
    src = attnconv.create_model(name, **SMALL)
    old = _old(src.state_dict(), name)
    assert not any(k.endswith("spread") for k in old)
    upgraded = upgrade_state_dict(old)
    assert set(upgraded) == set(src.state_dict()) and set(old) != set(upgraded)
    for state in (old, upgraded):
        dst = attnconv.create_model(name, **SMALL)
        dst.load_state_dict(dict(state))  # strict: every name known after the upgrade
        for k, v in src.state_dict().items():
            torch.testing.assert_close(dst.state_dict()[k], v, rtol=1e-6, atol=0)


def test_the_hook_survives_pickling_and_copies():
    from attnconv.layers.encodings import QuadraticEncoding

    enc = QuadraticEncoding(3)
    buf = io.BytesIO()
    torch.save(enc, buf)
    buf.seek(0)
    for e in (torch.load(buf, weights_only=False), copy.deepcopy(enc)):
        e.load_state_dict({"centers": torch.zeros(3, 2), "alpha": torch.tensor([0.5, 2.0, 8.0])})
        torch.testing.assert_close(e.alpha.detach(), torch.tensor([0.5, 2.0, 8.0]))


def test_the_table_names_only_renames():
    rows = [row for rs in UPGRADES.values() for row in rs]
    assert {(r.old, r.new) for r in rows} == {("alpha", "spread"), ("precision_factor", "spread")}
