"""Shared test fixtures: the real CIFAR-10 data of the workplace, deterministic torch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# Where no GPU is, the Triton kernels run through Triton's interpreter on CPU tensors (the same
# kernel source; set before anything imports attnconv: triton.jit reads it when a kernel is made).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Real CIFAR-10 JPEGs (train/<class>/*.jpg, test/<class>/*.jpg) at ../shared/data/ beside the
# project (or beside any parent folder of it); override with ATTNCONV_CIFAR_ZIP.
def _find_cifar_zip() -> Path:
    if os.environ.get("ATTNCONV_CIFAR_ZIP"):
        return Path(os.environ["ATTNCONV_CIFAR_ZIP"])
    for parent in ROOT.parents:
        candidate = parent / "shared" / "data" / "cifar10-jpeg.zip"
        if candidate.exists():
            return candidate
    return ROOT.parent / "shared" / "data" / "cifar10-jpeg.zip"


CIFAR_ZIP = _find_cifar_zip()

# derandomized: every run draws the same 25 examples per property, so a run of CI is reproducible
# (a float32 roundoff case one run in several drew turned CI red at random)
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None)
# a bug hunt, not CI (`pytest --hypothesis-profile deep`, docs/development.md): ci's settings,
# random, and a failure prints the @reproduce_failure line that replays it; hypothesis loads it
# before the test modules are imported, so every test's settings inherit it
settings.register_profile("deep", settings.get_profile("ci"), derandomize=False, print_blob=True)
settings.load_profile("ci")
DEEP_FACTOR = 10


def pytest_collection_modifyitems(config, items):
    """With the deep profile, each property test draws DEEP_FACTOR times its max_examples (its
    own, or ci's 25): a test's own ``@settings(max_examples=...)`` overrides any profile."""
    if config.getoption("hypothesis_profile", None) != "deep":
        return
    done = set()
    for item in items:
        obj = getattr(item, "obj", None)
        fn = getattr(obj, "__func__", obj)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None or id(fn) in done:  # parametrized cases share one function
            continue
        done.add(id(fn))
        fn._hypothesis_internal_use_settings = settings(
            own, max_examples=own.max_examples * DEEP_FACTOR
        )


def pytest_configure(config):
    """The default run leaves out the slow tests (pyproject's addopts: -m "not slow"), but a test
    named on the command line (FILE::NAME) runs whether it is slow or not."""
    if config.option.markexpr == "not slow" and any("::" in a for a in config.args):
        config.option.markexpr = ""


@pytest.fixture
def cifar_zip() -> Path:
    if not CIFAR_ZIP.exists():
        pytest.fail(f"real CIFAR-10 zip not found at {CIFAR_ZIP} (set ATTNCONV_CIFAR_ZIP)")
    return CIFAR_ZIP


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread for every test: the tests are many small ops, where a second spinning
    thread only costs. The torch globals code under test may set (threads, deterministic
    algorithms, subnormals flushed: a training's train.threads / train.deterministic /
    train.flush_subnormals) are restored afterwards, so they cannot leak into the next test."""
    n = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    tiny = torch.ones(1, dtype=torch.int32).view(torch.float32)  # 1.4e-45, made from its bits
    if (tiny * 1.0).item() == 0:  # this thread flushes subnormals: torch's default back
        from attnconv.device import flush_subnormals

        flush_subnormals(False)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Every test that takes ``device`` runs on the CPU and, when a GPU is present, on CUDA."""
    return torch.device(request.param)


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty filled with NaN: a GPU's caching allocator hands back memory holding old
    values where a CPU's fresh pages are often zero, so an output some kernel leaves partly
    unwritten passes on a CPU by luck. Under this fixture it turns the result NaN."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
