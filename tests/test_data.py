"""attnconv.data on the real CIFAR-10 JPEGs: readers, cache, official batch format, download,
augmentation (fast == reference), deterministic sharded loading, bad inputs."""

from __future__ import annotations

import hashlib
import http.server
import io
import pickle
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from attnconv.data import SAMPLE_PATH, Loader, augment, augment_reference, load_dataset
from attnconv.data.cifar import download, load_batch, read_cifar
from attnconv.data.datasets import ArrayDataset


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCONV_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def real_small(tmp_path_factory):
    """12 real images per class (train) and 4 (test) from the zip, decoded by the library."""
    from conftest import CIFAR_ZIP

    cache = tmp_path_factory.mktemp("cache")
    return (
        load_dataset(str(CIFAR_ZIP), "train", max_per_class=12, cache_dir=cache),
        load_dataset(str(CIFAR_ZIP), "test", max_per_class=4, cache_dir=cache),
    )


def _pil(zf: zipfile.ZipFile, name: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(zf.read(name))).convert("RGB")).transpose(2, 0, 1)


def test_zip_decodes_real_images(cifar_zip, tmp_path):
    ds = load_dataset(str(cifar_zip), "test", max_per_class=3, cache_dir=tmp_path)
    assert len(ds) == 30 and ds.images.dtype == torch.uint8 and ds.image_size == (32, 32)
    assert ds.classes[:3] == ["airplane", "automobile", "bird"] and ds.num_classes == 10
    assert ds.labels.tolist() == [c for c in range(10) for _ in range(3)]
    with zipfile.ZipFile(cifar_zip) as zf:
        assert np.array_equal(ds.images[0].numpy(), _pil(zf, "test/airplane/0000.jpg"))
        assert np.array_equal(ds.images[29].numpy(), _pil(zf, "test/truck/0002.jpg"))


def test_disk_cache_is_used_and_identical(cifar_zip, tmp_path):
    a = load_dataset(str(cifar_zip), "test", max_per_class=2, cache_dir=tmp_path)
    files = list((tmp_path / "decoded").glob("*.npz"))
    assert len(files) == 1
    b = load_dataset(str(cifar_zip), "test", max_per_class=2, cache_dir=tmp_path)
    assert torch.equal(a.images, b.images) and a.classes == b.classes
    with np.load(files[0], allow_pickle=False) as z:  # the cache is plain arrays, no pickle
        assert np.array_equal(z["images"], a.images.numpy())


def test_image_folder_equals_zip(cifar_zip, tmp_path):
    with zipfile.ZipFile(cifar_zip) as zf:
        for name in zf.namelist():
            if name.startswith("test/") and name.rsplit("/", 1)[1] in ("0000.jpg", "0001.jpg"):
                (tmp_path / "f" / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / "f" / name).write_bytes(zf.read(name))
    a = load_dataset(str(tmp_path / "f"), "test", use_cache=False)
    b = load_dataset(str(cifar_zip), "test", max_per_class=2, use_cache=False)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)


def _official(tmp_path: Path, ds: ArrayDataset, which: str) -> Path:
    """Write real images in the official CIFAR Python-batch format (dicts pickled protocol 2)."""
    flat = ds.images.numpy().reshape(len(ds), -1)
    if which == "cifar10":
        root = tmp_path / "cifar-10-batches-py"
        root.mkdir()
        parts = np.array_split(np.arange(len(ds)), 5)
        for i, idx in enumerate(parts, 1):
            d = {b"data": flat[idx], b"labels": ds.labels[idx].tolist(), b"batch_label": b"x"}
            (root / f"data_batch_{i}").write_bytes(pickle.dumps(d, protocol=2))
        test = {b"data": flat[:7], b"labels": ds.labels[:7].tolist()}
        (root / "test_batch").write_bytes(pickle.dumps(test, protocol=2))
        meta = {b"label_names": [c.encode() for c in ds.classes]}
        (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    else:
        root = tmp_path / "cifar-100-python"
        root.mkdir()
        fine = (ds.labels.numpy() * 7) % 100
        for split in ("train", "test"):
            d = {b"data": flat, b"fine_labels": fine.tolist(), b"coarse_labels": [0] * len(ds)}
            (root / split).write_bytes(pickle.dumps(d, protocol=2))
        meta = {b"fine_label_names": [f"c{i}".encode() for i in range(100)]}
        (root / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root


def test_official_cifar10_folder_and_targz(real_small, tmp_path):
    train, _ = real_small
    root = _official(tmp_path, train, "cifar10")
    x, y, classes = read_cifar(root, "cifar10", "train")
    assert np.array_equal(x, train.images.numpy()) and np.array_equal(y, train.labels.numpy())
    assert classes == train.classes
    tgz = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(root, arcname="cifar-10-batches-py")
    for spec in (str(root), str(tgz)):
        ds = load_dataset(spec, "test", cache_dir=tmp_path / "c")
        assert torch.equal(ds.images, train.images[:7]) and ds.classes == train.classes
    # by name, found under data.root
    ds = load_dataset("cifar10", "train", root=tmp_path, use_cache=False)
    assert torch.equal(ds.images, train.images)


def test_official_cifar100(real_small, tmp_path):
    train, _ = real_small
    root = _official(tmp_path, train, "cifar100")
    ds = load_dataset(str(root), "train", use_cache=False)
    assert ds.num_classes == 100 and ds.classes[5] == "c5"
    assert torch.equal(ds.labels, (train.labels * 7) % 100)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/attnconv_pwned_by_cifar_batch",))


def test_batch_unpickler_refuses_code(tmp_path):
    marker = Path("/tmp/attnconv_pwned_by_cifar_batch")
    marker.unlink(missing_ok=True)
    data = pickle.dumps({b"data": _Evil(), b"labels": []}, protocol=2)
    with pytest.raises(ValueError, match="not allowed"):
        load_batch(data, "evil_batch")
    assert not marker.exists()


def test_download_checks_md5(real_small, tmp_path):
    train, _ = real_small
    (tmp_path / "src").mkdir()
    root = _official(tmp_path / "src", train, "cifar10")
    payload = tmp_path / "srv" / "cifar-10-python.tar.gz"
    payload.parent.mkdir()
    with tarfile.open(payload, "w:gz") as tf:
        tf.add(root, arcname="cifar-10-batches-py")
    md5 = hashlib.md5(payload.read_bytes()).hexdigest()
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(payload.parent), **k
    )
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}/cifar-10-python.tar.gz"
    try:
        with pytest.raises(ValueError, match="md5"):
            download("cifar10", tmp_path / "dl", url=url, md5="0" * 32)
        assert not list((tmp_path / "dl").iterdir())  # nothing half-downloaded left
        got = download("cifar10", tmp_path / "dl", url=url, md5=md5)
        assert got.read_bytes() == payload.read_bytes()
        with pytest.raises(FileNotFoundError, match="cannot download"):
            download("cifar10", tmp_path / "dl2", url=url + ".missing", md5=md5)
    finally:
        srv.shutdown()
    x, y, _ = read_cifar(got, "cifar10", "train")
    assert np.array_equal(x, train.images.numpy())


def test_sample_script_regenerates_it_byte_for_byte(cifar_zip, tmp_path):
    from attnconv.data.make_sample import make_sample

    out = make_sample(cifar_zip, tmp_path / "s.zip")
    assert out.read_bytes() == SAMPLE_PATH.read_bytes()


def test_embedded_sample_is_real_cifar(cifar_zip):
    assert SAMPLE_PATH.stat().st_size <= 6_000_000
    tr = load_dataset("sample", "train", use_cache=False)
    te = load_dataset("sample", "test", use_cache=False)
    assert (len(tr), len(te), tr.num_classes) == (4000, 1000, 10)
    assert torch.bincount(tr.labels).tolist() == [400] * 10
    with zipfile.ZipFile(SAMPLE_PATH) as s, zipfile.ZipFile(cifar_zip) as z:
        for n in ("train/cat/0123.jpg", "test/ship/0099.jpg"):
            assert s.read(n) == z.read(n)  # the JPEG files, unchanged


# ---- bad input ---------------------------------------------------------------------------------


def test_missing_dataset_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.zip"):
        load_dataset(str(tmp_path / "nope.zip"), "train")
    with pytest.raises(FileNotFoundError, match="cifar10 not found.*download"):
        load_dataset("cifar10", "train", root=tmp_path)


def test_corrupt_image_names_file(cifar_zip, tmp_path):
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(cifar_zip) as z, zipfile.ZipFile(bad, "w") as out:
        out.writestr("train/cat/0000.jpg", z.read("train/cat/0000.jpg"))
        out.writestr("train/cat/0001.jpg", z.read("train/cat/0001.jpg")[:200])  # truncated JPEG
        out.writestr("train/dog/0000.jpg", b"not an image")
    with pytest.raises(ValueError, match=r"corrupt image 'train/(cat/0001|dog/0000)\.jpg'"):
        load_dataset(str(bad), "train", use_cache=False)


def test_corrupt_archive_and_batch_name_file(tmp_path):
    z = tmp_path / "broken.zip"
    z.write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(ValueError, match="broken.zip: not a readable zip"):
        load_dataset(str(z), "train", use_cache=False)
    t = tmp_path / "cifar-10-python.tar.gz"
    t.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(ValueError, match="cifar-10-python.tar.gz: not a readable"):
        load_dataset(str(t), "train", use_cache=False)
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": []}, protocol=2))
    (root / "test_batch").write_bytes(b"\x80\x02 truncated")
    with pytest.raises(ValueError, match="test_batch: not a readable CIFAR batch"):
        load_dataset(str(root), "test", use_cache=False)
    with pytest.raises(FileNotFoundError, match="data_batch_1: missing CIFAR batch"):
        load_dataset(str(root), "train", use_cache=False)


def test_empty_or_unknown_split(cifar_zip, tmp_path):
    (tmp_path / "d" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "d" / "test" / "cat").mkdir(parents=True)
    Image.new("RGB", (32, 32)).save(tmp_path / "d" / "test" / "cat" / "a.png")
    with pytest.raises(ValueError, match="split 'train' is empty"):
        load_dataset(str(tmp_path / "d"), "train", use_cache=False)
    with pytest.raises(ValueError, match=r"no split 'val' \(splits found: test, train;"):
        load_dataset(str(cifar_zip), "val", use_cache=False)


def test_mixed_image_sizes_name_file(tmp_path):
    for i, size in enumerate([(32, 32), (40, 32)]):
        p = tmp_path / "d" / "train" / "c" / f"{i}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size).save(p)
    with pytest.raises(ValueError, match=r"'train/c/1.png' is 32x40"):
        load_dataset(str(tmp_path / "d"), "train", use_cache=False)


# ---- augmentation and loader -----------------------------------------------------------------


@given(
    b=st.integers(1, 5),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    pad=st.integers(0, 4),
    seed=st.integers(0, 2**31),
)
def test_augment_fast_equals_reference(b, h, w, pad, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=g)
    offsets = torch.randint(0, 2 * pad + 1, (b, 2), generator=g)
    flips = torch.rand(b, generator=g) < 0.5
    assert torch.equal(augment(x, offsets, flips, pad), augment_reference(x, offsets, flips, pad))


def test_augment_semantics():
    x = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).expand(1, 3, 4, 4).contiguous()
    out = augment(x, torch.tensor([[0, 2]]), torch.tensor([False]), pad=1)  # down 1, left 1
    assert out[0, 0, 1].tolist() == [1, 2, 3, 0] and out[0, 0, 0].tolist() == [0, 0, 0, 0]
    out = augment(x, torch.tensor([[1, 1]]), torch.tensor([True]), pad=1)  # no shift, flipped
    assert torch.equal(out, x.flip(-1))


def test_loader_deterministic_resumable_and_sharded(real_small):
    train, test = real_small
    kw = dict(shuffle=True, seed=3, augment=True)
    full = list(Loader(train, 20, **kw).batches(epoch=1))
    again = list(Loader(train, 20, **kw).batches(epoch=1))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(full, again))
    other = next(iter(Loader(train, 20, **kw).batches(epoch=2)))
    assert not torch.equal(full[0][1], other[1])  # a new order each epoch
    tail = list(Loader(train, 20, **kw).batches(epoch=1, start=3))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(full[3:], tail)) and len(tail) == 3
    # two ranks together see exactly the single-process global batch, augmentation included
    r0 = list(Loader(train, 20, rank=0, world_size=2, **kw).batches(epoch=1))
    r1 = list(Loader(train, 20, rank=1, world_size=2, **kw).batches(epoch=1))
    for (x, y), (x0, y0), (x1, y1) in zip(full, r0, r1):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
    # evaluation: every image exactly once over the ranks, in order
    ev = [Loader(test, 16, shuffle=False, rank=r, world_size=3) for r in range(3)]
    seen = torch.cat([torch.cat([y for _, y in e.batches(0)]) for e in ev])
    assert sorted(seen.tolist()) == sorted(test.labels.tolist()) and len(seen) == len(test)


def test_loader_bad_arguments(real_small):
    train, _ = real_small
    with pytest.raises(ValueError, match="not divisible by world size 3"):
        Loader(train, 20, shuffle=True, world_size=3, rank=0)
    with pytest.raises(ValueError, match="fewer than one batch"):
        Loader(train, 1000, shuffle=True)
    with pytest.raises(ValueError, match="rank 2 outside world size 2"):
        Loader(train, 20, shuffle=True, world_size=2, rank=2)


def test_data_device_keeps_the_cpu_and_a_cpu_loader_is_unchanged():
    """On the CPU the loader holds the split where it is; batches equal the plain gather."""
    import torch

    from attnconv.data import data_device
    from attnconv.data.datasets import ArrayDataset
    from attnconv.data.loader import Loader, augment_params, augment_reference, generator

    g = torch.Generator().manual_seed(0)
    ds = ArrayDataset(
        torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (40,), generator=g),
        [str(i) for i in range(10)],
    )
    assert data_device(torch.device("cpu"), ds) == torch.device("cpu")
    ld = Loader(ds, 8, shuffle=True, seed=3, augment=True, pad=2, device="cpu")
    order = ld.order(1)
    for step, (x, y) in enumerate(ld.batches(1)):
        idx = order[step * 8 : (step + 1) * 8]
        off, fl = augment_params(8, 2, True, generator(3, 1, step, 1))
        want = (augment_reference(ds.images[idx], off, fl, 2).float() - ld.mean) / ld.std
        assert torch.equal(x, want) and torch.equal(y, ds.labels[idx])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_loader_on_the_gpu_yields_the_cpu_loaders_batches():
    from attnconv.data import data_device
    from attnconv.data.datasets import ArrayDataset

    g = torch.Generator().manual_seed(0)
    ds = ArrayDataset(
        torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (64,), generator=g),
        [str(i) for i in range(10)],
    )
    dev = data_device(torch.device("cuda"), ds)
    assert dev.type == "cuda"  # 200 KB fit
    kw = dict(shuffle=True, seed=1, augment=True, pad=4)
    cpu, gpu = Loader(ds, 16, **kw), Loader(ds, 16, device=dev, **kw)
    for (xc, yc), (xg, yg) in zip(cpu.batches(2), gpu.batches(2)):
        assert xg.device.type == "cuda" and yg.device.type == "cuda"
        assert torch.equal(xc, xg.cpu()) and torch.equal(yc, yg.cpu())
