"""Whether `attnconv train` runs bf16 autocast where a config asks for it
(attnconv/device.py's bf16_passed_over): its predicates in order, each with its reason, and the
measured bf16 / float32 product speed they read."""

from __future__ import annotations

import pytest
import torch

from attnconv import device as dev


@pytest.fixture
def cpu(monkeypatch):
    """A CPU whose bf16 flags and measured bf16 gain the test sets."""

    def make(flags: bool, gain: float):
        monkeypatch.setattr(dev, "_cpu_bf16_flags", lambda: flags)
        monkeypatch.setattr(dev, "bf16_gemm_gain", lambda threads: gain)
        return torch.device("cpu")

    return make


def test_a_cpu_without_bf16_instructions_is_passed_over_first(cpu):
    assert "no bf16 instructions" in dev.bf16_passed_over(cpu(False, 3.0))


def test_a_cpu_whose_bf16_products_are_slow_is_passed_over(cpu):
    """An Intel Xeon with AVX512-BF16 and no AMX measured 0.55x: the reason gives the figure."""
    why = dev.bf16_passed_over(cpu(True, 0.55))
    assert "0.55x float32's speed" in why and f"{dev.BF16_MIN_GAIN}x" in why
    assert "1.24x" in dev.bf16_passed_over(cpu(True, 1.24))


def test_a_cpu_with_fast_bf16_products_runs_bf16(cpu):
    assert dev.bf16_passed_over(cpu(True, dev.BF16_MIN_GAIN)) is None
    assert dev.bf16_passed_over(cpu(True, 2.2)) is None  # a Zen 4's


def test_gpus_are_never_passed_over(monkeypatch):
    monkeypatch.setattr(dev, "_cpu_bf16_flags", lambda: pytest.fail("read a CPU's flags"))
    for d in ("cuda", "cuda:1", "mps"):
        assert dev.bf16_passed_over(torch.device(d)) is None


def test_the_gain_is_measured_at_the_given_threads_and_restores_them():
    """The real measurement: a positive ratio, cached per thread count, the caller's thread
    count left as it was."""
    before = torch.get_num_threads()
    gain = dev.bf16_gemm_gain(1, n=64, rounds=3)
    assert gain > 0 and torch.get_num_threads() == before
    assert dev.bf16_gemm_gain(1, n=64, rounds=3) == gain  # once per process
