"""Pretrained ViT / DeiT weights of timm and Hugging Face: ``create_model(name, checkpoint=PATH)``.

Hugging Face: small random ``transformers`` models saved with ``save_pretrained`` are loaded into
ours; logits and attention maps must equal the library's own (float32, 1e-4), at the
checkpoint's size and at another one (position embeddings resampled as the library does).
timm (not installable here: it needs torchvision): random state dicts in timm's key layout
(``timm/models/vision_transformer.py``, ``deit.py``), checked against a forward pass written in
this file from the raw timm tensors in float64, with timm's ``resample_abs_pos_embed``
arithmetic (bicubic, antialias=True). Then one test per bad input.
"""

from __future__ import annotations

import math
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from attnconv.models import create_model
from attnconv.models._common import num_params
from attnconv.models.weights import WeightsError
from attnconv.models.weights.timm_format import to_timm

D, DEPTH, HEADS, P = 32, 2, 4, 8  # small geometry: fast tests
SMALL = dict(embed_dim=D, depth=DEPTH, num_heads=HEADS, patch_size=P)


def _randomize(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Random weights large enough that attention is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _images(n: int, size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _load(name: str, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_model(name, checkpoint=path, **{**SMALL, **kw})


# ---- Hugging Face --------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def _hf_config(cls_name: str, **kw):
    cfg = getattr(transformers, cls_name)(
        hidden_size=D, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
        intermediate_size=4 * D, image_size=32, patch_size=P, **kw,
    )  # fmt: skip
    cfg._attn_implementation = "eager"  # output_attentions needs the eager kernel
    return cfg


def _hf_save(model, path):
    _randomize(model)
    model.eval().save_pretrained(path)
    return model


def _hf_run(model, x, **kw):
    with torch.no_grad():
        out = model(x, output_attentions=True, interpolate_pos_encoding=x.shape[-1] != 32, **kw)
    return out


@pytest.mark.parametrize("size", [32, 48, 24])
def test_hf_vit_logits_and_attention_equal_transformers(tmp_path, size):
    src = _hf_save(
        transformers.ViTForImageClassification(_hf_config("ViTConfig", num_labels=7)), tmp_path
    )
    ours = _load("vit_tiny_patch16_224", tmp_path)
    assert ours.cfg.norm_eps == 1e-12 and ours.blocks[0].norm1.eps == 1e-12  # from config.json
    assert ours.cfg.img_size == 32 and ours.cfg.num_classes == 7
    x = _images(3, size)
    ref = _hf_run(src, x)
    with torch.no_grad():
        logits, maps = ours(x, return_attention=True)
    assert ref.logits.abs().max() > 0.1  # a real signal, not all zeros
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
    assert len(maps) == len(ref.attentions) == DEPTH
    for a, b in zip(maps, ref.attentions):
        a = getattr(a, "probs", a)  # (B, nh, T, T)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    if size != 32:  # img_size= override: resampled once at load, same numbers as on the fly
        fixed = _load("vit_tiny_patch16_224", tmp_path, img_size=size)
        with torch.no_grad():
            torch.testing.assert_close(fixed(x), ref.logits, atol=1e-4, rtol=0)


def test_hf_attention_is_softmax_qk_from_the_source_weights(tmp_path):
    src = transformers.ViTModel(_hf_config("ViTConfig"), add_pooling_layer=False)
    _hf_save(src, tmp_path)
    ours = _load("vit_base_patch16_224", tmp_path, num_classes=3)
    x = _images(2, 32)
    sd = load_file(tmp_path / "model.safetensors")  # the source weights, in the file's names
    with torch.no_grad():
        h = src.embeddings(x)  # (B, T, D)
        pre = "encoder.layer.0."
        h = F.layer_norm(h, (D,), sd[pre + "layernorm_before.weight"],
                         sd[pre + "layernorm_before.bias"], eps=1e-12)  # fmt: skip
        q, k = (
            F.linear(h, sd[f"{pre}attention.attention.{n}.weight"],
                     sd[f"{pre}attention.attention.{n}.bias"])  # fmt: skip
            .view(2, -1, HEADS, D // HEADS).transpose(1, 2)
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
    src = _hf_save(
        transformers.DeiTForImageClassificationWithTeacher(_hf_config("DeiTConfig", num_labels=5)),
        tmp_path,
    )
    ours = _load("deit_tiny_distilled_patch16_224", tmp_path)
    assert ours.num_prefix_tokens == 2 and ours.head_dist is not None
    x = _images(2, size)
    ref = _hf_run(src, x)
    with torch.no_grad():
        logits, maps = ours(x, return_attention=True)
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
    for a, b in zip(maps, ref.attentions):
        torch.testing.assert_close(getattr(a, "probs", a), b, atol=1e-5, rtol=0)


def test_hf_deit_without_teacher_uses_the_class_head_only(tmp_path):
    src = _hf_save(
        transformers.DeiTForImageClassification(_hf_config("DeiTConfig", num_labels=4)), tmp_path
    )
    ours = _load("deit_small_distilled_patch16_224", tmp_path)
    assert ours.head_dist is None and ours.num_prefix_tokens == 2
    x = _images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), src(x).logits, atol=1e-4, rtol=0)


def test_hf_pytorch_model_bin_and_headless_model(tmp_path):
    src = transformers.ViTModel(_hf_config("ViTConfig"))  # with the (unused) pooler
    _hf_save(src, tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(sd, tmp_path / "pytorch_model.bin")  # the older transformers file name
    with pytest.warns(UserWarning, match="no classifier.*|pooler"):
        ours = create_model("vit_tiny_patch16_224", checkpoint=tmp_path, num_classes=6, **SMALL)
    x = _images(2, 32)
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


def _timm_state(
    *, grid: int = 4, distilled: bool = False, pool: str = "token", classes: int = 5, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A random state dict with timm's ViT / DeiT key names and shapes."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    cls = pool == "token"
    prefix = int(cls) + int(distilled)
    sd = {"pos_embed": r(1, prefix + grid * grid, D, std=1.0)}
    if cls:
        sd["cls_token"] = r(1, 1, D)
    if distilled:
        sd["dist_token"] = r(1, 1, D)
    sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"] = r(D, 3, P, P, std=0.1), r(D)
    for i in range(DEPTH):
        b = f"blocks.{i}."
        for name, shape in (
            ("norm1", (D,)), ("attn.qkv", (3 * D, D)), ("attn.proj", (D, D)), ("norm2", (D,)),
            ("mlp.fc1", (4 * D, D)), ("mlp.fc2", (D, 4 * D)),
        ):  # fmt: skip
            sd[b + name + ".weight"] = 1 + r(*shape) if len(shape) == 1 else r(*shape)
            sd[b + name + ".bias"] = r(shape[0])
    norm = "norm" if cls else "fc_norm"
    sd[norm + ".weight"], sd[norm + ".bias"] = 1 + r(D), r(D)
    sd["head.weight"], sd["head.bias"] = r(classes, D), r(classes)
    if distilled:
        sd["head_dist.weight"], sd["head_dist.bias"] = r(classes, D), r(classes)
    return sd


def _timm_resample(posemb, new_size, num_prefix_tokens):
    """timm.layers.pos_embed.resample_abs_pos_embed (bicubic, antialias=True), as written there."""
    hw = int(math.sqrt(posemb.shape[1] - num_prefix_tokens))
    prefix, posemb = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim, dtype = posemb.shape[-1], posemb.dtype
    posemb = posemb.float().reshape(1, hw, hw, -1).permute(0, 3, 1, 2)
    posemb = F.interpolate(posemb, size=new_size, mode="bicubic", antialias=True)
    posemb = posemb.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)
    return torch.cat([prefix, posemb], dim=1)


def _timm_reference(sd, x, *, eps=1e-6):
    """timm's VisionTransformer(Distilled).forward in float64 from the raw tensors; returns
    (logits, [attention (B, nh, T, T) per block])."""
    sd = {k: v.double() for k, v in sd.items()}
    x = x.double()
    B = x.shape[0]
    t = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=P)
    grid = t.shape[-2:]
    t = t.flatten(2).transpose(1, 2)  # (B, N, D)
    prefix = [sd[k].expand(B, -1, -1) for k in ("cls_token", "dist_token") if k in sd]
    pe = sd["pos_embed"]
    if pe.shape[1] != len(prefix) + grid[0] * grid[1]:
        pe = _timm_resample(sd["pos_embed"].float(), tuple(grid), len(prefix)).double()
    t = torch.cat([*prefix, t], dim=1) + pe

    def ln(h, name):
        return F.layer_norm(h, (D,), sd[name + ".weight"], sd[name + ".bias"], eps=eps)

    attns = []
    for i in range(DEPTH):
        b = f"blocks.{i}."
        h = ln(t, b + "norm1")
        qkv = F.linear(h, sd[b + "attn.qkv.weight"], sd[b + "attn.qkv.bias"])
        q, k, v = qkv.reshape(B, -1, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D // HEADS), dim=-1)
        attns.append(a)
        o = (a @ v).transpose(1, 2).reshape(B, -1, D)
        t = t + F.linear(o, sd[b + "attn.proj.weight"], sd[b + "attn.proj.bias"])
        h = ln(t, b + "norm2")
        h = F.linear(F.gelu(F.linear(h, sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"])),
                     sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"])  # fmt: skip
        t = t + h
    if "fc_norm.weight" in sd:  # global_pool="avg": mean of the patch tokens, then fc_norm
        feat = ln(t[:, len(prefix) :].mean(1), "fc_norm")
        return F.linear(feat, sd["head.weight"], sd["head.bias"]), attns
    t = ln(t, "norm")
    logits = F.linear(t[:, 0], sd["head.weight"], sd["head.bias"])
    if "head_dist.weight" in sd:
        logits = (logits + F.linear(t[:, 1], sd["head_dist.weight"], sd["head_dist.bias"])) / 2
    return logits, attns


TIMM_CASES = [
    ("vit_small_patch16_224", dict()),
    ("deit_base_distilled_patch16_224", dict(distilled=True)),
    ("vit_large_patch16_224", dict(pool="avg")),
]


@pytest.mark.parametrize("name,kind", TIMM_CASES, ids=["vit", "deit_distilled", "avg_pool"])
@pytest.mark.parametrize("size", [32, 48, 24])
def test_timm_state_dict_matches_a_reference_forward(tmp_path, name, kind, size):
    sd = _timm_state(**kind)
    path = tmp_path / "weights.bin"  # safetensors inside: the extension is never trusted
    save_file(sd, str(path))
    ours = _load(name, path)
    assert ours.cfg.img_size == 32 and ours.cfg.pos_embed_antialias
    assert ours.cfg.norm_eps == 1e-6 and ours.cfg.global_pool == kind.get("pool", "token")
    x = _images(2, size)
    expect, expect_attn = _timm_reference(sd, x)
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


def test_timm_hub_folder_is_read_as_timm_with_its_normalization(tmp_path):
    """A timm hub folder: config.json (timm's pretrained_cfg) + model.safetensors in timm's
    names; told from a Hugging Face folder by the keys."""
    import json

    from attnconv.analysis.inputs import pretrained_normalization

    sd = _timm_state()
    save_file(sd, str(tmp_path / "model.safetensors"))
    cfg = {"architecture": "vit_small_patch16_224", "num_classes": 5,
           "pretrained_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = _load("vit_small_patch16_224", tmp_path)
    assert ours.cfg.norm_eps == 1e-6 and ours.cfg.pos_embed_antialias
    x = _images(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).double(), _timm_reference(sd, x)[0], atol=1e-4, rtol=0)
    assert pretrained_normalization(tmp_path) == ([0.5] * 3, [0.5] * 3)
    assert pretrained_normalization(tmp_path / "model.safetensors")[0] == [0.485, 0.456, 0.406]


def test_timm_img_size_override_resamples_like_timm_not_like_hf(tmp_path):
    sd = _timm_state(grid=4)
    path = tmp_path / "w.safetensors"
    torch.save(sd, path)  # a torch zip under a safetensors name: read by content
    ours = _load("deit_tiny_patch16_224", path, img_size=56)  # 4x4 -> 7x7 grid at load
    expect = _timm_resample(sd["pos_embed"], (7, 7), 1)
    torch.testing.assert_close(ours.pos_embed.detach(), expect, atol=1e-6, rtol=0)
    plain = F.interpolate(
        sd["pos_embed"][:, 1:].reshape(1, 4, 4, D).permute(0, 3, 1, 2), size=(7, 7),
        mode="bicubic", align_corners=False,
    ).permute(0, 2, 3, 1).reshape(1, -1, D)  # fmt: skip
    assert (plain - expect[:, 1:]).abs().max() > 1e-2  # the two kernels really differ
    x = _images(2, 56)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).double(), _timm_reference(sd, x)[0], atol=1e-4, rtol=0)


def test_timm_num_classes_change_drops_the_head_with_a_message(tmp_path):
    sd = _timm_state(classes=5)
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.warns(UserWarning, match="5-class head dropped for a new 3-class one"):
        ours = create_model(
            "vit_tiny_patch16_224", checkpoint=tmp_path / "w.safetensors", num_classes=3, **SMALL
        )
    x = _images(2, 32)
    assert ours(x).shape == (2, 3)
    ref = _load("vit_tiny_patch16_224", tmp_path / "w.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x))


def test_real_geometry_at_224_equals_transformers(tmp_path):
    """ViT-Ti/16's geometry at 224 (12 blocks, 197 tokens), one image, from a Hugging Face
    folder: the registry name alone fits, no overrides."""
    cfg = transformers.ViTConfig(
        hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768,
        num_labels=10,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    src = transformers.ViTForImageClassification(cfg)
    _randomize(src, std=0.05)
    src.eval().save_pretrained(tmp_path)
    ours = create_model("vit_tiny_patch16_224", checkpoint=tmp_path)
    x = _images(1, 224)
    with torch.no_grad():
        ref = src(x, output_attentions=True)
        logits, maps = ours(x, return_attention=True)
    assert ref.logits.abs().max() > 0.1
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(getattr(maps[-1], "probs", maps[-1]), ref.attentions[-1],
                               atol=1e-5, rtol=0)  # fmt: skip


def test_bf16_autocast_stays_close_to_the_float64_reference(tmp_path):
    """Under bf16 autocast the loaded model's logits stay within bf16's error of the float64
    reference (the fp32 run is within 1e-4, the test above)."""
    sd = _timm_state(distilled=True)
    save_file(sd, str(tmp_path / "w.safetensors"))
    ours = _load("deit_tiny_distilled_patch16_224", tmp_path / "w.safetensors")
    x = _images(4, 32)
    expect = _timm_reference(sd, x)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(x).double()
    scale = expect.abs().max()
    assert (got - expect).abs().max() < 0.03 * scale


def test_registry_geometries_match_timm_parameter_counts():
    """timm's counts at 1000 classes (its model cards); built on the meta device, no forward."""
    counts = {
        "vit_tiny_patch16_224": 5_717_416, "vit_small_patch16_224": 22_050_664,
        "vit_base_patch16_224": 86_567_656, "vit_large_patch16_224": 304_326_632,
        "deit_tiny_patch16_224": 5_717_416, "deit_base_patch16_224": 86_567_656,
        "deit_tiny_distilled_patch16_224": 5_910_800,
        "deit_small_distilled_patch16_224": 22_436_432,
        "deit_base_distilled_patch16_224": 87_338_192,
    }  # fmt: skip
    with torch.device("meta"):
        for name, n in counts.items():
            m = create_model(name)
            assert num_params(m) == n, name
            assert m.cfg.img_size == 224 and m.cfg.patch_size == 16 and m.grid == (14, 14)


# ---- bad input: one clear line each ----------------------------------------------------------


def _error(name, path, match, **kw):
    with pytest.raises(WeightsError, match=match) as e:
        _load(name, path, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_wrong_architecture_is_refused(tmp_path):
    resnet = {"conv1.weight": torch.zeros(8, 3, 7, 7), "fc.weight": torch.zeros(10, 8)}
    save_file(resnet, str(tmp_path / "resnet.safetensors"))
    _error("vit_tiny_patch16_224", tmp_path / "resnet.safetensors", "wrong architecture")
    save_file(_timm_state(), str(tmp_path / "vit.safetensors"))
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
    sd = _timm_state()
    save_file(sd, str(path)) if fmt == "safetensors" else torch.save(sd, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _error("vit_tiny_patch16_224", path, "truncated or corrupt")


class _Payload:  # unpickling it would run code: create the file named in MARK
    def __reduce__(self):
        return (open, (_Payload.MARK, "w"))


def test_pickle_only_files_are_refused(tmp_path):
    _Payload.MARK = str(tmp_path / "payload-ran")
    torch.save({"model": _timm_state(), "extra": _Payload()}, tmp_path / "objects.pth")
    _error("vit_tiny_patch16_224", tmp_path / "objects.pth", "unpickling")
    with open(tmp_path / "legacy.pkl", "wb") as f:
        pickle.dump({"model": _timm_state(), "extra": _Payload()}, f)
    _error("vit_tiny_patch16_224", tmp_path / "legacy.pkl", "pickle")
    assert not (tmp_path / "payload-ran").exists()  # the payload never ran


def test_mismatched_width_and_keys_are_listed(tmp_path):
    save_file(_timm_state(), str(tmp_path / "w.safetensors"))
    msg = _error("vit_tiny_patch16_224", tmp_path / "w.safetensors", "mis-shaped", embed_dim=64)
    assert "patch_embed.weight (32, 3, 8, 8) vs (64, 3, 8, 8)" in msg or "(32" in msg
    _error("vit_tiny_patch16_224", tmp_path / "w.safetensors", "missing blocks.2", depth=3)
    sd = _timm_state()
    sd["blocks.5.mlp.fc1.weight"] = torch.zeros(4 * D, D)
    save_file(sd, str(tmp_path / "extra.safetensors"))
    _error("vit_tiny_patch16_224", tmp_path / "extra.safetensors", "unexpected blocks.5")
    _error("vit_tiny_patch16_224", tmp_path / "w.safetensors", "patch size change", patch_size=16)
    hf = tmp_path / "hf"
    _hf_save(transformers.ViTForImageClassification(_hf_config("ViTConfig")), hf)
    _error("vit_tiny_patch16_224", hf, "mis-shaped", embed_dim=64)
    _error("vit_tiny_patch16_224", hf, "4 heads", num_heads=2)


# ---- analyze / explore on pretrained weights -------------------------------------------------


@pytest.fixture
def micro_name(monkeypatch):
    """A registry name of the micro geometry (the real ones need 224 px forwards: slow here)."""
    from attnconv.models import registry, vit

    def vit_micro_test(num_classes: int = 1000, **overrides):
        geometry = dict(SMALL, patch_size=16, img_size=64, dist_token=True)
        return vit._vit("vit_micro_test", geometry, num_classes, overrides)

    monkeypatch.setitem(registry._MODELS, "vit_micro_test", vit_micro_test)
    return "vit_micro_test"


def test_analyze_and_explore_take_pretrained_weights(tmp_path, micro_name):
    import json

    from attnconv.cli import main

    hf = tmp_path / "deit"
    cfg = _hf_config("DeiTConfig", num_labels=3)
    cfg.image_size, cfg.patch_size = 64, 16
    _hf_save(transformers.DeiTForImageClassificationWithTeacher(cfg), hf)
    out = tmp_path / "figs"
    argv = ["analyze", "--model", micro_name, "--checkpoint", str(hf), "--out", str(out),
            "--num-images", "4", "--batch-size", "3"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["image_size"] == [64, 64] and report["attention_grid"] == [4, 4]
    assert report["num_prefix_tokens"] == 2  # class + distillation token
    dist = report["mean_distance_px"]
    assert len(dist) == DEPTH and all(len(row) == HEADS for row in dist)
    for fig in ("mean_distance.png", "position_similarity.png", "patch_pcs.png"):
        assert (out / fig).stat().st_size > 1000, fig
    page = tmp_path / "page.html"
    argv = ["explore", "--model", micro_name, "--checkpoint", str(hf), "--out", str(page),
            "--images", "2", "--average", "3"]  # fmt: skip
    assert main(argv) == 0 and page.stat().st_size > 1000
    assert main(["analyze", "--checkpoint", str(hf), "--out", str(out)]) == 2  # no --model


def test_convert_takes_pretrained_weights_and_saves_them_whole(tmp_path, micro_name):
    """`attnconv convert NAME --checkpoint PATH --out DIR`: DIR reloads without PATH, with the
    checkpoint's settings (LayerNorm eps 1e-12 from the Hugging Face config)."""
    from attnconv.cli import main
    from attnconv.train.checkpoint import load_model

    hf = tmp_path / "deit"
    cfg = _hf_config("DeiTConfig", num_labels=3)
    cfg.image_size, cfg.patch_size = 64, 16
    src = _hf_save(transformers.DeiTForImageClassificationWithTeacher(cfg), hf)
    out = tmp_path / "converted"
    argv = ["convert", micro_name, "--checkpoint", str(hf), "--out", str(out), "--num-images", "4"]
    assert main(argv) == 0
    for f in hf.iterdir():
        f.unlink()  # the converted checkpoint must not need the source any more
    converted, info = load_model(out)
    assert info["model_kwargs"]["norm_eps"] == 1e-12
    x = _images(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), src(x).logits, atol=1e-4, rtol=0)
