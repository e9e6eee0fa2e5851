"""attnconv.set_backend: one kernel for every attention layer of a model that takes it (what a
GPU user sets once, e.g. "triton"), and ``model.backend`` in a training config applying it."""

from __future__ import annotations

import pytest

from attnconv import AttentionStem2d, LocalSelfAttention2d, MultiHeadSelfAttention2d, set_backend
from attnconv.layers.kernels import triton_axis
from attnconv.models import create_model
from attnconv.train.config import config_from_dict


def _layers(model, kind):
    return [m for m in model.modules() if isinstance(m, kind)]


def test_every_layer_that_takes_it_is_set_the_rest_keep_theirs():
    net = create_model("sasa_resnet26_cifar", num_classes=10)
    local, stem = _layers(net, LocalSelfAttention2d), _layers(net, AttentionStem2d)
    assert local and stem
    assert set_backend(net, "window") == len(local) + len(stem)  # both take "window"
    assert {m.backend for m in local + stem} == {"window"}
    if triton_axis.INSTALLED:  # the stem has no Triton path: it keeps its kernel
        assert set_backend(net, "triton") == len(local)
        assert {m.backend for m in local} == {"triton"} and {m.backend for m in stem} == {"window"}
    assert set_backend(net, None) == len(local) + len(stem)  # back to the plan's choice
    assert {m.backend for m in local + stem} == {None}


def test_the_paper_models_mhsa_layers():
    net = create_model("sa_learned_content", num_classes=10, hidden_size=16, num_layers=2)
    layers = _layers(net, MultiHeadSelfAttention2d)
    assert set_backend(net, "reference") == len(layers) == 2
    assert all(m.backend == "reference" for m in layers)


def test_a_name_no_layer_takes_is_one_line():
    net = create_model("sa_quadratic", num_classes=10, hidden_size=16, num_layers=1)
    with pytest.raises(ValueError, match=r"backend 'window': no attention layer of .* takes it \("):
        set_backend(net, "window")
    with pytest.raises(ValueError, match="takes it .it has none."):
        set_backend(create_model("tiny_cnn", num_classes=10), "reference")


def test_triton_missing_names_the_install(monkeypatch):
    monkeypatch.setattr(triton_axis, "INSTALLED", False)
    net = create_model("sa_quadratic", num_classes=10, hidden_size=16, num_layers=1)
    with pytest.raises(ValueError, match="pip install triton"):
        set_backend(net, "triton")


def test_the_config_key_is_checked_and_applied(tmp_path, cifar_zip):
    """`attnconv train ... --set model.backend=triton` on a GPU: the trainer sets it on the
    model it builds (here "reference", on the paper's content model at a tiny width)."""
    from attnconv.train.config import load_config
    from attnconv.train.loop import Trainer
    from tiny_runs import tiny_config

    with pytest.raises(ValueError, match="config key 'model.backend' must be one of"):
        config_from_dict({"model": {"backend": "cuda"}})
    path = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(tmp_path / "run"))
    over = ["model.name=sa_learned_content", "model.kwargs={hidden_size: 8, num_layers: 1}"]
    cfg = load_config(path, [*over, "model.backend=reference"])
    layers = _layers(Trainer(cfg).model, MultiHeadSelfAttention2d)
    assert layers and all(m.backend == "reference" for m in layers)


@pytest.mark.skipif(not triton_axis.INSTALLED, reason="triton is not installed")
def test_triton_on_a_cpu_says_in_one_line_what_runs(tmp_path, cifar_zip, monkeypatch, caplog):
    """`attnconv train ... --set model.backend=triton` on a CPU said nothing and ran the dense
    fallback in every content layer (slower than the plan's kernels): now one line says that the
    plan's kernels run instead, and the layers keep them."""
    from attnconv.train.config import load_config
    from attnconv.train.loop import Trainer
    from tiny_runs import tiny_config

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    path = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(tmp_path / "run"))
    over = ["model.name=sa_learned_content", "model.kwargs={hidden_size: 8, num_layers: 1}"]
    with caplog.at_level("WARNING", logger="attnconv"):
        trainer = Trainer(load_config(path, [*over, "model.backend=triton"]), device="cpu")
    lines = [r.getMessage() for r in caplog.records if "backend='triton'" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "run on CUDA, not cpu" in lines[0] and "the plan picks on cpu instead" in lines[0]
    layers = _layers(trainer.model, MultiHeadSelfAttention2d)
    assert layers and all(m.backend is None for m in layers)
