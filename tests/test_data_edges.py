"""Dataset folders and zips as users make them: a decoded cache that follows every change to a
folder's images, zips made by macOS Finder, members that cannot be read (encrypted, damaged)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from attnconv.data import SAMPLE_PATH, load_dataset

SRC = zipfile.ZipFile(SAMPLE_PATH)
JPEGS = sorted(n for n in SRC.namelist() if n.endswith(".jpg"))


def _pick(prefix: str, n: int, start: int = 0) -> list[str]:
    return [m for m in JPEGS if m.startswith(prefix)][start : start + n]


def _put(root: Path, name: str, member: str | None = None) -> Path:
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(SRC.read(member or name))
    return p


def test_folder_cache_follows_images_added_replaced_and_moved(tmp_path):
    """Adding, replacing or moving an image inside split/class/ changes neither the top folder's
    size nor its mtime: the cache used to return the first decode's images and labels."""
    root, cache = tmp_path / "ds", tmp_path / "cache"
    for c in ("cat", "dog"):
        for n in _pick(f"train/{c}/", 3) + _pick(f"test/{c}/", 1):
            _put(root, n)

    def load(**kw):
        return load_dataset(str(root), "train", **kw)

    assert load(cache_dir=cache).labels.tolist() == [0, 0, 0, 1, 1, 1]
    for n in _pick("train/cat/", 2, start=3):  # two more cats
        _put(root, n)
    assert load(cache_dir=cache).labels.tolist() == [0] * 5 + [1] * 3
    dog = sorted((root / "train/dog").iterdir())[0]  # a dog's picture replaced
    _put(root, str(dog.relative_to(root)), _pick("train/dog/", 1, start=10)[0])
    cached, fresh = load(cache_dir=cache), load(use_cache=False)
    assert (cached.images == fresh.images).all()
    cat = sorted((root / "train/cat").iterdir())[0]  # a mislabelled cat moved to dog/
    cat.rename(root / "train/dog" / f"moved-{cat.name}")
    assert load(cache_dir=cache).labels.tolist() == load(use_cache=False).labels.tolist()
    assert load(cache_dir=cache).labels.tolist() == [0] * 4 + [1] * 4


def test_zip_made_by_macos_finder_loads(tmp_path):
    """Finder adds __MACOSX/<top>/split/class/._file entries beside <top>/split/class/file."""
    pick = [n for pre in ("train/cat/", "train/dog/", "test/cat/") for n in _pick(pre, 3)]
    out = tmp_path / "cifar.zip"
    with zipfile.ZipFile(out, "w") as z:
        for n in pick:
            z.writestr("cifar/" + n, SRC.read(n))
            split, cls, f = n.split("/")
            z.writestr(f"__MACOSX/cifar/{split}/{cls}/._{f}", b"\x00\x05\x16\x07" + b"\x00" * 78)
    ds = load_dataset(str(out), "train", use_cache=False)
    assert ds.classes == ["cat", "dog"] and len(ds) == 6


def _zip_with_one_bad_member(tmp_path: Path, damage) -> tuple[Path, str]:
    names = _pick("train/cat/", 3) + _pick("test/cat/", 1)
    path = tmp_path / "data.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n in names:
            z.writestr(n, SRC.read(n))
    data = bytearray(path.read_bytes())
    info = zipfile.ZipFile(path).getinfo(names[1])
    damage(data, info)
    path.write_bytes(bytes(data))
    return path, names[1]


def _encrypt_flag(data: bytearray, info: zipfile.ZipInfo) -> None:
    """Set the member's 'encrypted' flag (bit 0) in its local and central headers."""
    data[info.header_offset + 6] |= 1
    central = data.rfind(b"PK\x01\x02" + data[info.header_offset + 4 : info.header_offset + 6])
    while data[central + 46 : central + 46 + len(info.filename)] != info.filename.encode():
        central = data.find(b"PK\x01\x02", central + 4)
    data[central + 8] |= 1


def _damage_deflate(data: bytearray, info: zipfile.ZipInfo) -> None:
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + 10 : start + 40] = b"\xff" * 30


@pytest.mark.parametrize("damage", [_encrypt_flag, _damage_deflate], ids=["encrypted", "damaged"])
def test_unreadable_zip_member_is_one_line_naming_it(tmp_path, damage):
    path, member = _zip_with_one_bad_member(tmp_path, damage)
    with pytest.raises(ValueError, match=f"cannot read '{member}'") as e:
        load_dataset(str(path), "train", use_cache=False)
    assert "\n" not in str(e.value)


def test_eval_reads_the_runs_own_eval_split(tmp_path, capsys):
    """A run evaluated on its 'val' split: `attnconv eval RUN` read 'test' by default, which
    that dataset does not have ("no split 'test'" unless --split was given)."""
    import json

    from attnconv.cli import main
    from attnconv.train.config import config_from_dict
    from attnconv.train.loop import Trainer

    root = tmp_path / "ds"
    for c in ("cat", "dog"):
        for n in _pick(f"train/{c}/", 4):
            _put(root, n)
        for n in _pick(f"test/{c}/", 2):
            _put(root, n.replace("test/", "val/"), n)
    d = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 8}},
        "data": {"dataset": str(root), "eval_split": "val", "cache_dir": str(tmp_path / "c")},
        "train": {"epochs": 1, "batch_size": 4, "threads": 1, "progress": False},
        "out_dir": str(tmp_path / "run"),
    }
    Trainer(config_from_dict(d)).fit()
    capsys.readouterr()
    assert main(["-q", "eval", str(tmp_path / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "val" and out["images"] == 4


def test_hidden_folders_beside_the_dataset_are_ignored(tmp_path):
    """A notebook's .ipynb_checkpoints beside the one top folder (or inside a class folder)
    hid the layout: "no split 'train'"."""
    root = tmp_path / "ds"
    for n in _pick("train/cat/", 2) + _pick("train/dog/", 2) + _pick("test/cat/", 1):
        _put(root / "cifar", n)
    (root / ".ipynb_checkpoints").mkdir()
    _put(root / "cifar" / "train" / "cat" / ".ipynb_checkpoints", "x.jpg", _pick("test/dog/", 1)[0])
    ds = load_dataset(str(root), "train", use_cache=False)
    assert ds.classes == ["cat", "dog"] and len(ds) == 4
