"""Pretrained ViT / DeiT weights of timm and Hugging Face: ``create_model(name, checkpoint=PATH)``.

Hugging Face: small random ``transformers`` models saved with ``save_pretrained`` are loaded into
ours; logits and attention maps must equal the library's own (float32, 1e-4), at the
checkpoint's size and at another one (position embeddings resampled as the library does).
timm (not installable here: it needs torchvision): random state dicts in timm's key layout,
checked against timm's forward pass written from the raw tensors in float64
(``pretrained_vits.py``). Then one test per bad input.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from attnconv import create_model
from attnconv.loading import WeightsError
from attnconv.loading.timm_format import to_timm
from attnconv.models._common import num_params
from pretrained_vits import (
    DEPTH,
    HEADS,
    SMALL,
    D,
    hf_config,
    hf_run,
    hf_save,
    images,
    load,
    randomize,
    timm_reference,
    timm_resample,
    timm_state,
)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("size", [32, 48, 24])
def test_hf_vit_logits_and_attention_equal_transformers(tmp_path, size):
    src = hf_save(
        transformers.ViTForImageClassification(hf_config("ViTConfig", num_labels=7)), tmp_path
    )
    ours = load("vit_tiny_patch16_224", tmp_path)
    assert ours.cfg.norm_eps == 1e-12 and ours.blocks[0].norm1.eps == 1e-12  # from config.json
    assert ours.cfg.img_size == 32 and ours.cfg.num_classes == 7
    x = images(3, size)
    ref = hf_run(src, x)
    with torch.no_grad():
        logits, maps = ours(x, return_attention=True)
    assert ref.logits.abs().max() > 0.1  # a real signal, not all zeros
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
    assert len(maps) == len(ref.attentions) == DEPTH
    for a, b in zip(maps, ref.attentions):
        a = getattr(a, "probs", a)  # (B, nh, T, T)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    if size != 32:  # img_size= override: resampled once at load, same numbers as on the fly
        fixed = load("vit_tiny_patch16_224", tmp_path, img_size=size)
        with torch.no_grad():
            torch.testing.assert_close(fixed(x), ref.logits, atol=1e-4, rtol=0)


def test_hf_attention_is_softmax_qk_from_the_source_weights(tmp_path):
    src = transformers.ViTModel(hf_config("ViTConfig"), add_pooling_layer=False)
    hf_save(src, tmp_path)
    ours = load("vit_base_patch16_224", tmp_path, num_classes=3)
    x = images(2, 32)
    sd = load_file(tmp_path / "model.safetensors")  # the source weights, in the file's names
    with torch.no_grad():
        h = src.embeddings(x)  # (B, T, D)
        pre = "encoder.layer.0."
        h = F.layer_norm(
            h,
            (D,),
            sd[pre + "layernorm_before.weight"],
            sd[pre + "layernorm_before.bias"],
            eps=1e-12,
        )
        q, k = (
            F.linear(
                h,
                sd[f"{pre}attention.attention.{n}.weight"],
                sd[f"{pre}attention.attention.{n}.bias"],
            )
            .view(2, -1, HEADS, D // HEADS)
            .transpose(1, 2)
            for n in ("query", "key")
        )  # (B, nh, T, hs)
        expect = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // HEADS), dim=-1)
        _, maps = ours(x, return_attention=True)
        feats = ours.forward_features(x)
        last = src(x).last_hidden_state
    torch.testing.assert_close(getattr(maps[0], "probs", maps[0]), expect, atol=1e-5, rtol=0)
    torch.testing.assert_close(feats, last, atol=1e-4, rtol=0)


@pytest.mark.parametrize("size", [32, 48])
def test_hf_deit_with_teacher_averages_both_heads(tmp_path, size):
    src = hf_save(
        transformers.DeiTForImageClassificationWithTeacher(hf_config("DeiTConfig", num_labels=5)),
        tmp_path,
    )
    ours = load("deit_tiny_distilled_patch16_224", tmp_path)
    assert ours.num_prefix_tokens == 2 and ours.head_dist is not None
    x = images(2, size)
    ref = hf_run(src, x)
    with torch.no_grad():
        logits, maps = ours(x, return_attention=True)
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
    for a, b in zip(maps, ref.attentions):
        torch.testing.assert_close(getattr(a, "probs", a), b, atol=1e-5, rtol=0)


def test_hf_deit_without_teacher_uses_the_class_head_only(tmp_path):
    src = hf_save(
        transformers.DeiTForImageClassification(hf_config("DeiTConfig", num_labels=4)), tmp_path
    )
    ours = load("deit_small_distilled_patch16_224", tmp_path)
    assert ours.head_dist is None and ours.num_prefix_tokens == 2
    x = images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), src(x).logits, atol=1e-4, rtol=0)


def test_hf_pytorch_model_bin_and_headless_model(tmp_path):
    src = transformers.ViTModel(hf_config("ViTConfig"))  # with the (unused) pooler
    hf_save(src, tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(sd, tmp_path / "pytorch_model.bin")  # the older transformers file name
    with pytest.warns(UserWarning, match="no classifier.*|pooler"):
        ours = create_model("vit_tiny_patch16_224", checkpoint=tmp_path, num_classes=6, **SMALL)
    x = images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            ours.forward_features(x), src.eval()(x).last_hidden_state, atol=1e-4, rtol=0
        )
    assert ours(x).shape == (2, 6)
    from attnconv.analysis.inputs import pretrained_normalization

    assert pretrained_normalization(tmp_path) == ([0.5] * 3, [0.5] * 3)  # ViTImageProcessor's
    (tmp_path / "preprocessor_config.json").write_text(
        '{"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}'
    )
    assert pretrained_normalization(tmp_path) == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


# ---- timm ----------------------------------------------------------------------------------


TIMM_CASES = [
    ("vit_small_patch16_224", dict()),
    ("deit_base_distilled_patch16_224", dict(distilled=True)),
    ("vit_large_patch16_224", dict(pool="avg")),
]


@pytest.mark.parametrize("name,kind", TIMM_CASES, ids=["vit", "deit_distilled", "avg_pool"])
@pytest.mark.parametrize("size", [32, 48, 24])
def test_timm_state_dict_matches_a_reference_forward(tmp_path, name, kind, size):
    sd = timm_state(**kind)
    path = tmp_path / "weights.bin"  # safetensors inside: the extension is never trusted
    save_file(sd, str(path))
    ours = load(name, path)
    assert ours.cfg.img_size == 32 and ours.cfg.pos_embed_antialias
    assert ours.cfg.norm_eps == 1e-6 and ours.cfg.global_pool == kind.get("pool", "token")
    x = images(2, size)
    expect, expect_attn = timm_reference(sd, x)
    with torch.no_grad():
        logits, maps = ours(x, return_attention=True)
    assert expect.abs().max() > 0.1
    torch.testing.assert_close(logits.double(), expect, atol=1e-4, rtol=0)
    for a, b in zip(maps, expect_attn):
        torch.testing.assert_close(getattr(a, "probs", a).double(), b, atol=1e-5, rtol=0)
    # round trip: our state dict back in timm's names is the file's
    back = to_timm(ours.state_dict())
    assert set(back) == set(sd)
    for k in sd:
        torch.testing.assert_close(back[k], sd[k], atol=0, rtol=0)


def test_no_qkv_bias_in_either_format(tmp_path):
    """qkv_bias=False (timm: no attn.qkv.bias; Hugging Face: config.qkv_bias false)."""
    sd = {k: v for k, v in timm_state().items() if not k.endswith("attn.qkv.bias")}
    save_file(sd, str(tmp_path / "w.safetensors"))
    ours = load("vit_tiny_patch16_224", tmp_path / "w.safetensors")
    x = images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).double(), timm_reference(sd, x)[0], atol=1e-4, rtol=0)
    src = hf_save(
        transformers.ViTForImageClassification(hf_config("ViTConfig", qkv_bias=False)),
        tmp_path / "hf",
    )
    ours = load("vit_tiny_patch16_224", tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(ours(x), src(x).logits, atol=1e-4, rtol=0)


def test_timm_hub_folder_is_read_as_timm_with_its_normalization(tmp_path):
    """A timm hub folder: config.json (timm's pretrained_cfg) + model.safetensors in timm's
    names; told from a Hugging Face folder by the keys."""
    import json

    from attnconv.analysis.inputs import pretrained_normalization

    sd = timm_state()
    save_file(sd, str(tmp_path / "model.safetensors"))
    cfg = {
        "architecture": "vit_small_patch16_224",
        "num_classes": 5,
        "pretrained_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = load("vit_small_patch16_224", tmp_path)
    assert ours.cfg.norm_eps == 1e-6 and ours.cfg.pos_embed_antialias
    x = images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).double(), timm_reference(sd, x)[0], atol=1e-4, rtol=0)
    assert pretrained_normalization(tmp_path) == ([0.5] * 3, [0.5] * 3)
    assert pretrained_normalization(tmp_path / "model.safetensors")[0] == [0.485, 0.456, 0.406]


def test_timm_img_size_override_resamples_like_timm_not_like_hf(tmp_path):
    sd = timm_state(grid=4)
    path = tmp_path / "w.safetensors"
    torch.save(sd, path)  # a torch zip under a safetensors name: read by content
    ours = load("deit_tiny_patch16_224", path, img_size=56)  # 4x4 -> 7x7 grid at load
    expect = timm_resample(sd["pos_embed"], (7, 7), 1)
    torch.testing.assert_close(ours.pos_embed.detach(), expect, atol=1e-6, rtol=0)
    plain = (
        F.interpolate(
            sd["pos_embed"][:, 1:].reshape(1, 4, 4, D).permute(0, 3, 1, 2),
            size=(7, 7),
            mode="bicubic",
            align_corners=False,
        )
        .permute(0, 2, 3, 1)
        .reshape(1, -1, D)
    )
    assert (plain - expect[:, 1:]).abs().max() > 1e-2  # the two kernels really differ
    x = images(2, 56)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).double(), timm_reference(sd, x)[0], atol=1e-4, rtol=0)


def test_timm_num_classes_change_drops_the_head_with_a_message(tmp_path):
    sd = timm_state(classes=5)
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.warns(UserWarning, match="5-class head dropped for a new 3-class one"):
        ours = create_model(
            "vit_tiny_patch16_224", checkpoint=tmp_path / "w.safetensors", num_classes=3, **SMALL
        )
    x = images(2, 32)
    assert ours(x).shape == (2, 3)
    ref = load("vit_tiny_patch16_224", tmp_path / "w.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x))


def test_real_geometry_at_224_equals_transformers(tmp_path):
    """ViT-Ti/16's geometry at 224 (12 blocks, 197 tokens), one image, from a Hugging Face
    folder: the registry name alone fits, no overrides."""
    cfg = transformers.ViTConfig(
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=10,
    )
    cfg._attn_implementation = "eager"
    src = transformers.ViTForImageClassification(cfg)
    randomize(src, std=0.05)
    src.eval().save_pretrained(tmp_path)
    ours = create_model("vit_tiny_patch16_224", checkpoint=tmp_path)
    x = images(1, 224)
    with torch.no_grad():
        ref = src(x, output_attentions=True)
        logits, maps = ours(x, return_attention=True)
    assert ref.logits.abs().max() > 0.1
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(
        getattr(maps[-1], "probs", maps[-1]), ref.attentions[-1], atol=1e-5, rtol=0
    )


def test_bf16_autocast_stays_close_to_the_float64_reference(tmp_path):
    """Under bf16 autocast the loaded model's logits stay within bf16's error of the float64
    reference (the fp32 run is within 1e-4, the test above)."""
    sd = timm_state(distilled=True)
    save_file(sd, str(tmp_path / "w.safetensors"))
    ours = load("deit_tiny_distilled_patch16_224", tmp_path / "w.safetensors")
    x = images(4, 32)
    expect = timm_reference(sd, x)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(x).double()
    scale = expect.abs().max()
    assert (got - expect).abs().max() < 0.03 * scale


def test_attnconv_checkpoints_load_through_the_same_argument(tmp_path):
    """``checkpoint=`` also takes an attnconv checkpoint folder (its own loader, name checked),
    e.g. a model saved after loading pretrained weights, rebuilt from its stored settings."""
    from attnconv.loading import model_kwargs
    from attnconv.train.checkpoint import CheckpointError, save_checkpoint

    save_file(timm_state(), str(tmp_path / "w.safetensors"))
    pretrained = load("vit_tiny_patch16_224", tmp_path / "w.safetensors")
    save_checkpoint(tmp_path / "ck", pretrained, "vit_tiny_patch16_224", model_kwargs(pretrained))
    again = create_model("vit_tiny_patch16_224", checkpoint=tmp_path / "ck")
    x = images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(again(x), pretrained(x), atol=0, rtol=0)
    with pytest.raises(CheckpointError, match="holds 'vit_tiny_patch16_224', not 'deit_tiny"):
        create_model("deit_tiny_patch16_224", checkpoint=tmp_path / "ck")


def test_registry_geometries_match_timm_parameter_counts():
    """timm's counts at 1000 classes (its model cards); built on the meta device, no forward."""
    counts = {
        "vit_tiny_patch16_224": 5_717_416,
        "vit_small_patch16_224": 22_050_664,
        "vit_base_patch16_224": 86_567_656,
        "vit_large_patch16_224": 304_326_632,
        "deit_tiny_patch16_224": 5_717_416,
        "deit_base_patch16_224": 86_567_656,
        "deit_tiny_distilled_patch16_224": 5_910_800,
        "deit_small_distilled_patch16_224": 22_436_432,
        "deit_base_distilled_patch16_224": 87_338_192,
    }
    with torch.device("meta"):
        for name, n in counts.items():
            m = create_model(name)
            assert num_params(m) == n, name
            assert m.cfg.img_size == 224 and m.cfg.patch_size == 16 and m.grid == (14, 14)


# ---- bad input: one clear line each ----------------------------------------------------------


def _error(name, path, match, **kw):
    with pytest.raises(WeightsError, match=match) as e:
        load(name, path, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_wrong_architecture_is_refused(tmp_path):
    resnet = {"conv1.weight": torch.zeros(8, 3, 7, 7), "fc.weight": torch.zeros(10, 8)}
    save_file(resnet, str(tmp_path / "resnet.safetensors"))
    _error("vit_tiny_patch16_224", tmp_path / "resnet.safetensors", "wrong architecture")
    save_file(timm_state(), str(tmp_path / "vit.safetensors"))
    with pytest.raises(WeightsError, match="wrong architecture.*ResNet"):
        create_model("resnet18_cifar", checkpoint=tmp_path / "vit.safetensors")
    _error("deit_tiny_distilled_patch16_224", tmp_path / "vit.safetensors", "distillation")
    swin = tmp_path / "swin"
    swin.mkdir()
    (swin / "config.json").write_text('{"model_type": "swin", "architectures": ["SwinModel"]}')
    save_file(resnet, str(swin / "model.safetensors"))
    _error("vit_tiny_patch16_224", swin, "wrong architecture.*'swin'")


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_truncated_file_is_refused(tmp_path, fmt):
    path = tmp_path / "w"
    sd = timm_state()
    save_file(sd, str(path)) if fmt == "safetensors" else torch.save(sd, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _error("vit_tiny_patch16_224", path, "truncated or corrupt")


class _Payload:  # unpickling it would run code: create the file named in MARK
    def __reduce__(self):
        return (open, (_Payload.MARK, "w"))


def test_pickle_only_files_are_refused(tmp_path):
    _Payload.MARK = str(tmp_path / "payload-ran")
    torch.save({"model": timm_state(), "extra": _Payload()}, tmp_path / "objects.pth")
    _error("vit_tiny_patch16_224", tmp_path / "objects.pth", "unpickling")
    with open(tmp_path / "raw.pkl", "wb") as f:
        pickle.dump({"model": timm_state(), "extra": _Payload()}, f)
    _error("vit_tiny_patch16_224", tmp_path / "raw.pkl", "pickle")
    torch.save({"model": _Payload()}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    _error("vit_tiny_patch16_224", tmp_path / "legacy.pth", "unpickling")
    assert not (tmp_path / "payload-ran").exists()  # the payload never ran
    # tensors only in torch's legacy (pre-zip) format: read weights-only, like a torch zip
    torch.save({"model": timm_state()}, tmp_path / "ok.pth", _use_new_zipfile_serialization=False)
    assert load("vit_tiny_patch16_224", tmp_path / "ok.pth").cfg.num_classes == 5


def test_mismatched_width_and_keys_are_listed(tmp_path):
    save_file(timm_state(), str(tmp_path / "w.safetensors"))
    msg = _error("vit_tiny_patch16_224", tmp_path / "w.safetensors", "mis-shaped", embed_dim=64)
    assert "patch_embed.weight (32, 3, 8, 8) vs (64, 3, 8, 8)" in msg or "(32" in msg
    _error("vit_tiny_patch16_224", tmp_path / "w.safetensors", "missing blocks.2", depth=3)
    sd = timm_state()
    sd["blocks.5.mlp.fc1.weight"] = torch.zeros(4 * D, D)
    save_file(sd, str(tmp_path / "extra.safetensors"))
    _error("vit_tiny_patch16_224", tmp_path / "extra.safetensors", "unexpected blocks.5")
    _error("vit_tiny_patch16_224", tmp_path / "w.safetensors", "patch size change", patch_size=16)
    hf = tmp_path / "hf"
    hf_save(transformers.ViTForImageClassification(hf_config("ViTConfig")), hf)
    _error("vit_tiny_patch16_224", hf, "mis-shaped", embed_dim=64)
    _error("vit_tiny_patch16_224", hf, "4 heads", num_heads=2)
