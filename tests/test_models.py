"""Registry, ResNet18 and ViT: parameter counts, real-CIFAR forward/backward, attention maps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnconv
from attnconv.loading import create_model
from attnconv.models import list_models
from attnconv.models._common import num_params
from attnconv.models.vit import resample_pos_embed, sinusoidal_2d
from cifar_images import cifar_batch

MINE = ("resnet18_cifar", "vit_tiny_cifar", "vit_small_cifar", "vit_base_patch16_224")


def _forward_backward(model, x, y):
    model.train()
    logits, attns = model(x, return_attention=True)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    return logits, attns


def test_registry_lists_models_and_rejects_unknown():
    names = list_models()
    for n in MINE + ("transformer_base", "transformer_small", "sa_quadratic", "sa_learned"):
        assert n in names
    with pytest.raises(ValueError, match="did you mean .*resnet18_cifar") as e:
        create_model("resnet19_cifar")
    assert len(str(e.value)) < 200  # the closest few, not every registered name
    with pytest.raises(ValueError, match=r"e\.g\. .*models in all: attnconv\.list_models\(\)"):
        create_model("zzzz")
    with pytest.raises(ValueError, match="unknown option.*depth_x.*known: .*depth"):
        create_model("vit_tiny_cifar", depth_x=3)
    assert attnconv.create_model is create_model


def test_parameter_counts():
    # Cordonnier et al. Table 1: ResNet18 11.2M; ViT-B/16 86.6M (Dosovitskiy et al. Table 1)
    with torch.device("meta"):  # shapes only, no initialization cost
        n = {name: num_params(create_model(name)) for name in MINE}
    assert abs(n["resnet18_cifar"] / 11.2e6 - 1) < 0.03
    assert n["resnet18_cifar"] == 11_173_962
    assert abs(n["vit_base_patch16_224"] / 86.6e6 - 1) < 0.01
    assert n["vit_base_patch16_224"] == 86_567_656  # = timm's count
    assert n["vit_tiny_cifar"] == 5_362_762
    assert n["vit_small_cifar"] == 21_342_346
    # the same count on a real (CPU) build
    assert num_params(create_model("resnet18_cifar")) == 11_173_962


def test_resnet_real_cifar_forward_backward(cifar_zip):
    x, y = (t.clone() for t in cifar_batch(cifar_zip))
    m = create_model("resnet18_cifar", widths=(16, 32, 32, 64))
    logits, attns = _forward_backward(m, x, y)
    assert logits.shape == (8, 10) and attns == []
    assert m.forward_features(x).shape == (8, 64, 4, 4) and m.attention_grid == (4, 4)
    assert m.num_prefix_tokens == 0


@pytest.mark.parametrize("pos_embed", ["learned", "sinusoidal_2d"])
def test_vit_real_cifar_forward_backward_and_attention(cifar_zip, pos_embed):
    torch.manual_seed(0)
    x, y = (t.clone() for t in cifar_batch(cifar_zip))
    m = create_model("vit_tiny_cifar", depth=2, embed_dim=48, num_heads=3, pos_embed=pos_embed)
    logits, attns = _forward_backward(m, x, y)
    assert logits.shape == (8, 10)
    assert m.attention_grid == (8, 8) and m.num_prefix_tokens == 1
    assert len(attns) == 2
    for a in attns:  # AttentionMaps carry their grid and the class token
        assert a.shape == (8, 3, 65, 65) and a.grid == (8, 8) and a.num_prefix_tokens == 1
        torch.testing.assert_close(a.probs.sum(-1), torch.ones(8, 3, 65))
    # attention maps come with the fast path on; the fast path gives the same logits
    m.eval()
    torch.testing.assert_close(m(x), m(x, return_attention=True)[0], rtol=1e-5, atol=1e-5)
    feats = m.forward_features(x)
    assert feats.shape == (8, 65, 48)
    torch.testing.assert_close(m.forward_head(feats), m(x))


def test_vit_fast_equals_reference_impl():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32, 32)
    fast = create_model("vit_tiny_cifar", depth=2, embed_dim=24, num_heads=3).eval()
    ref = create_model("vit_tiny_cifar", depth=2, embed_dim=24, num_heads=3, backend="reference")
    ref.load_state_dict(fast.state_dict())
    torch.testing.assert_close(fast(x), ref.eval()(x), rtol=1e-4, atol=1e-5)


def test_vit_resamples_position_embeddings():
    torch.manual_seed(2)
    m = create_model("vit_tiny_cifar", depth=1, embed_dim=24, num_heads=3).eval()
    # same size: untouched; identity resampling returns the table itself
    assert resample_pos_embed(m.pos_embed, (8, 8), (8, 8)) is m.pos_embed
    # a smooth table (linear in row/col) is interpolated at the new pixel centres (PyTorch's
    # bicubic, a = -0.75, is exact on constants and close, not exact, on linear functions)
    D = 24
    r, c = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    lin = (r[..., None] * 0.1 + c[..., None] * 0.05).expand(8, 8, D).reshape(1, 64, D)
    pe = torch.cat([torch.full((1, 1, D), 7.0), lin], 1)
    up = resample_pos_embed(pe, (8, 8), (16, 16))
    assert up.shape == (1, 257, D)
    torch.testing.assert_close(up[:, 0], pe[:, 0])  # class token kept
    # new pixel centre (i + 0.5) / 2 - 0.5 in old coordinates, away from the border
    i, j = 7, 9
    expect = ((i + 0.5) / 2 - 0.5) * 0.1 + ((j + 0.5) / 2 - 0.5) * 0.05
    torch.testing.assert_close(up[0, 1 + i * 16 + j, 0], torch.tensor(expect), atol=0.01, rtol=0)
    const = resample_pos_embed(torch.full((1, 65, D), 3.0), (8, 8), (12, 6))
    torch.testing.assert_close(const, torch.full((1, 73, D), 3.0))
    # a 48x40 image runs and gives (1 + 12*10)-token maps; set_img_size makes it permanent
    _, attns = m(torch.randn(1, 3, 48, 40), return_attention=True)
    assert attns[0].shape == (1, 3, 121, 121) and attns[0].grid == (12, 10)
    cls_before = m.pos_embed[:, 0].clone()
    m.set_img_size(64)
    assert m.pos_embed.shape == (1, 257, 24) and m.attention_grid == (16, 16)
    torch.testing.assert_close(m.pos_embed[:, 0], cls_before)
    assert m(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    with pytest.raises(ValueError, match="not a multiple of the patch size 4.*expects 64x64"):
        m(torch.randn(1, 3, 30, 32))
    # a state dict saved at 32x32 loads into a 64x64 model (resampled), and back
    small = create_model("vit_tiny_cifar", depth=1, embed_dim=24, num_heads=3)
    big = create_model("vit_tiny_cifar", depth=1, embed_dim=24, num_heads=3, img_size=64)
    big.load_state_dict(small.state_dict())
    expect = resample_pos_embed(small.pos_embed.detach(), (8, 8), (16, 16))
    torch.testing.assert_close(big.pos_embed.detach(), expect)
    small.load_state_dict(big.state_dict())


def test_sinusoidal_2d_rows_and_columns():
    pe = sinusoidal_2d(3, 5, 16).view(3, 5, 16)
    # first half depends only on the row, second half only on the column
    torch.testing.assert_close(pe[:, 0, :8], pe[:, 4, :8])
    torch.testing.assert_close(pe[0, :, 8:], pe[2, :, 8:])
    assert not torch.allclose(pe[0, 0, :8], pe[1, 0, :8])
    with pytest.raises(ValueError, match="embed_dim % 4"):
        sinusoidal_2d(2, 2, 6)


def test_bad_inputs():
    m = create_model("vit_tiny_cifar", depth=1, embed_dim=24, num_heads=3)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        m(torch.randn(3, 32, 32))
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="pos_embed must be one of"):
        create_model("vit_tiny_cifar", pos_embed="rope")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_model("vit_tiny_cifar", embed_dim=50, num_heads=3)
    with pytest.raises(ValueError, match="channels|\\(B, 3, H, W\\)"):
        create_model("resnet18_cifar", widths=(8,), depths=(1,))(torch.randn(1, 1, 32, 32))


@pytest.mark.parametrize("pos_embed", ["learned", "sinusoidal_2d"])
def test_vit_gradcheck_float64(pos_embed):
    torch.manual_seed(4)
    m = create_model(
        "vit_tiny_cifar", img_size=8, depth=1, embed_dim=8, num_heads=2, pos_embed=pos_embed
    ).double()
    torch.nn.init.normal_(m.head.weight)  # the zero-initialized head would hide the features
    x = torch.randn(1, 3, 12, 8, dtype=torch.float64, requires_grad=True)  # resampled grid
    assert torch.autograd.gradcheck(m, (x,))
