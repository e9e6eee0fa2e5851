"""Issue 15, items 3 and 6: crafted checkpoints, archives and images end in one clear line.

checkpoint.json is checked for structure before use (no AttributeError / KeyError /
RecursionError), a config declaring a model larger than its weights is refused on the meta
device before allocating, corrupted resume state (momentum shape, RNG size) is named, image
sizes are checked from the header before decoding (decompression bombs, a huge first image, a
split too large for memory), zip members over the size limit are never read, a checkpoint whose
config names ``/`` as its dataset never walks the file system, and the decoded-image cache leaves
no temp file behind."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from attnconv.cli import main
from attnconv.data import datasets, folder, load_dataset
from attnconv.models import create_model
from attnconv.train import checkpoint as ck
from tiny_runs import tiny_config

KW = {"num_classes": 10, "width": 4}


@pytest.fixture
def ckpt(tmp_path) -> Path:
    torch.manual_seed(0)
    return ck.save_checkpoint(tmp_path / "ck", create_model("tiny_cnn", **KW), "tiny_cnn", KW)


def _edit_meta(path: Path, edit) -> None:
    meta = json.loads((path / ck.META).read_text())
    edit(meta)
    meta[ck.META_HASH] = ck.meta_digest(meta)  # re-signed: the checks behind it must refuse
    (path / ck.META).write_text(json.dumps(meta))


CRAFTED = [
    ("tensors", lambda m: m.update(tensors="x"), "tensors must be a mapping"),
    (
        "shape",
        lambda m: m["tensors"][ck.WEIGHTS]["conv1.weight"].__setitem__(1, "4x3"),
        "tensors.model.safetensors.conv1.weight shape must be a list of integers",
    ),
    (
        "dtype",
        lambda m: m["tensors"][ck.WEIGHTS].__setitem__("conv1.weight", 5),
        r"conv1.weight must be \[dtype, shape\]",
    ),
    (
        "files",
        lambda m: m["files"][ck.WEIGHTS].update(bytes="many"),
        "files.model.safetensors.bytes must be a size in bytes",
    ),
    ("model", lambda m: m.update(model=["tiny_cnn"]), "model must be a model name"),
    ("kwargs", lambda m: m.update(model_kwargs=[1, 2]), "model_kwargs must be a mapping"),
    (
        "kwargs-inf",
        lambda m: m["model_kwargs"].update(width=float("inf")),
        "'model_kwargs.width' must be a finite number",
    ),
    ("classes", lambda m: m.update(data={"classes": 10}), "data.classes must be a list"),
    (
        "dataset",
        lambda m: m.update(config={"data": {"dataset": 5}}),
        "config.data.dataset must be a dataset name or path",
    ),
    (
        "converted",
        lambda m: m.update(converted={"alpha": "big"}),
        "converted.alpha must be a positive number or null",
    ),
    (
        "seconds",
        lambda m: m.update(state={"step": 1, "seconds": "1 h"}),
        "state.seconds must be a number of seconds",
    ),
]


@pytest.mark.parametrize("name, edit, message", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_checkpoint_json_is_one_line(ckpt, capsys, name, edit, message):
    _edit_meta(ckpt, edit)
    with pytest.raises(ck.CheckpointError, match="corrupted checkpoint: .*" + message):
        ck.load_model(ckpt)
    assert main(["eval", str(ckpt), "--data", "sample"]) == 2
    *status, err = capsys.readouterr().err.strip().splitlines()  # the error: one line, last
    assert "corrupted checkpoint" in err and all(s.startswith("eval: ") for s in status), err


def test_deeply_nested_checkpoint_json(ckpt):
    meta = json.loads((ckpt / ck.META).read_text())
    text = json.dumps(meta)[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}"
    (ckpt / ck.META).write_text(text)
    with pytest.raises(ck.CheckpointError, match="metadata is not JSON .*nested too deeply"):
        ck.load_model(ckpt)


def test_huge_declared_model_is_refused_before_allocating(ckpt, capsys):
    """width 2**20: the real model would be terabytes; the meta-device probe refuses it."""
    _edit_meta(ckpt, lambda m: m["model_kwargs"].update(width=2**20))
    t0 = time.perf_counter()
    # refused by the construction budget (models/budget.py) before any weight is compared
    with pytest.raises(ck.CheckpointError, match="'tiny_cnn'.* declares more than .* GiB"):
        ck.load_model(ckpt)
    assert time.perf_counter() - t0 < 10


def test_huge_declared_converted_model_is_refused_before_allocating(ckpt):
    _edit_meta(ckpt, lambda m: m.update(converted={}, model_kwargs={**KW, "width": 2**20}))
    big = r"its config declares a \d+\.\d MiB model|declares more than .* GiB"
    with pytest.raises(ck.CheckpointError, match=big):
        ck.load_model(ckpt)


# ---- corrupted resume state ------------------------------------------------------------------
def _train_one_step(tmp_path: Path, cifar_zip: Path) -> tuple[str, Path]:
    cfg = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(tmp_path / "run"))
    assert main(["train", cfg, "--stop-at-step", "1"]) == 0
    return cfg, ck.follow_latest(tmp_path / "run" / "checkpoints")


def _rewrite_state(step: Path, edit) -> None:
    """Change state.safetensors and re-index it (a consistent file with wrong content)."""
    f = step / ck.STATE
    tensors = dict(st_load(f.read_bytes()))
    edit(tensors)
    data = st_save(tensors)
    f.write_bytes(data)

    def fix(m):
        import hashlib

        m["files"][ck.STATE] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        m["tensors"][ck.STATE] = ck.tensor_index(tensors)

    _edit_meta(step, fix)


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.update({"optim.0.momentum_buffer": torch.zeros(7, 7)}),
            r"optim.0.momentum_buffer has shape \(7, 7\), the parameter \(4, 3, 3, 3\)",
        ),
        (
            lambda t: t.update({"rng.torch": t["rng.torch"][:100]}),
            r"RNG state rng.torch is torch.uint8 \(100,\), expected torch.uint8 \(5056,\)",
        ),
        (lambda t: t.pop("rng.torch"), "RNG state rng.torch is none"),
        (
            lambda t: t.update({"optim.99.momentum_buffer": torch.zeros(1)}),
            "optim.99.momentum_buffer has shape .* no such parameter",
        ),
    ],
)
def test_corrupted_resume_state_is_one_line(tmp_path, cifar_zip, capsys, edit, message):
    cfg, step = _train_one_step(tmp_path, cifar_zip)
    _rewrite_state(step, edit)
    capsys.readouterr()
    assert main(["train", cfg, "--resume"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # status lines, then the error
    err = lines[-1]
    assert sum("error:" in ln for ln in lines) == 1 and "corrupted checkpoint" in err, lines
    assert re.search(message, err), err


# ---- images and archives ---------------------------------------------------------------------
def _png_header(w: int, h: int) -> bytes:
    """A PNG that declares w x h pixels in a few bytes (its pixel data is never decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _png(w: int = 8, h: int = 8) -> bytes:
    b = io.BytesIO()
    Image.new("RGB", (w, h)).save(b, "PNG")
    return b.getvalue()


@pytest.mark.parametrize(
    "size, message",
    [
        ((12000, 12000), "declares 12000x12000 pixels \\(at most 4096 a side\\)"),
        ((100000, 100000), "could be decompression bomb"),
    ],
)
def test_huge_first_image_is_refused_from_its_header(tmp_path, size, message):
    z = _zip(tmp_path / "d.zip", {"train/a/0.png": _png_header(*size), "train/a/1.png": _png()})
    with pytest.raises(ValueError, match=message):
        load_dataset(str(z), "train", use_cache=False)


def test_split_larger_than_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    z = _zip(tmp_path / "d.zip", {f"train/a/{i}.png": _png() for i in range(3)})
    monkeypatch.setattr(folder, "_memory", lambda: 1000)  # a machine of 1000 bytes
    with pytest.raises(ValueError, match=r"3 images of 8x8 need .* GiB decoded, more than half"):
        load_dataset(str(z), "train", use_cache=False)


def test_oversized_zip_member_is_never_read(tmp_path):
    z = _zip(tmp_path / "d.zip", {"train/a/0.png": _png()})
    data = bytearray(z.read_bytes())
    at = data.index(b"PK\x01\x02")  # central directory: the declared uncompressed size
    data[at + 24 : at + 28] = struct.pack("<I", 3 << 30)
    z.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"'train/a/0.png' is 3221225472 bytes, an image file"):
        load_dataset(str(z), "train", use_cache=False)


def test_checkpoint_naming_root_as_dataset_never_walks_it(ckpt, capsys, monkeypatch):
    _edit_meta(ckpt, lambda m: m.update(config={"data": {"dataset": "/"}}))
    walked = []
    monkeypatch.setattr(Path, "rglob", lambda self, *a: walked.append(self) or iter(()))
    t0 = time.perf_counter()
    assert main(["eval", str(ckpt)]) == 2
    *status, err = capsys.readouterr().err.strip().splitlines()  # the error: one line, last
    assert "/: no split 'test' (folders found:" in err, err
    assert all(s.startswith("eval: ") for s in status), status
    assert time.perf_counter() - t0 < 10 and not walked


def test_cache_temp_file_never_stays(tmp_path, monkeypatch):
    z = _zip(tmp_path / "d.zip", {"train/a/0.png": _png()})
    cache = tmp_path / "cache"
    (cache / "decoded").mkdir(parents=True)
    stale = cache / "decoded" / "old.npz.tmp"  # left by a writer killed two hours ago
    stale.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a PID that no longer runs
    killed = cache / "decoded" / f"{p.pid}-abc.npz.tmp"  # left by a writer killed just now
    killed.write_bytes(b"x")
    alive = cache / "decoded" / f"{os.getpid()}-abc.npz.tmp"  # a live writer's: kept
    alive.write_bytes(b"x")

    def full_disk(f, **arrays):
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.np, "savez", full_disk)
    ds = load_dataset(str(z), "train", cache_dir=cache)  # still loads (the cache is optional)
    assert len(ds) == 1
    assert list(cache.rglob("*.tmp")) == [alive], list(cache.rglob("*"))
