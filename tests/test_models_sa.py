"""Cordonnier et al.'s fully-attentional CIFAR network: Table 1 sizes, real-CIFAR passes,
attention maps, fast == reference through the whole model, overrides and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnconv.models import create_model
from attnconv.models._common import num_params
from cifar_images import cifar_batch

SA_MODELS = (
    "sa_quadratic",
    "sa_quadratic_generalized",
    "sa_learned",
    "sa_learned_content",
    "sa_learned_content_runs",
)
SMALL = dict(hidden_size=24, num_layers=2, num_heads=3, ff_size=32)


@pytest.mark.parametrize(
    "name,table1",
    [("sa_quadratic", 12.1e6), ("sa_learned", 12.3e6), ("sa_learned_content", 29.5e6)],
)
def test_parameter_counts_match_table1(name, table1):
    with torch.device("meta"):
        m = create_model(name)
    assert abs(num_params(m) / table1 - 1) < 0.03, num_params(m)


def test_paper_configuration():
    with torch.device("meta"):
        m = create_model("sa_quadratic")
    exact = {
        "sa_quadratic": 12_086_844,
        "sa_quadratic_generalized": 12_087_006,
        "sa_learned": 12_278_682,
        "sa_learned_content": 29_484_282,
        "sa_learned_content_runs": 29_601_882,  # the paper-run commit's content layer
    }
    for name, n in exact.items():
        with torch.device("meta"):
            assert num_params(create_model(name)) == n
    assert m.attention_grid == (16, 16) and m.num_prefix_tokens == 0
    assert m.embed.in_features == 12 and m.embed.out_features == 400
    assert len(m.layers) == 6
    layer = m.layers[0]
    assert layer.attn.num_heads == 9 and layer.attn.value == "identity"
    assert tuple(layer.attn.out_proj.weight.shape) == (400, 9 * 400)  # Wval Wout
    assert layer.fc1.out_features == 512 and layer.drop.p == 0.1 and layer.attn.dropout == 0.1
    assert m.head.in_features == 400 and m.head.out_features == 10


@pytest.mark.parametrize("name", SA_MODELS)
def test_real_cifar_forward_backward_and_attention_maps(cifar_zip, name):
    torch.manual_seed(0)
    x, y = (t.clone() for t in cifar_batch(cifar_zip, split="train"))
    m = create_model(name, **SMALL).train()
    logits, attns = m(x, return_attention=True)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    assert logits.shape == (8, 10) and torch.isfinite(loss)
    for p in m.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    assert m.embed.weight.grad.abs().sum() > 0
    assert len(attns) == 2
    batch = 8 if name.startswith("sa_learned_content") else 1  # position-only maps are shared
    for a in attns:
        assert a.shape == (batch, 3, 256, 256) and a.grid == (16, 16)
        assert a.num_prefix_tokens == 0
        torch.testing.assert_close(a.probs.sum(-1), torch.ones(batch, 3, 256))
    feats = m.eval().forward_features(x)
    assert feats.shape == (8, 24, 16, 16)
    torch.testing.assert_close(m.forward_head(feats), m(x))


@pytest.mark.parametrize("name", SA_MODELS)
def test_fast_equals_reference_through_the_model(name):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 16, 12)  # non-square: 8x6 grid
    fast = create_model(name, img_size=16, **SMALL).eval()
    ref = create_model(name, img_size=16, backend="reference", **SMALL).eval()
    ref.load_state_dict(fast.state_dict())
    outs = []
    for m in (fast, ref):
        x_ = x.clone().requires_grad_(True)
        f = m.forward_features(x_)
        (f * torch.linspace(-1, 1, f.numel()).view_as(f)).sum().backward()
        outs.append((f.detach(), x_.grad, [p.grad for p in m.parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-5)
    for a, b in zip(outs[0][2], outs[1][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_quadratic_centres_and_overrides():
    torch.manual_seed(2)
    m = create_model("sa_quadratic", downsample=4, **SMALL)
    assert m.attention_grid == (8, 8)
    centres = m.attention_centers()
    assert centres.shape == (2, 3, 2)
    # the quadratic model has no table: it runs on other image sizes
    _, attns = m(torch.randn(1, 3, 48, 40), return_attention=True)
    assert attns[0].shape == (1, 3, 120, 120) and attns[0].grid == (12, 10)
    m1 = create_model("sa_learned", downsample=1, img_size=8, **SMALL)
    assert m1(torch.randn(2, 3, 8, 8)).shape == (2, 10)
    with pytest.raises(ValueError, match="quadratic"):
        m1.attention_centers()


def test_bad_input():
    m = create_model("sa_learned", **SMALL)
    with pytest.raises(ValueError, match="expects images up to 32x32"):
        m(torch.randn(1, 3, 40, 32))
    with pytest.raises(ValueError, match="not a multiple of the space-to-depth factor 2"):
        m(torch.randn(1, 3, 31, 32))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        m(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match="unknown option.*width.*known: .*hidden_size"):
        create_model("sa_quadratic", width=3)
    with pytest.raises(ValueError, match="positional must be one of"):
        create_model("sa_quadratic", positional="gaussian", **SMALL)
    with pytest.raises(ValueError, match="not a multiple of downsample 3"):
        create_model("sa_quadratic", downsample=3, **SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("name", SA_MODELS)
def test_memorizes_real_cifar_images(cifar_zip, name):
    """End to end, the gradients are right: 16 real images (4x4 space-to-depth, CPU scale)
    are fitted by a few Adam steps."""
    torch.manual_seed(0)
    x, y = cifar_batch(cifar_zip, 16, split="train")
    m = create_model(name, downsample=4, dropout=0.0, attn_dropout=0.0, **SMALL)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        loss = F.cross_entropy(m(x), y)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    acc = (m.eval()(x).argmax(1) == y).float().mean().item()
    assert loss.item() < first / 3 and acc >= 0.9, (first, loss.item(), acc)


@pytest.mark.parametrize("name", SA_MODELS)
def test_gradcheck_float64_through_the_model(name):
    torch.manual_seed(3)
    tiny = dict(hidden_size=6, num_layers=1, num_heads=2, ff_size=4, dropout=0.0)
    m = create_model(name, img_size=8, downsample=2, attn_dropout=0.0, **tiny).double().eval()
    x = torch.randn(2, 3, 8, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m.forward_features(x), (x,))


def test_head_keys_option():
    """sa_learned_content_runs is sa_learned_content with head_keys=True; the option belongs to
    the learned relative encoding and position-only tables are always read by head keys."""
    runs = create_model("sa_learned_content", head_keys=True, **SMALL)
    assert runs.layers[0].attn.positional_encoding.tables.rel_row.shape == (31, 24)
    assert create_model("sa_learned_content_runs", **SMALL).cfg.head_keys is True
    with pytest.raises(ValueError, match="head_keys=False needs content=True"):
        create_model("sa_learned", head_keys=False, **SMALL)
    with pytest.raises(ValueError, match="head_keys only applies"):
        create_model("sa_quadratic", head_keys=True, **SMALL)
