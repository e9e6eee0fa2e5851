"""Which torch device a command runs on: ``--device`` of train / eval / analyze / explore /
convert (``cpu``, ``cuda``, ``cuda:N``, ``mps``), checked before any work starts."""

from __future__ import annotations

import torch

CHOICES = "cpu, cuda, cuda:N or mps"


def native_bf16(device: torch.device) -> bool:
    """bf16 arithmetic in hardware: any CUDA/MPS device; on a CPU, AVX-512 (BF16) or AMX as
    oneDNN needs it. Without it (e.g. AVX2 only) bf16 autocast measured 10x slower a training
    step than float32 (sa_quadratic, B=64, 1 thread: 20 s against 1.7 s)."""
    if device.type != "cpu":
        return True
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


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
