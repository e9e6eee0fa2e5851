"""How the cuda suite times a step and names its device, for its layer groups (bench/cuda.py) and
its models group (bench/cuda_models.py): CUDA events on a GPU, the wall clock in a CPU dry run."""

from __future__ import annotations

import statistics
import time

import torch


def ms_per_call(step, inner: int, device: str) -> float:
    """Milliseconds per call of ``inner`` calls: CUDA events on a GPU, the wall clock on the
    CPU (a dry run)."""
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        return (time.perf_counter() - t0) * 1e3 / inner
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(inner):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / inner


def time_and_memory(steps: dict, repeats: int, inner: int, device: str = "cuda") -> dict:
    """Per step: median ms per call (``inner`` calls, interleaved round-robin) and, on a GPU,
    peak MB allocated during one call. A step that fails is reported with its error."""
    out: dict[str, dict] = {}
    cuda = device == "cuda"
    for name, step in list(steps.items()):
        try:
            # warm-up: compilation, autotuning, allocator; on a CPU (the dry run, whose figures
            # mean nothing) the one call that compiles
            for _ in range(3 if cuda else 1):
                step()
            out[name] = {"ms": []}
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step()
                torch.cuda.synchronize()
                out[name]["mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        except Exception as exc:  # noqa: BLE001 - a missing kernel is a result, not a crash
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
            steps.pop(name)
    for _ in range(repeats):
        for name, step in steps.items():
            out[name]["ms"].append(ms_per_call(step, inner, device))
    for v in out.values():
        if "ms" in v:
            v["ms"] = statistics.median(v["ms"])
    return out


def device_name(device: str) -> str:
    """The GPU's name, or what a CPU dry run says in its place."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "CPU dry run (the suite's code only: these figures mean nothing)"
