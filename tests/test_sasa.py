"""SASA ResNets: paper parameter counts, fast == reference, attention maps, real CIFAR training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnconv.data.datasets import load_dataset
from attnconv.models import create_model, list_models
from attnconv.models.sasa import SASAResNet

# Ramachandran et al. 2019, Table 1 / sec. 4.1 (1000 classes, 224x224), millions of parameters
PAPER = {
    "resnet26": 13.7,
    "resnet38": 19.6,
    "resnet50": 25.6,
    "sasa_resnet26": 10.3,
    "sasa_resnet38": 14.1,
    "sasa_resnet50": 18.0,
}
SMALL = dict(widths=(8, 16, 16, 32), num_heads=2, stem_heads=2)


def _count(m):
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("name", sorted(PAPER))
def test_imagenet_parameter_counts_match_paper(name):
    n = _count(create_model(name)) / 1e6
    assert abs(n - PAPER[name]) / PAPER[name] < 0.05, f"{name}: {n:.2f}M vs {PAPER[name]}M"


def test_registry_names():
    names = set(list_models())
    for d in (26, 38, 50):
        for sfx in ("", "_cifar"):
            want = {f"resnet{d}{sfx}", f"sasa_resnet{d}{sfx}", f"sasa_resnet{d}_convstem{sfx}"}
            assert want <= names


def test_imagenet_forward_small_input():
    m = create_model("sasa_resnet26", widths=(8, 16, 16, 32), num_heads=2, stem_heads=2)
    m.eval()
    with torch.no_grad():
        y = m(torch.randn(1, 3, 64, 64))
    assert y.shape == (1, 1000)
    assert m.attention_grid == (224, 224) and m.attention_grids[1] == (56, 56)


@pytest.mark.parametrize("name", ["sasa_resnet26_cifar", "sasa_resnet26_convstem_cifar"])
def test_model_fast_equals_reference(name):
    torch.manual_seed(0)
    m = create_model(name, zero_init_residual=False, **SMALL).double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    outs = []
    for backend in (None, "reference"):
        for mod in m.modules():
            if hasattr(mod, "backend"):
                mod.backend = backend
        y = m(x)
        grads = torch.autograd.grad(y.pow(2).sum(), list(m.parameters()))
        outs.append((y, grads))
    torch.testing.assert_close(outs[0][0], outs[1][0])
    for u, v in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(u, v)


def test_return_attention_dense_maps():
    torch.manual_seed(0)
    m = create_model("sasa_resnet26_cifar", **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits, attns = m(x, return_attention=True)
        local = m.local_attention_maps(x)
        torch.testing.assert_close(logits, m(x))
    assert len(attns) == len(local) == len(m.attention_grids) == 1 + 8
    assert m.attention_grid == (32, 32)
    for a, lm, (h, w) in zip(attns, local, m.attention_grids):
        assert a.shape == (2, 2, h * w, h * w) and a.grid == (h, w)
        assert lm.shape[:3] == (2, 2, h * w)
        torch.testing.assert_close(a.probs.sum(-1), torch.ones(2, 2, h * w))
    assert local[0].shape[-1] == 16 and local[1].shape[-1] == 49  # stem 4x4, layers 7x7
    with torch.no_grad():  # odd sizes: each map is on its layer's own grid, before pooling
        _, attns = m(torch.randn(1, 3, 13, 11), return_attention=True)
    assert attns[0].shape == (1, 2, 143, 143) and attns[2].shape == (1, 2, 143, 143)
    assert attns[0].grid == (13, 11)
    assert attns[3].grid == (7, 6)  # 13x11 pooled to 7x6 by the first strided block
    assert m._grids(13, 11) == [a.grid for a in attns]  # what the memory check counts
    with pytest.raises(ValueError, match="local_attention_maps") as e, torch.no_grad():
        m(torch.zeros(1, 3, 1024, 1024), return_attention=True)  # 2x2**40 floats, first map
    assert "\n" not in str(e.value) and "needs at least" in str(e.value)


def test_baseline_has_no_attention():
    m = create_model("resnet26_cifar", **{"widths": (8, 16, 16, 32)}).eval()
    with torch.no_grad():
        y, attns = m(torch.randn(1, 3, 32, 32), return_attention=True)
    assert y.shape == (1, 10) and attns == [] and m.attention_grid == (4, 4)
    assert m.local_attention_maps(torch.randn(1, 3, 32, 32)) == []


@pytest.mark.slow
def test_trains_on_real_cifar(cifar_zip, tmp_path):
    """A small SASA ResNet fits 20 real CIFAR-10 test images (16x16 centre crops, to stay fast):
    the loss drops by more than half."""
    torch.manual_seed(0)
    ds = load_dataset(str(cifar_zip), "test", max_per_class=2, cache_dir=tmp_path)
    x = ds.images[:, :, 8:24, 8:24].float().div(255).sub(0.5).div(0.25)  # (20, 3, 16, 16) crops
    y = ds.labels
    m = create_model("sasa_resnet26_cifar", **SMALL)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses


def test_bad_options():
    with pytest.raises(ValueError, match="unknown option"):
        create_model("sasa_resnet26", kernel=5)
    with pytest.raises(ValueError, match="spatial"):
        create_model("sasa_resnet26_cifar", spatial="mlp")
    m = create_model("sasa_resnet26_cifar", **SMALL)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        m(torch.randn(1, 1, 32, 32))
    assert isinstance(m, SASAResNet)
