"""Checkpoints on real files: round trip, atomic replace, and every way loading must refuse."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from attnconv import create_model
from attnconv.train.checkpoint import (
    LATEST,
    META,
    META_HASH,
    WEIGHTS,
    CheckpointError,
    load_model,
    meta_digest,
    read_checkpoint,
    save_checkpoint,
)


@pytest.fixture
def saved(tmp_path) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = create_model("tiny_cnn", num_classes=10, width=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    path = save_checkpoint(
        tmp_path / "ck",
        model,
        "tiny_cnn",
        {"num_classes": 10, "width": 8},
        optimizer=opt,
        state={"step": 1},
        state_tensors={"rng.torch": torch.get_rng_state()},
    )
    return path, model


def test_round_trip(saved):
    path, model = saved
    loaded, info = load_model(path)
    assert info["model"] == "tiny_cnn" and info["model_kwargs"] == {"num_classes": 10, "width": 8}
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    x = torch.randn(3, 3, 32, 32)
    assert torch.equal(loaded(x), model.eval()(x))
    meta, _, st = read_checkpoint(path / WEIGHTS, with_state=True)  # the file path works too
    assert "optim.0.momentum_buffer" in st and meta["state"]["step"] == 1
    assert not list(path.parent.glob(".*"))  # no temp files left behind


def test_atomic_replace_and_latest_pointer(saved, tmp_path):
    path, model = saved
    other = create_model("tiny_cnn", num_classes=10, width=8)
    save_checkpoint(path, other, "tiny_cnn", {"num_classes": 10, "width": 8})
    loaded, _ = load_model(path)
    assert torch.equal(loaded.conv1.weight, other.conv1.weight)
    assert not list(path.parent.glob(".*"))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    path.rename(run / "checkpoints" / "step-00000005")
    (run / "checkpoints" / LATEST).write_text("step-00000005")
    assert load_model(run)[1]["path"].endswith("step-00000005")  # run folder -> latest
    pointer = run / "checkpoints" / LATEST  # the pointer itself (was "foreign checkpoint")
    assert load_model(pointer)[1]["path"].endswith("step-00000005")


def test_truncated(saved):
    path, _ = saved
    f = path / WEIGHTS
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"truncated checkpoint: \d+ of \d+ bytes"):
        load_model(path)


def test_corrupted_bytes(saved):
    path, _ = saved
    f = path / WEIGHTS
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF  # flip bits inside a weight
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted checkpoint: sha256"):
        load_model(path)


def test_corrupted_metadata(saved):
    path, _ = saved
    (path / META).write_text('{"format": "attnconv-checkpoint", "vers')
    with pytest.raises(CheckpointError, match="corrupted checkpoint: metadata is not JSON"):
        load_model(path)


def _edit_meta(path: Path, **changes) -> None:
    """A crafted edit whose metadata digest was recomputed (sha256 is public): the checks
    behind the digest must still refuse it."""
    meta = json.loads((path / META).read_text())
    meta.update(changes)
    meta[META_HASH] = meta_digest(meta)
    (path / META).write_text(json.dumps(meta))


def test_foreign_other_model(saved):
    path, _ = saved
    _edit_meta(path, model="resnet18_cifar", model_kwargs={"num_classes": 10})
    with pytest.raises(
        CheckpointError,
        match="foreign checkpoint: weights don't fit model "
        "'resnet18_cifar' \\(missing .*unexpected",
    ):
        load_model(path)


def test_foreign_shapes_or_dtypes(saved, tmp_path):
    path, _ = saved
    _edit_meta(path, model_kwargs={"num_classes": 10, "width": 12})  # same names, other shapes
    with pytest.raises(CheckpointError, match="foreign checkpoint.*shape/dtype conv1.weight"):
        load_model(path)
    half = create_model("tiny_cnn", num_classes=10, width=8)
    half.conv1.to(torch.float64)  # mixed dtypes (a model all in one dtype loads in it)
    p2 = save_checkpoint(tmp_path / "f64", half, "tiny_cnn", {"num_classes": 10, "width": 8})
    with pytest.raises(CheckpointError, match="torch.float64 vs .*torch.float32"):
        load_model(p2)


def test_foreign_version_format_and_name(saved, tmp_path):
    path, _ = saved
    with pytest.raises(CheckpointError, match="it holds 'tiny_cnn', not 'resnet18_cifar'"):
        load_model(path, model_name="resnet18_cifar")
    _edit_meta(path, model="no_such_model")
    with pytest.raises(CheckpointError, match="model 'no_such_model' is not in this attnconv"):
        load_model(path)
    _edit_meta(path, version=99)
    with pytest.raises(CheckpointError, match="format version 99"):
        load_model(path)
    _edit_meta(path, format="somebody-else")
    with pytest.raises(CheckpointError, match="foreign checkpoint: checkpoint.json is not"):
        load_model(path)


def test_stored_tensor_index_must_match(saved):
    path, _ = saved
    meta = json.loads((path / META).read_text())
    meta["tensors"][WEIGHTS]["conv1.weight"][1] = [1, 2, 3]
    meta[META_HASH] = meta_digest(meta)
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="tensors differ from the index"):
        load_model(path)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/attnconv_pwned_by_checkpoint",))


@pytest.mark.parametrize("how", ["torch_save", "raw_pickle", "replaced_weights"])
def test_pickle_is_refused_never_executed(saved, tmp_path, how):
    marker = Path("/tmp/attnconv_pwned_by_checkpoint")
    marker.unlink(missing_ok=True)
    path, model = saved
    if how == "torch_save":
        target = tmp_path / "model.pt"
        torch.save({"state_dict": model.state_dict(), "evil": _Evil()}, target)
    elif how == "raw_pickle":
        target = tmp_path / "model.pkl"
        target.write_bytes(pickle.dumps(_Evil(), protocol=4))
    else:
        target = path
        torch.save({"evil": _Evil()}, path / WEIGHTS)
    with pytest.raises(CheckpointError, match="pickle checkpoint"):
        load_model(target)
    assert not marker.exists()


def test_missing(tmp_path):
    with pytest.raises(CheckpointError, match="missing checkpoint"):
        load_model(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="missing checkpoint: the folder has no checkpoint"):
        load_model(tmp_path / "empty")


@pytest.mark.slow
def test_cli_eval_bad_checkpoint_one_line(saved, tmp_path):
    import subprocess
    import sys

    path, _ = saved
    (path / WEIGHTS).write_bytes((path / WEIGHTS).read_bytes()[:50])
    r = subprocess.run(
        [sys.executable, "-m", "attnconv.cli", "eval", str(path), "--data", "sample"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()  # status lines ("eval: loading ..."), then the error
    assert sum("error" in ln.lower() for ln in lines) == 1, r.stderr
    assert lines[-1].startswith("attnconv eval: error: ") and "truncated checkpoint" in lines[-1]
    assert "Traceback" not in r.stderr


def test_metadata_edit_is_detected(saved):
    """The normalization and config are outside the weight files: the metadata's own digest
    covers them, and a zero std is refused even with the digest recomputed."""
    path, _ = saved
    meta = json.loads((path / META).read_text())
    meta.setdefault("data", {})["std"] = [0.3, 0.3, 0.3]  # plausible, but not what was saved
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="metadata sha256 differs"):
        load_model(path)
    _edit_meta(path, data={"std": [0, 0, 0]})
    with pytest.raises(CheckpointError, match="data.std"):
        load_model(path)
    _edit_meta(path, data={"std": [0.2, 0.2, 0.2]})  # a sound, re-signed edit loads
    load_model(path)
