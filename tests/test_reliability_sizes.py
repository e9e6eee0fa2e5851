"""Every crafted size is refused before it is allocated (issue 27, item 4): a model declaring
a huge width, learned table or depth (in a config or in a checkpoint's metadata), an oversized
CIFAR batch member; each in seconds and without the memory it declares."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time

import pytest

from attnconv.data import cifar
from attnconv.models import create_model
from attnconv.models.budget import MAX_MODULES, probe_bytes
from attnconv.train import checkpoint as ck

CRAFTED = [
    {"hidden_size": 10**9},
    {"max_size": 10**9},
    {"num_layers": 10**5},
    {"num_layers": 10**7, "hidden_size": 8, "ff_size": 8},
]


@pytest.mark.parametrize("kw", CRAFTED)
def test_probe_refuses_crafted_models_fast(kw):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="declares more than"):
        probe_bytes("sa_learned", kw, 8 << 30, "model 'sa_learned'")
    assert time.perf_counter() - t0 < 5


def test_probe_measures_a_real_model():
    kw = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "ff_size": 16}
    model = create_model("sa_learned", **kw)
    want = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert probe_bytes("sa_learned", kw, 1 << 30, "x") == want


# a child's own peak resident memory (VmHWM of its address space, KiB): ru_maxrss would carry
# the parent's peak over the fork and exec
HWM = "[ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1]"


@pytest.fixture(scope="module")
def imported_mb() -> float:
    """What importing the models and the trainer alone holds: torch's own libraries (a CUDA
    build maps ~0.3 GB more than the CPU one), none of a refused model."""
    imported = subprocess.run(
        [sys.executable, "-c", f"import attnconv.models, attnconv.train\nprint({HWM})"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return int(imported.stdout.strip().splitlines()[-1]) / 1024


@pytest.mark.slow
@pytest.mark.parametrize(
    "override", ["model.kwargs.hidden_size=1000000000", "model.kwargs.num_layers=10000000"]
)
def test_training_config_refused_in_seconds_and_little_memory(tmp_path, override, imported_mb):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {name: sa_learned}\n")
    code = (
        "import sys\nfrom attnconv.cli import main\n"
        f"try:\n    rc = main(sys.argv[1:])\nfinally:\n    print({HWM})\n"
        "sys.exit(rc)"
    )
    t0 = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "train",
            str(cfg),
            "--out",
            str(tmp_path / "run"),
            "--set",
            override,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.perf_counter() - t0
    peak_mb = int(r.stdout.strip().splitlines()[-1]) / 1024
    assert r.returncode == 2 and "declares more than" in r.stderr.strip().splitlines()[-1]
    # 5 s on a quiet machine, 11 s on a loaded one; the refused model would need gigabytes
    assert wall < 60 and peak_mb - imported_mb < 100, (wall, peak_mb, imported_mb)


@pytest.mark.slow
def test_checkpoint_declaring_100000_layers_is_refused_fast(tmp_path):
    kw = {"hidden_size": 8, "num_layers": 1, "num_heads": 2, "ff_size": 8}
    path = ck.save_checkpoint(
        tmp_path / "ck", create_model("sa_quadratic", **kw), "sa_quadratic", kw
    )
    meta = json.loads((path / ck.META).read_text())
    meta["model_kwargs"]["num_layers"] = 100_000
    meta[ck.META_HASH] = ck.meta_digest(meta)  # a crafter recomputes the digest
    (path / ck.META).write_text(json.dumps(meta))
    t0 = time.process_time()  # this process's CPU seconds: a shared machine's load adds none
    with pytest.raises(ck.CheckpointError, match=f"more than {MAX_MODULES} modules|GiB"):
        ck.load_model(path)
    assert time.process_time() - t0 < 5


def test_weight_file_size_checked_before_reading(tmp_path, monkeypatch):
    kw = {"width": 4}
    path = ck.save_checkpoint(tmp_path / "ck", create_model("tiny_cnn", **kw), "tiny_cnn", kw)
    with open(path / ck.WEIGHTS, "ab") as f:
        f.write(b"\0" * 1000)
    read, real = [], type(path).read_bytes

    def spy(self):
        read.append(self)
        return real(self)

    monkeypatch.setattr(type(path), "read_bytes", spy)
    with pytest.raises(ck.CheckpointError, match="size differ"):
        ck.read_checkpoint(path)
    assert not [p for p in read if p.name == ck.WEIGHTS]  # refused from its size alone


def test_oversized_cifar_batch_member_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar, "MAX_BATCH_BYTES", 1000)
    arch = cifar.ARCHIVES["cifar10"]
    tgz = tmp_path / arch.filename
    with tarfile.open(tgz, "w:gz") as tf:
        for name in [arch.meta, *arch.train, *arch.test]:
            data = b"\0" * (5000 if name == arch.test[0] else 10)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match=rf"member '{arch.test[0]}' is 5000 bytes"):
        cifar.read_cifar(tgz, "cifar10", "test")


def test_attention_maps_too_large_are_refused_before_any_compute(monkeypatch):
    """return_attention on a 256x256 image ran 30 s, then failed on a raw 68.7 GB allocation:
    the maps' size is checked first, in one line with the size and the bound (issue 79)."""
    import torch

    from attnconv.memory import check_attention_maps, memory_bytes

    model = create_model("sa_quadratic").eval()  # position only: one (1, 9, T, T) map a layer

    def computed(*a, **kw):
        raise AssertionError("a layer ran before the maps' size was checked")

    monkeypatch.setattr(type(model.layers[0]), "forward", computed)
    with pytest.raises(ValueError) as e, torch.no_grad():
        model(torch.zeros(1, 3, 256, 256), return_attention=True)
    assert "\n" not in str(e.value)
    half = memory_bytes() // 2
    need = 7 * 9 * 16384**2 * 4  # 6 layers kept + 1 computing, T = 128 * 128 tokens
    assert f"needs at least {need / 2**30:.1f} GiB" in str(e.value)
    assert f"({half / 2**30:.1f} GiB)" in str(e.value) and "1x9x16384x16384" in str(e.value)
    vit = create_model("vit_tiny_cifar", depth=1, embed_dim=16, num_heads=2).eval()
    small = r"vit on 2 image\(s\) of 32x32: .* 0.1 MiB .*\(1 layer of 2x2x65x65\)"
    with pytest.raises(ValueError, match=small):
        check_attention_maps([(2, 2, 65, 65)], 4, "vit on 2 image(s) of 32x32", limit=1000)
    logits, maps = vit(torch.zeros(2, 3, 32, 32), return_attention=True)  # small: as ever
    assert logits.shape == (2, 10) and maps[0].probs.shape == (2, 2, 65, 65)
