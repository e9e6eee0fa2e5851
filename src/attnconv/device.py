"""Which torch device a command runs on: ``--device`` of train / eval / analyze / explore /
convert (``cpu``, ``cuda``, ``cuda:N``, ``mps``), checked before any work starts; whether
bf16 autocast would speed training there (``bf16_passed_over``); and how its CPU threads treat
subnormal floats (``flush_subnormals``). Below training: evaluation, analysis, conversion and
the benchmarks read it too; ``attnconv.train.distributed.set_up_compute`` applies it to a run."""

from __future__ import annotations

import logging
import statistics
import time
from functools import cache

import torch

from attnconv.cpuinfo import cpu_flags
from attnconv.layers.kernels import fused

log = logging.getLogger(__name__)

CHOICES = "cpu, cuda, cuda:N or mps"

# bf16 autocast on a CPU only where its products run this much faster (the choice, and the
# CPUs it was measured on: docs/benchmarks.md, "On an Intel Xeon")
BF16_MIN_GAIN = 1.25
FLUSH_SUBNORMALS = True  # a config's train.flush_subnormals where it says nothing


def bf16_passed_over(device: torch.device) -> str | None:
    """Why bf16 autocast would not speed a training step on ``device`` (None: it would), the
    first of these that holds, in order:

    1. a CPU without bf16 instructions (AVX512-BF16 or AMX-BF16 in its flags);
    2. a CPU whose bf16 matrix products run under ``BF16_MIN_GAIN`` x float32's
       (``bf16_gemm_gain``), as on an Intel Xeon with AVX512-BF16 and no AMX.

    On both, bf16 autocast measured slower a training step than float32 (docs/benchmarks.md).

    CUDA and MPS devices are never passed over."""
    if device.type != "cpu":
        return None
    if not _cpu_bf16_flags():
        return "this CPU has no bf16 instructions (no AVX512-BF16 or AMX)"
    gain = bf16_gemm_gain(torch.get_num_threads())
    if gain < BF16_MIN_GAIN:
        return (
            f"this CPU's bf16 matrix products measured {gain:.2f}x float32's speed, under "
            f"{BF16_MIN_GAIN}x"
        )
    return None


def _cpu_bf16_flags() -> bool:
    flags = cpu_flags()
    if flags is None:  # not Linux: oneDNN's answer
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return "avx512_bf16" in flags or "amx_bf16" in flags


@cache
def bf16_gemm_gain(threads: int, n: int = 512, rounds: int = 7) -> float:
    """bf16 over float32 throughput of an n x n x n matrix product on ``threads`` CPU threads
    (the two alternated, medians of ``rounds``; its cost: docs/training.md), once per process."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, n, n, generator=gen)
    pairs = {dt: (a.to(dt), b.to(dt)) for dt in (torch.float32, torch.bfloat16)}
    times: dict[torch.dtype, list[float]] = {dt: [] for dt in pairs}
    try:
        for r in range(rounds + 1):
            for dt, (x, y) in pairs.items():
                t0 = time.perf_counter()
                torch.mm(x, y)
                if r:  # the first round warms up
                    times[dt].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return statistics.median(times[torch.float32]) / statistics.median(times[torch.bfloat16])


def flush_subnormals(on: bool = True) -> bool:
    """Read and write subnormal floats (below 1.2e-38 in float32) as zero, or keep them (torch's
    default), on this thread and every intra-op worker thread; True when all of them did.

    The quadratic encoding's softmax(-alpha ||delta - Delta||^2) (Cordonnier et al. eq. 9) gives
    far-off keys subnormal probabilities, and some CPUs (Intel's) take a slow path on every
    operation that reads or writes one (docs/benchmarks.md, Subnormal floats). Flushing changes
    only values below that bound. ``torch.set_flush_denormal`` sets the calling thread alone;
    the workers already started are set by the fused extension's one task per thread (without
    it they keep subnormals, and a line says so)."""
    ok = torch.set_flush_denormal(on)
    if torch.get_num_threads() > 1:
        ext = fused.extension()
        if ext is None:  # its loader has said why
            log.warning(
                "subnormals %s on the main thread only: the worker threads are set by the fused "
                "C++ extension, not available here",
                "flushed" if on else "kept",
            )
            return False
        ok = ext.flush_denormal(on) and ok
    return ok


def flush_as_trained(info: dict, device: torch.device) -> None:
    """On a CPU, subnormals flushed or kept as the checkpoint's run trained (its config's
    ``train.flush_subnormals``; FLUSH_SUBNORMALS, the config's default, where it says nothing,
    as for pretrained weights): what evaluation and analysis of a checkpoint set before their
    forward passes."""
    if device.type != "cpu":
        return
    train_cfg = (info.get("config") or {}).get("train") or {}
    flush_subnormals(bool(train_cfg.get("flush_subnormals", FLUSH_SUBNORMALS)))


def default_device() -> torch.device:
    """CUDA if this torch build and machine have it, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """``spec`` as a usable device (None or "auto": default_device()); a device this torch build
    or machine does not have is a ValueError naming it and what is available."""
    if spec is None or spec == "auto":
        return default_device()
    try:
        dev = torch.device(spec)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {spec!r}: not a device name (expected {CHOICES})") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            build = torch.version.cuda or "none (a CPU-only build)"
            raise ValueError(
                f"--device {spec}: CUDA is not available here (torch {torch.__version__}, CUDA "
                f"{build}); use --device cpu"
            )
        if dev.index is not None and dev.index >= n:
            raise ValueError(
                f"--device {spec}: this machine has {n} CUDA device(s), cuda:0..{n - 1}"
            )
        return dev
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"--device {spec}: Apple's MPS backend is not available here")
        return dev
    raise ValueError(
        f"--device {spec!r}: unsupported device type {dev.type!r} (expected {CHOICES})"
    )
