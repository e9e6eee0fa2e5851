"""Edge cases of the model constructors and their loaders: option values the audit found
crashing, ignored or refused (MLP widths, qkv_bias, init_alpha, dtypes, None sizes, bad stored
options, meta-device forwards, img_size with an attnconv ViT, empty ResNet stages)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from attnconv import create_model
from attnconv.layers.mha import MultiHeadAttention
from attnconv.layers.precision import autocast_dtype, no_autocast
from attnconv.loading import load_model
from attnconv.loading.checkpoint import CheckpointError, meta_digest
from attnconv.loading.timm_format import to_timm
from attnconv.train.checkpoint import save_checkpoint

VIT = dict(embed_dim=32, depth=1, num_heads=2)
SA = dict(hidden_size=16, num_layers=1, num_heads=2, ff_size=16, img_size=16)


def _load(name, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_model(name, checkpoint=path, **kw)


# bug 2: the MLP width a loader stores as mlp_ratio = H / D must come back exactly


def test_mlp_ratio_of_a_loaded_width_gives_that_width_back():
    m = create_model("vit_tiny_cifar", embed_dim=88, depth=1, num_heads=2, mlp_ratio=120 / 88)
    assert m.blocks[0].mlp.fc1.out_features == 120  # int(88 * (120 / 88)) = 119
    m = create_model("vit_tiny_cifar", embed_dim=33, depth=1, num_heads=3, mlp_ratio=2.5)
    assert m.blocks[0].mlp.fc1.out_features == 82  # timm's int(): fractional products floor


def test_timm_state_dict_with_a_non_multiple_mlp_width_loads(tmp_path):
    torch.manual_seed(0)
    kw = dict(embed_dim=88, depth=1, num_heads=2)
    sd = to_timm(create_model("vit_tiny_cifar", **kw).state_dict())
    sd["blocks.0.mlp.fc1.weight"], sd["blocks.0.mlp.fc1.bias"] = (
        torch.randn(120, 88),
        torch.randn(120),
    )
    sd["blocks.0.mlp.fc2.weight"] = torch.randn(88, 120)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "w.safetensors"))
    m = _load("vit_tiny_cifar", tmp_path / "w.safetensors", **kw)
    assert torch.equal(m.blocks[0].mlp.fc1.weight, sd["blocks.0.mlp.fc1.weight"])
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)


# bug 8: sa_quadratic_generalized starts as the isotropic encoding of init_alpha would


def test_generalized_encoding_starts_at_init_alpha():
    torch.manual_seed(0)
    g = create_model("sa_quadratic_generalized", **SA, init_alpha=8.0)
    prec = g.layers[0].attn.positional_encoding.precision.detach()  # Sigma^-1 = 2 alpha I
    torch.testing.assert_close(prec, 16 * torch.eye(2).expand_as(prec), atol=1.0, rtol=0)
    torch.manual_seed(0)
    default = create_model("sa_quadratic_generalized", **SA)
    torch.manual_seed(0)
    half = create_model("sa_quadratic_generalized", **SA, init_alpha=0.5)
    a = default.layers[0].attn.positional_encoding.spread
    assert torch.equal(a, half.layers[0].attn.positional_encoding.spread)  # unchanged default
    torch.testing.assert_close(a.detach(), torch.eye(2).expand_as(a), atol=0.05, rtol=0)


# bug 1: qkv_bias=False drops the q, k, v biases only (timm); W^O keeps its bias


def test_vit_without_qkv_bias_builds_and_keeps_the_output_bias():
    m = create_model("vit_tiny_cifar", **VIT, qkv_bias=False)
    attn = m.blocks[0].attn
    assert attn.q_proj.bias is None and attn.k_proj.bias is None and attn.v_proj.bias is None
    assert attn.out_proj.bias is not None
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert MultiHeadAttention(32, 2, bias=False).out_proj.bias is None  # as before
    assert MultiHeadAttention(32, 2, bias=False, out_bias=True).out_proj.bias is not None


# bug 5: a checkpoint of a bfloat16 / float64 model comes back in its dtype, exactly


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_checkpoint_round_trip_keeps_the_dtype(tmp_path, dtype):
    m = create_model("sa_quadratic", **SA).to(dtype)
    save_checkpoint(tmp_path / "ck", m, "sa_quadratic", SA)
    back, _ = load_model(tmp_path / "ck")
    assert next(back.parameters()).dtype == dtype
    own = m.state_dict()
    for k, v in back.state_dict().items():
        assert v.dtype == own[k].dtype and torch.equal(v, own[k]), k


# bug 6: shape-only forwards on the meta device


@pytest.mark.parametrize(
    "name, kw",
    [
        ("sa_quadratic", dict(hidden_size=16, num_layers=2, num_heads=2, ff_size=16)),
        ("sa_learned_content", dict(hidden_size=16, num_layers=2, num_heads=2, ff_size=16)),
        (
            "sasa_resnet26_cifar",
            dict(widths=(8, 8, 8, 8), depths=(1, 1, 1, 1), num_heads=2, stem_heads=2),
        ),
    ],
)
def test_meta_device_forward_gives_the_output_shape(name, kw):
    with torch.device("meta"):
        m = create_model(name, **kw, kernel_size=3) if "sasa" in name else create_model(name, **kw)
    assert tuple(m(torch.empty(2, 3, 32, 32, device="meta")).shape) == (2, 10)
    assert autocast_dtype("meta", torch.float32) == torch.float32
    with no_autocast("meta"):
        pass


# bug 4: a size given as None is the default (or the checkpoint's)


@pytest.mark.parametrize(
    "name, kw",
    [
        ("vit_tiny_cifar", dict(VIT, num_classes=None)),
        ("vit_tiny_cifar", dict(VIT, img_size=None)),
        ("sa_quadratic", dict(SA, num_classes=None)),
        ("sa_quadratic", dict(SA, img_size=None)),
        ("resnet18_cifar", dict(widths=(8, 8, 8, 8), num_classes=None)),
    ],
)
def test_none_size_is_the_default(name, kw):
    m = create_model(name, **kw)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_none_overrides_are_the_checkpoints(tmp_path):
    sd = to_timm(create_model("vit_tiny_cifar", **VIT, num_classes=7, img_size=48).state_dict())
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "w.safetensors"))
    m = _load("vit_tiny_cifar", tmp_path / "w.safetensors", **VIT, num_classes=None, img_size=None)
    assert (m.cfg.num_classes, m.cfg.img_size) == (7, 48)
    kw = dict(VIT, num_classes=5)
    save_checkpoint(tmp_path / "ck", create_model("vit_tiny_cifar", **kw), "vit_tiny_cifar", kw)
    assert _load("vit_tiny_cifar", tmp_path / "ck", num_classes=None).cfg.num_classes == 5


# bug 3: a bad stored option is one CheckpointError naming it


def _craft(path, name, kw, patch):
    save_checkpoint(path, create_model(name, **kw), name, kw)
    meta = json.loads((path / "checkpoint.json").read_text())
    meta["model_kwargs"].update(patch)
    meta["meta_sha256"] = meta_digest(meta)  # as an edited or older-version file would
    (path / "checkpoint.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "name, kw, patch",
    [
        ("vit_tiny_cifar", VIT, {"mlp_ratio": -1.0}),
        ("vit_tiny_cifar", VIT, {"qkv_bias": "false"}),
        ("resnet18_cifar", dict(widths=[8, 8, 8, 8]), {"widths": [8, -1, 8, 8]}),
        ("sa_quadratic", SA, {"hidden_size": 2**62}),
        ("sa_quadratic", SA, {"layer_norm_eps": "a"}),
        ("sa_quadratic", SA, {"dropout": [0.1]}),
    ],
)
def test_bad_stored_option_is_one_checkpoint_error(tmp_path, name, kw, patch):
    _craft(tmp_path / "ck", name, kw, patch)
    (option,) = patch
    with pytest.raises(CheckpointError, match=option) as e:
        load_model(tmp_path / "ck")
    assert "\n" not in str(e.value) and name in str(e.value)


# bug 7: img_size= with an attnconv ViT checkpoint resamples the position embeddings


def test_attnconv_vit_checkpoint_with_another_img_size(tmp_path):
    torch.manual_seed(0)
    m = create_model("vit_tiny_cifar", **VIT).eval()
    save_checkpoint(tmp_path / "ck", m, "vit_tiny_cifar", VIT)
    big = _load("vit_tiny_cifar", tmp_path / "ck", img_size=48)
    assert big.grid == (12, 12) and big.cfg.img_size == 48
    ref = create_model("vit_tiny_cifar", **VIT, img_size=48).eval()
    ref.load_state_dict(m.state_dict())  # the model's own resampling
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(big(x), ref(x), atol=0, rtol=0)


# bug 9: a ResNet stage of 0 blocks is refused


@pytest.mark.parametrize(
    "name, kw",
    [
        ("resnet18_cifar", dict(widths=(8, 16, 16, 16), depths=(0, 2, 2, 2))),
        ("resnet26_cifar", dict(widths=(8, 8, 8, 8), depths=(1, 0, 1, 1))),
    ],
)
def test_resnet_stage_of_zero_blocks_is_refused(name, kw):
    with pytest.raises(ValueError, match="depths must be a list of ints >= 1"):
        create_model(name, **kw)


def test_deit_distilled_training_returns_the_two_heads_apart():
    """DeiT sec. 5 (timm's set_distilled_training): in train mode the class head's and the
    distillation head's logits come apart, each its own loss; in eval mode their mean."""
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, depth=1, num_classes=5, embed_dim=32, num_heads=2)
    m = create_model("deit_tiny_distilled_patch16_224", **kw).double()
    nn.init.normal_(m.head.weight)  # the heads start at zero: make them differ
    nn.init.normal_(m.head_dist.weight)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    m.train()
    mean = m(x)
    assert mean.shape == (2, 5)  # timm's default: averaged in training too
    m.set_distilled_training()
    cls, dist = m(x)
    feats = m.forward_features(x)
    torch.testing.assert_close(cls, m.head(feats[:, 0]), rtol=0, atol=0)
    torch.testing.assert_close(dist, m.head_dist(feats[:, 1]), rtol=0, atol=0)
    torch.testing.assert_close(mean, (cls + dist) / 2, rtol=0, atol=1e-15)
    assert not torch.allclose(cls, dist)
    m.eval()
    torch.testing.assert_close(m(x), (cls + dist) / 2, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="needs the distillation head"):
        create_model("deit_tiny_patch16_224", **kw).set_distilled_training()
