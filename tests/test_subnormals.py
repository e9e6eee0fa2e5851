"""Subnormal floats flushed to zero on every CPU thread (attnconv.device.flush_subnormals): the
main thread and the intra-op workers already started, what `attnconv train` sets from its
config, a resume free to change it, and eval / analyze / explore setting it as the run trained."""

from __future__ import annotations

import logging

import pytest
import torch

from attnconv import device
from attnconv.layers.kernels import fused
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Trainer
from attnconv.train.resume import check_same_config
from train_helpers import small, use_cache


def flushed_fraction() -> float:
    """How much of a subnormal tensor large enough to be split over every thread reads as zero
    (DAZ): 1.0 where every thread flushes, 0.0 where none does. The values are made from their
    bits (float32 0x00000001, 1.4e-45), not converted from a Python float: a conversion on a
    flushing thread would already give zero."""
    x = torch.ones(1 << 20, dtype=torch.int32).view(torch.float32)
    return (x * 1.0 == 0).float().mean().item()


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    flushed_fraction()  # the worker pool starts here, before any flag is set
    yield
    device.flush_subnormals(False)
    torch.set_num_threads(before)


@pytest.mark.skipif(not fused.available(), reason="the C++ extension did not build")
def test_every_thread_flushes_after_the_workers_started(two_threads):
    torch.set_flush_denormal(True)  # torch's own call: the calling thread alone
    assert flushed_fraction() == 0.5
    assert device.flush_subnormals(True)
    assert flushed_fraction() == 1.0
    assert device.flush_subnormals(False)
    assert flushed_fraction() == 0.0
    assert torch.tensor([1e-39]).item() != 0  # kept again: torch's default


def test_without_the_extension_the_main_thread_flushes_and_a_line_says_so(
    two_threads, monkeypatch, caplog
):
    monkeypatch.setattr(fused, "extension", lambda: None)
    with caplog.at_level(logging.WARNING, logger="attnconv.device"):
        assert not device.flush_subnormals(True)
    assert "main thread only" in caplog.text and len(caplog.records) == 1
    torch.set_num_threads(1)  # the main thread's own work
    assert flushed_fraction() == 1.0


@pytest.mark.parametrize("on", [True, False])
def test_training_sets_its_threads_from_the_config(cifar_zip, tmp_path, on):
    use_cache(tmp_path / "cache")
    d = small(cifar_zip, tmp_path / "run", train={"flush_subnormals": on})
    try:
        Trainer(config_from_dict(d))
        assert flushed_fraction() == (1.0 if on else 0.0)  # threads: 1, the main thread
    finally:
        device.flush_subnormals(False)
    assert config_from_dict(small(cifar_zip, tmp_path)).train.flush_subnormals  # the default


def test_a_resume_may_change_it(cifar_zip, tmp_path):
    use_cache(tmp_path / "cache")
    old = config_from_dict(small(cifar_zip, tmp_path, train={"flush_subnormals": False}))
    meta = {"config": old.to_dict()}
    check_same_config(meta, config_from_dict(small(cifar_zip, tmp_path)))
    del meta["config"]["train"]["flush_subnormals"]  # a run saved before the key existed
    check_same_config(meta, config_from_dict(small(cifar_zip, tmp_path)))


@pytest.mark.parametrize("on", [True, False])
def test_eval_flushes_as_the_run_trained(cifar_zip, tmp_path, on):
    """`attnconv eval` on a CPU sets the flag from the checkpoint's train.flush_subnormals
    (evaluation of a quadratic model measured 1.7-1.9x faster flushed on an Intel Xeon, the same
    accuracy and loss)."""
    from attnconv.cli import main

    use_cache(tmp_path / "cache")
    sa = {"name": "sa_learned_content", "kwargs": {"hidden_size": 16, "num_layers": 1}}
    sa["kwargs"]["num_heads"] = 2  # an attention model: analyze refuses a CNN (convert it)
    d = small(cifar_zip, tmp_path / "run", train={"flush_subnormals": on, "epochs": 1}, model=sa)
    Trainer(config_from_dict(d)).fit()
    device.flush_subnormals(not on)
    ck = str(tmp_path / "run" / "checkpoints")
    assert main(["eval", ck, "--max-per-class", "1", "--json", "-", "--device", "cpu"]) == 0
    assert flushed_fraction() == (1.0 if on else 0.0)


@pytest.mark.parametrize("on", [True, False])
def test_analyze_and_explore_flush_as_the_run_trained(cifar_zip, tmp_path, on):
    """`attnconv analyze` and `explore` start from load_for_analysis, which sets the flag as
    `eval` does (their forward passes over the test images are the same evaluation)."""
    from attnconv.analysis.inputs import load_for_analysis

    use_cache(tmp_path / "cache")
    sa = {"name": "sa_learned_content", "kwargs": {"hidden_size": 16, "num_layers": 1}}
    sa["kwargs"]["num_heads"] = 2  # an attention model: analyze refuses a CNN (convert it)
    d = small(cifar_zip, tmp_path / "run", train={"flush_subnormals": on, "epochs": 1}, model=sa)
    Trainer(config_from_dict(d)).fit()
    device.flush_subnormals(not on)
    load_for_analysis(tmp_path / "run" / "checkpoints", str(cifar_zip), 2, device="cpu")
    assert flushed_fraction() == (1.0 if on else 0.0)  # conftest restores torch's default
