"""What ``attnconv analyze`` / ``attnconv explore`` read: a checkpoint's model and test images."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
import torch.nn as nn

from attnconv.data import CIFAR10_MEAN, CIFAR10_STD, load_dataset
from attnconv.data.datasets import stored_or_sample
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mha import MultiHeadAttention
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d

ATTENTION = (MultiHeadSelfAttention2d, LocalSelfAttention2d, AttentionStem2d, MultiHeadAttention)


def load_checkpoint_model(path: str | Path) -> tuple[nn.Module, dict]:
    """(model in eval mode, checkpoint metadata) via the safetensors checkpoint loader."""
    from attnconv.loading import load_model
    from attnconv.loading.weights_check import as_float32

    model, info = load_model(path)  # non-finite weights refused there
    model, note = as_float32(model, info.get("path", str(path)))  # float32 images are fed
    if note:
        logging.getLogger(__name__).warning(note)
    return model.eval(), info


def analyzable(model: nn.Module, info: dict, path, image_size) -> nn.Module:
    """A model with attention maps as it is; a converted CNN through the view of its converted
    layers (analysis/converted.py); anything else: ValueError."""
    from .converted import ConvertedAttentionView

    if info.get("converted"):
        return ConvertedAttentionView(model, tuple(image_size)).eval()
    if hasattr(model, "attention_grid") and any(isinstance(m, ATTENTION) for m in model.modules()):
        return model  # (a CNN of the registry has a grid too: its feature map, no attention)
    raise ValueError(
        f"{path}: model {info.get('model')!r} has no attention maps (a CNN: convert it first, "
        "`attnconv convert CHECKPOINT --out DIR`, and analyze DIR)"
    )


def normalization(info: dict) -> tuple[list[float], list[float]]:
    """The mean/std the checkpoint was trained with (CIFAR-10's if it does not say)."""
    d = info.get("data") or {}
    cfg = (info.get("config") or {}).get("data") or {}
    mean = d.get("mean") or cfg.get("mean") or list(CIFAR10_MEAN)
    std = d.get("std") or cfg.get("std") or list(CIFAR10_STD)
    return [float(v) for v in mean], [float(v) for v in std]


def data_spec(data: str | None, info: dict) -> str:
    """``--data`` or, if not given, the dataset the checkpoint was trained on (a converted
    model's: the data ``attnconv convert`` checked it on)."""
    if data:
        return data
    spec = ((info.get("config") or {}).get("data") or {}).get("dataset")
    spec = spec or (info.get("data") or {}).get("dataset")
    if not spec:
        raise ValueError("no --data given and the checkpoint does not name its dataset")
    spec, note = stored_or_sample(str(spec))
    if note:
        logging.getLogger(__name__).warning(note)
    return spec


def test_images(
    spec: str, n: int, *, split: str = "test", cache_dir: str | None = None
) -> tuple[torch.Tensor, list[str]]:
    """``n`` images (uint8 (n, 3, H, W)) of ``split``, classes interleaved (image 0 of every
    class first, then image 1, ...), and their class names."""
    if n < 1:
        raise ValueError(f"number of images must be >= 1, got {n}")
    first = load_dataset(spec, split, max_per_class=1, cache_dir=cache_dir)
    per_class = math.ceil(n / max(1, first.num_classes))
    ds = (
        first
        if per_class == 1
        else load_dataset(spec, split, max_per_class=per_class, cache_dir=cache_dir)
    )
    labels = ds.labels.tolist()
    seen: dict[int, int] = {}
    rank = []
    for y in labels:
        rank.append(seen.get(y, 0))
        seen[y] = rank[-1] + 1
    order = sorted(range(len(labels)), key=lambda i: (rank[i], labels[i]))[:n]
    idx = torch.tensor(order, dtype=torch.long)
    return ds.images[idx], [ds.classes[labels[i]] for i in order]


def check_image_size(model: nn.Module, images: torch.Tensor, info: dict) -> None:
    """The images must have the size the model was trained on (the attention grid assumes it)."""
    size = (info.get("data") or {}).get("image_size")
    if size and list(images.shape[2:]) != list(size):
        raise ValueError(
            f"test images are {images.shape[2]}x{images.shape[3]}, the checkpoint was trained on "
            f"{size[0]}x{size[1]} images"
        )


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's default


def pretrained_normalization(path: str | Path) -> tuple[list[float], list[float]]:
    """The input mean/std of pretrained weights: a timm hub folder's ``config.json``
    (``pretrained_cfg``), a Hugging Face folder's ``preprocessor_config.json`` (its
    ViTImageProcessor default 0.5 / 0.5 without one); a bare timm state dict carries none:
    ImageNet's (timm's default; some timm ViTs use 0.5). An attnconv checkpoint (or run) names
    its own in its metadata (``normalization``)."""
    from attnconv.loading.checkpoint import CheckpointError, read_meta

    p = Path(path)
    try:  # an attnconv checkpoint: the mean/std it was trained with
        return normalization(read_meta(p)[1])
    except CheckpointError:
        pass  # not one: a timm or Hugging Face checkpoint
    if p.is_dir() and (p / "config.json").is_file():
        cfg = json.loads((p / "config.json").read_text())
        timm_cfg = cfg.get("pretrained_cfg") if isinstance(cfg, dict) else None
        if isinstance(timm_cfg, dict) and "mean" in timm_cfg and "std" in timm_cfg:
            mean, std = timm_cfg["mean"], timm_cfg["std"]
        else:
            f = p / "preprocessor_config.json"
            pre = json.loads(f.read_text()) if f.is_file() else {}
            mean, std = pre.get("image_mean", [0.5] * 3), pre.get("image_std", [0.5] * 3)
        return [float(v) for v in mean], [float(v) for v in std]
    return list(IMAGENET_MEAN), list(IMAGENET_STD)


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> uint8 (N, 3, size, size), bilinear (antialiased when shrinking):
    CIFAR or any folder's images at a pretrained model's input size."""
    if tuple(images.shape[-2:]) == (size, size):
        return images
    out = torch.empty(*images.shape[:2], size, size, dtype=torch.uint8)
    for i in range(0, images.shape[0], 64):  # chunks: no float copy of every image at once
        x = torch.nn.functional.interpolate(
            images[i : i + 64].float(),
            size=(size, size),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
        out[i : i + 64] = x.round().clamp(0, 255).to(torch.uint8)
    return out


def load_pretrained_for_analysis(
    model_name: str,
    checkpoint: str | Path,
    data: str | None,
    n: int,
    split: str = "test",
    device: str | None = None,
):
    """``load_for_analysis`` for ``create_model(model_name, checkpoint=...)`` weights (timm,
    Hugging Face or attnconv): test images (default: the embedded sample) resized to the
    model's input size, the weights' normalization."""
    from attnconv.device import resolve_device
    from attnconv.loading import create_model
    from attnconv.loading.weights_check import as_float32

    model, note = as_float32(create_model(model_name, checkpoint=checkpoint), str(checkpoint))
    if note:
        logging.getLogger(__name__).warning(note)
    model = model.eval().to(resolve_device(device))
    info = {"model": model_name, "path": str(checkpoint)}
    images, labels = test_images(data or "sample", n, split=split)
    size = getattr(getattr(model, "cfg", None), "img_size", None)
    if size:
        images = resize_images(images, int(size))
    model = analyzable(model, info, checkpoint, images.shape[-2:])
    mean, std = pretrained_normalization(checkpoint)
    return model, info, images, labels, mean, std


def load_for_analysis(
    checkpoint: str | Path,
    data: str | None,
    n: int,
    split: str = "test",
    device: str | None = None,
    model_name: str | None = None,
):
    """What both ``analyze`` and ``explore`` start from: (model in eval mode on ``device``
    (``resolve_device``: default CUDA if available), checkpoint metadata, ``n`` test images uint8
    (n, 3, H, W) on the CPU, their class names, mean, std). With ``model_name``: pretrained
    weights (``load_pretrained_for_analysis``). On a CPU it sets subnormal flushing as the
    run trained (``flush_as_trained``)."""
    from attnconv.device import flush_as_trained, resolve_device

    dev = resolve_device(device)
    if model_name:
        flush_as_trained({}, dev)  # pretrained weights: TrainConfig's default
        return load_pretrained_for_analysis(model_name, checkpoint, data, n, split, device)
    model, info = load_checkpoint_model(checkpoint)
    flush_as_trained(info, dev)  # subnormals as the run trained, as eval does
    model = model.to(dev)
    images, labels = test_images(data_spec(data, info), n, split=split)
    check_image_size(model, images, info)
    model = analyzable(model, info, checkpoint, images.shape[-2:])
    mean, std = normalization(info)
    return model, info, images, labels, mean, std
