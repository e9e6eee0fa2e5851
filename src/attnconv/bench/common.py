"""Benchmark helpers shared by the suites: forward+backward time, peak memory and FLOPs on CPU.

Method (each case runs in a fresh ``python`` subprocess, so cases cannot pollute each other):
1. the child imports torch, sets its thread count, and calls the case factory
   (``"package.module:function"`` with JSON kwargs) which builds the module and inputs and
   returns ``step()``, one forward+backward;
2. memory: RSS right after setup (``/proc/self/statm``) is the baseline; the first ``step()``
   runs; peak = ``ru_maxrss`` (the process's RSS high-water mark) minus that baseline, i.e. the
   extra resident memory one fwd+bwd needs (activations kept for backward, temporaries,
   gradients). A setup transient above the baseline can only make this an over-estimate;
3. FLOPs: that same first step runs under ``torch.utils.flop_counter.FlopCounterMode`` (matmul,
   conv, attention kernels; elementwise ops are not counted), with a formula added for
   PyTorch's CPU flash attention kernel, which the counter does not know;
4. time: the first step counts as one warm-up; then the median wall time of ``repeats`` steps
   (``time.perf_counter``).

The machine may be shared: compare ratios measured in one run, not absolute times across runs.

Allocator (``--malloc``): glibc returns freed blocks above its trim/mmap thresholds to the OS,
so a step whose temporaries are tens of MB page-faults them in again on every call; how much
depends on the allocation order, and it is a large share of some cases (the dense reference
paths most). ``glibc`` (default) keeps the default policy a user gets; ``retain`` sets glibc's
thresholds so freed memory is kept and reused (what jemalloc/tcmalloc do), for every case of
the run alike.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# The committed results of a source checkout (src/attnconv/bench -> repo root), rewritten only on
# --update-results; every other run writes under the current directory.
RESULTS_DIR = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
DEFAULT_OUT_DIR = Path("attnconv-bench")
MALLOC_POLICIES = {
    "glibc": {},
    "retain": {"MALLOC_MMAP_THRESHOLD_": "4000000000", "MALLOC_TRIM_THRESHOLD_": "4000000000"},
}


def add_output_options(p: argparse.ArgumentParser) -> None:
    """``--out-dir`` and ``--update-results``, the same for every suite (see output_dir)."""
    p.add_argument(
        "--out",
        "--out-dir",
        dest="out_dir",
        default=None,
        help=f"folder for the results (default: ./{DEFAULT_OUT_DIR}/; --out-dir: the "
        "older spelling)",
    )
    p.add_argument(
        "--update-results",
        action="store_true",
        help="rewrite benchmarks/results/ of a source checkout",
    )


def output_dir(args: argparse.Namespace) -> Path:
    """Where a suite writes: ``--out-dir``, else ``./attnconv-bench/`` under the current
    directory; the committed ``benchmarks/results/`` of a source checkout only with
    ``--update-results`` (never from ``--quick``, never from an installed package)."""
    if not args.update_results:
        return Path(args.out_dir) if args.out_dir is not None else DEFAULT_OUT_DIR
    if args.out_dir is not None:
        raise ValueError("--update-results writes benchmarks/results/: drop --out-dir")
    if getattr(args, "quick", False):
        raise ValueError("--update-results with --quick: quick sizes are not results to commit")
    if not (RESULTS_DIR.is_dir() and (RESULTS_DIR.parents[1] / "pyproject.toml").is_file()):
        raise ValueError(
            f"--update-results needs a source checkout (no benchmarks/results/ beside "
            f"{Path(__file__).resolve().parents[2]}); use --out-dir"
        )
    return RESULTS_DIR


def count(text: str) -> int:
    """argparse type of a count (threads, repeats, batch, size): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive(text: str) -> float:
    """argparse type of a finite amount > 0 (a memory budget in GB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value:g}")
    return value


def suite_parser(suite: str, description: str | None, only: list[str]) -> argparse.ArgumentParser:
    """The options every timing suite takes (``attnconv bench --suite SUITE -- ...``)."""
    p = argparse.ArgumentParser(prog=f"attnconv bench --suite {suite}", description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes, in-process, no memory")
    p.add_argument("--threads", type=count, default=1, help="torch threads per case (1)")
    p.add_argument(
        "--repeats",
        type=count,
        default=None,
        help="timed repeats per case; the median is reported",
    )
    add_output_options(p)
    p.add_argument(
        "--budget-gb",
        type=positive,
        default=6.0,
        help="skip reference cases estimated to need more memory (6)",
    )
    p.add_argument("--only", choices=only, default=None, help="run one group of cases")
    p.add_argument(
        "--malloc",
        choices=list(MALLOC_POLICIES),
        default="glibc",
        help="glibc allocator policy for every case (see bench/common.py)",
    )
    return p


def suite_command(suite: str, args: argparse.Namespace) -> str:
    """The ``attnconv bench`` command line that reproduces a suite_parser run (for its report)."""
    cmd = f"attnconv bench --suite {suite}" + (" --quick" if args.quick else "")
    cmd += " --update-results" if args.update_results else ""
    extra = ([f"--only {args.only}"] if args.only else []) + (
        [f"--malloc {args.malloc}"] if args.malloc != "glibc" else []
    )
    return cmd + (" -- " + " ".join(extra) if extra else "")


TARGET_COLUMNS = [
    ("target", "target", ""),
    ("measured", "measured", ".3g"),
    ("required", "required", ".3g"),
    ("met", "met", ""),
]


def median_time(step: Callable[[], object], repeats: int = 5, warmup: int = 1) -> list[float]:
    """Run ``step`` warmup times, then return the wall times of ``repeats`` more runs."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def _register_cpu_flash_flops() -> None:
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    if aten._scaled_dot_product_flash_attention_for_cpu in fc.flop_registry:
        return

    @fc.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    @fc.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kw):
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs of one call of ``step`` (matmul/conv/attention kernels) by FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_flash_flops()
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def _child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec.get("threads", 1))
    mod_name, fn_name = spec["factory"].split(":")
    step = getattr(importlib.import_module(mod_name), fn_name)(**spec.get("kwargs", {}))
    out: dict = {}
    warmup = spec.get("warmup", 1)
    if spec.get("memory", True) or spec.get("flops", True):
        # the first step measures memory and counts FLOPs (FlopCounterMode keeps no tensors);
        # it is also the warm-up
        # load the counter's machinery (imports on its first dispatched op) before the baseline
        count_flops(lambda: torch.ones(2, 2, requires_grad=True).mm(torch.ones(2, 2)).sum())
        base = _rss_bytes()
        flops = count_flops(step)
        if spec.get("memory", True):
            out["peak_mb"] = max(_maxrss_bytes() - base, 0) / 2**20
        if spec.get("flops", True):
            out["gflop"] = flops / 1e9
        warmup = max(warmup - 1, 0)
    times = median_time(step, spec.get("repeats", 5), warmup)
    out["times_s"] = times
    keys = {k for policy in MALLOC_POLICIES.values() for k in policy}
    out["malloc_env"] = {k: os.environ[k] for k in sorted(keys) if k in os.environ}
    out["median_s"] = statistics.median(times)
    if "gflop" in out:
        out["gflops_per_s"] = out["gflop"] / out["median_s"]
    return out


def run_case(
    factory: str,
    kwargs: dict | None = None,
    *,
    repeats: int = 5,
    warmup: int = 1,
    threads: int = 1,
    memory: bool = True,
    flops: bool = True,
    timeout: float = 1800.0,
    in_process: bool = False,
    malloc: str = "glibc",
) -> dict:
    """Run one case in a fresh subprocess; returns median_s, times_s, peak_mb, gflop,
    gflops_per_s (or ``error`` if the child failed, e.g. out of memory or timeout).
    ``in_process=True`` (smoke tests) runs it here, without the memory measurement.
    ``malloc``: a key of MALLOC_POLICIES, the child's allocator policy."""
    spec = dict(
        factory=factory,
        kwargs=kwargs or {},
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        memory=memory and not in_process,
        flops=flops,
    )
    if in_process:
        return _child(spec)
    cmd = [sys.executable, "-m", "attnconv.bench.common", json.dumps(spec)]
    try:
        env = {**os.environ, **MALLOC_POLICIES[malloc]}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines() or [f"exit code {proc.returncode}"]
        return {"error": lines[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _matmul_step(n: int = 1024):
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return lambda: a @ b


def matmul_peak_gflops(
    n: int = 1024,
    threads: int = 1,
    repeats: int = 7,
    in_process: bool = False,
    malloc: str = "glibc",
) -> float:
    """Measured fp32 matmul GFLOP/s (n x n @ n x n, median of repeats) in a fresh subprocess."""
    res = run_case(
        "attnconv.bench.common:_matmul_step",
        {"n": n},
        repeats=repeats,
        warmup=2,
        threads=threads,
        memory=False,
        flops=False,
        in_process=in_process,
        malloc=malloc,
    )
    if "error" in res:
        raise RuntimeError(f"matmul peak measurement failed: {res['error']}")
    return 2 * n**3 / res["median_s"] / 1e9


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """columns: (key, header, format spec); missing values print as '-'."""
    out = ["| " + " | ".join(h for _, h, _ in columns) + " |"]
    out.append("|" + "|".join("---" for _ in columns) + "|")
    for r in rows:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cells.append("-" if v is None else format(v, fmt) if fmt else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# the instruction-set flags that change what the CPU kernels and bf16 can do
FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def provenance() -> dict:
    """Where and when a run measured: the CPU (model name with x86's family and model numbers)
    and its flags that matter, the torch version and the day (UTC)."""
    import datetime

    import torch

    from attnconv.cpuinfo import cpu_flags, cpu_name

    flags = cpu_flags()
    return {
        "machine": cpu_name(),
        "cpu_flags": None if flags is None else [f for f in FLAGS_THAT_MATTER if f in flags],
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
    }


def provenance_line(payload: dict) -> str:
    """The Markdown line that names a results file's machine (the GPU first where the suite
    ran on one), flags, torch version, date and command."""
    flags = payload.get("cpu_flags")
    cpu = payload["machine"] + ("" if flags is None else f" ({', '.join(flags) or 'no AVX2'})")
    device = payload.get("device")
    where = f"{device} (host: {cpu})" if device and device != "cpu" else cpu
    by = f", by `{payload['command']}`." if payload.get("command") else "."
    return f"Measured on {where}, torch {payload['torch']}, {payload['date']}{by}"


def write_results(name: str, payload: dict, markdown: str, out_dir: Path) -> Path:
    """Write <out_dir>/<name>.json and <name>.md (out_dir from output_dir); returns the JSON
    path. Both name the machine, its flags, the torch version and the date (``provenance``;
    a key the suite set itself is kept), and the command where the suite gave one."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**provenance(), **payload}
    if markdown:
        markdown = markdown.rstrip("\n") + "\n\n" + provenance_line(payload)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown + "\n")
    return out_dir / f"{name}.json"


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
