"""Training speed of the paper's models against the reference code's algorithm: Cordonnier et
al. 2020, Table 1 (sa_quadratic, sa_learned, sa_learned_content) as users train them.

`attnconv bench --suite models [--quick] [--threads N] [--repeats N] [--out-dir DIR]
[-- --scale paper|cpu|both --models M [M ...] --batch-paper B [B ...] --batch-cpu B [B ...]
--docs --report]`

Per model, at two scales: ``paper`` (the models' defaults: hidden 400, feed-forward 512, 16x16
tokens, 6 layers, 9 heads) and ``cpu`` (configs/experiments/_sa_small.yaml: hidden 64,
feed-forward 128), one training step = forward, cross-entropy, backward, SGD step (momentum
0.9) with the paper's dropout (0.1 on the attention probabilities and on the hidden states; one
attention mask per step shared by the batch for the position-only models, as the reference
draws it, a mask per image with content), three ways:

- ``reference``: the reference code's algorithm (bench/reference_algo.py: ``BertImage``
  re-stated, dense (Nh, T, T) probabilities, every head over the raw input, Linear(Nh*D, D),
  BERT post-LN), holding the attnconv model's own weights through ``reference_port`` and
  checked equal to it (dropout off) before anything is timed; float32, as the reference trains;
- ``attnconv`` in float32 and under bfloat16 autocast (``--compile``: also float32 under
  ``torch.compile``, its first step's time reported as the compile cost).

Method: each group (a scale at one batch; ``--batch-paper 8 16``: "paper B8", "paper B16") is
built in one fresh subprocess (one thread by default); after a warm-up step each, its cases run
round-robin, ``--repeats`` rounds (default 5): every ratio compares steps under the same load;
img/s from the median step. ``x reference`` = img/s / the reference's float32 img/s. FLOPs: one
float32 step under FlopCounterMode (matmul/conv/attention kernels, executed by that path) /
batch; % of GEMM peak = achieved GFLOP/s / a 1024^3 matmul's GFLOP/s in the same precision and
rounds (the step's physical limit). Peak memory: the RSS a first training step adds to the
built model, in a fresh subprocess each. Writes <out-dir>/models_throughput.{json,md}
(benchmarks/results/); ``--docs`` also replaces the models-throughput block of the benchmarks
page.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnconv.bench.common import (
    MALLOC_POLICIES,
    count,
    count_flops,
    markdown_table,
    output_dir,
    run_case,
    suite_command,
    suite_parser,
)
from attnconv.bench.models_report import NAME, PEAK_N, TARGET_COLUMNS, save
from attnconv.cpuinfo import cpu_name
from attnconv.device import flush_subnormals

SA_MODELS = ("sa_quadratic", "sa_learned", "sa_learned_content")
MODELS = (*SA_MODELS, "resnet18_cifar")  # ResNet18: attnconv rows only (no reference)
# the CPU experiment's geometry (configs/experiments/_sa_small.yaml and table1_resnet18.yaml;
# a test keeps them equal)
CPU_SA = {"hidden_size": 64, "num_layers": 6, "num_heads": 9, "ff_size": 128, "downsample": 2}
CPU_RESNET = {"widths": [16, 32, 64, 128]}
QUICK_SA = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "ff_size": 16, "downsample": 4}
QUICK_RESNET = {"widths": [4, 4, 4, 4]}
P_DROP = 0.1  # the paper's attention and hidden dropout
TARGETS = {"fp32": 1.5, "bf16": 10.0, "memory": 0.5, "pct_peak": 60.0}


def model_kwargs(model: str, scale: str) -> dict:
    """The model's constructor options at a scale ("paper" = its defaults)."""
    resnet = model.startswith("resnet")
    table = {"paper": ({}, {}), "cpu": (CPU_RESNET, CPU_SA), "quick": (QUICK_RESNET, QUICK_SA)}
    return dict(table[scale][0 if resnet else 1])


def variants(model: str, compile: bool = False) -> list[tuple[str, bool, bool]]:
    """(impl, bf16, compiled) cases of a model."""
    out = [("attnconv", False, False), ("attnconv", True, False)]
    out += [("attnconv", False, True)] if compile else []
    return out if model.startswith("resnet") else [("reference", False, False), *out]


def build(model: str, scale: str, impl: str = "attnconv"):
    """The model at a scale with the paper's dropout, or the reference re-statement holding its
    weights (checked equal to it)."""
    from attnconv.bench.reference_algo import ReferenceBertImage, check_equal
    from attnconv.models import create_model

    torch.manual_seed(0)
    kw = model_kwargs(model, scale)
    if not model.startswith("resnet"):
        mask = "sample" if model == "sa_learned_content" else "batch"
        kw.update(attn_dropout=P_DROP, dropout=P_DROP, attn_dropout_mask=mask)
    net = create_model(model, num_classes=10, **kw).train()
    if impl == "reference":
        ref = ReferenceBertImage(net).train()
        check_equal(net, ref)
        return ref
    return net


def make_step(
    model: str,
    scale: str,
    batch: int,
    impl: str = "attnconv",
    bf16: bool = False,
    compiled: bool = False,
):
    """One case: returns step(), a full training step on a fixed random batch."""
    net = build(model, scale, impl)
    return training_step(torch.compile(net) if compiled else net, batch, bf16)


def training_step(net, batch: int, bf16: bool, device: str = "cpu"):
    """step(): forward (bf16 autocast if ``bf16``), cross-entropy, backward and an SGD step
    (momentum 0.9) of ``net`` on a fixed random batch of 32x32 images on ``device``."""
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    x, y = x.to(device), y.to(device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = net(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def gemm(dtype: torch.dtype, n: int, device: str = "cpu"):
    """A call of an n x n x n matmul in ``dtype`` on ``device``: what measures the GEMM peak."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in "ab")
    return lambda: a @ b


def cases(scale: str, models: list[str], batch: int, compile: bool = False) -> list[dict]:
    return [
        dict(model=m, scale=scale, batch=batch, impl=impl, bf16=bf16, compiled=c)
        for m in models
        for impl, bf16, c in variants(m, compile)
    ]


def run_scale(specs: list[dict], repeats: int, threads: int) -> dict:
    """In this process: build every case, warm up, count FLOPs, time ``repeats`` rounds; with
    subnormals flushed, as a training runs (both codes: benchmarks/results/denormal_ab.md has
    them kept too)."""
    torch.set_num_threads(threads)
    flush_subnormals(True)
    steps = [make_step(**s) for s in specs]
    peaks = {"fp32": gemm(torch.float32, PEAK_N), "bf16": gemm(torch.bfloat16, PEAK_N)}
    flops, first = {}, {}
    for i, (s, step) in enumerate(zip(specs, steps)):  # warm-up (compiles), FLOPs of eager fp32
        key = (s["model"], s["impl"])  # bf16 and compiled steps execute the same matmuls
        t0 = time.perf_counter()
        if key not in flops:
            flops[key] = count_flops(step)
        else:
            step()
        first[i] = time.perf_counter() - t0
    for g in peaks.values():
        g()
    times: list[list[float]] = [[] for _ in specs]
    peak_times: dict[str, list[float]] = {k: [] for k in peaks}
    for _ in range(repeats):  # round-robin: every case once per round
        for i, step in enumerate(steps):
            t0 = time.perf_counter()
            step()
            times[i].append(time.perf_counter() - t0)
        for k, g in peaks.items():
            t0 = time.perf_counter()
            for _ in range(3):
                g()
            peak_times[k].append((time.perf_counter() - t0) / 3)
    rows = []
    for i, (s, t) in enumerate(zip(specs, times)):
        med = statistics.median(t)
        gflop = flops[(s["model"], s["impl"])] / 1e9
        rows.append(
            {
                **s,
                "times_s": t,
                "median_s": med,
                "img_s": s["batch"] / med,
                "gflop_img": gflop / s["batch"],
                "gflops_s": gflop / med,
                "compile_s": first[i] - med if s.get("compiled") else None,
            }
        )
    peak = {k: 2 * PEAK_N**3 / statistics.median(v) / 1e9 for k, v in peak_times.items()}
    return {"rows": rows, "peak_gflops": peak}


def run_scale_subprocess(specs: list[dict], repeats: int, threads: int, malloc: str) -> dict:
    arg = json.dumps({"specs": specs, "repeats": repeats, "threads": threads})
    env = {**os.environ, **MALLOC_POLICIES[malloc]}
    cmd = [sys.executable, "-m", "attnconv.bench.models", "--child", arg]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines() or [f"exit code {proc.returncode}"]
        raise RuntimeError(f"models benchmark child failed: {last[-1][:300]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_memory(rows: list[dict], threads: int, malloc: str) -> None:
    """Peak RSS a first training step adds, each case in a fresh subprocess (row["peak_mb"])."""
    for r in rows:
        kw = {k: r[k] for k in ("model", "scale", "batch", "impl", "bf16", "compiled")}
        res = run_case(
            "attnconv.bench.models:make_step",
            kw,
            repeats=1,
            warmup=0,
            threads=threads,
            flops=False,
            malloc=malloc,
        )
        r["peak_mb"] = res.get("peak_mb")


def derive(rows: list[dict], peak: dict[str, float]) -> None:
    """Ratios within a scale: against the reference's float32 step of the same model."""
    ref = {r["model"]: r for r in rows if r["impl"] == "reference"}
    for r in rows:
        base = ref.get(r["model"])
        r["precision"] = "bf16" if r["bf16"] else "fp32"
        r["code"] = r["impl"] + (" (compiled)" if r.get("compiled") else "")
        r["pct_peak"] = 100 * r["gflops_s"] / peak[r["precision"]]
        r["x_reference"] = r["img_s"] / base["img_s"] if base else None
        # the physical limit: this step's own GEMM FLOPs at the measured matmul peak
        r["ceiling_img_s"] = peak[r["precision"]] / r["gflop_img"] if r["gflop_img"] else None
        r["ceiling_x_reference"] = (
            r["ceiling_img_s"] / base["img_s"] if base and r["ceiling_img_s"] else None
        )
        mem, bmem = r.get("peak_mb"), base.get("peak_mb") if base else None
        r["mem_x_reference"] = mem / bmem if mem and bmem else None


def targets(rows: list[dict], scale: str) -> list[dict]:
    """The issue's checks per SA model: float32 >= 1.5x and bf16 autocast >= 10x the reference's
    float32 step, float32 memory <= 0.5x, sa_quadratic >= 60% of the GEMM peak."""
    out = []
    for r in rows:
        if r["impl"] != "attnconv" or r["x_reference"] is None or r.get("compiled"):
            continue
        name = f"{scale} {r['model']} {r['precision']}"
        need = TARGETS[r["precision"]]
        out.append(
            dict(
                target=f"{name}: img/s / reference fp32",
                measured=r["x_reference"],
                required=f">= {need:g}",
                met=r["x_reference"] >= need,
                ceiling=r["ceiling_x_reference"],
            )
        )
        if not r["bf16"] and r["mem_x_reference"] is not None:
            m = r["mem_x_reference"]
            out.append(
                dict(
                    target=f"{name}: peak memory / reference",
                    measured=m,
                    required=f"<= {TARGETS['memory']:g}",
                    met=m <= TARGETS["memory"],
                )
            )
        if r["model"] == "sa_quadratic":
            v = r["pct_peak"]
            out.append(
                dict(
                    target=f"{name}: % of the GEMM peak",
                    measured=v,
                    required=f">= {TARGETS['pct_peak']:g}",
                    met=v >= TARGETS["pct_peak"],
                )
            )
    return out


def batch_list(args, scale: str) -> list[int]:
    """The batches a scale runs at: --batch-paper / --batch-cpu, else 16 / 64."""
    given = args.batch_paper if scale == "paper" else args.batch_cpu
    return given or [16 if scale == "paper" else 64]


def results_dir(args) -> Path:
    """Where this suite reads and writes its results: bench/common.py's ``output_dir`` (the
    committed benchmarks/results/ only with --update-results)."""
    return output_dir(args)


def main(argv: list[str] | None = None) -> int:
    p = suite_parser("models", __doc__.splitlines()[0], list(MODELS))
    p.add_argument(
        "--scale",
        choices=("paper", "cpu", "both"),
        default="both",
        help="paper configuration, CPU experiment scale, or both (both)",
    )
    p.add_argument("--batch-paper", type=count, nargs="+", help="batches at the paper scale (16)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time attnconv fp32 under torch.compile (reports the compile time)",
    )
    p.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory subprocesses (faster)"
    )
    p.add_argument("--batch-cpu", type=count, nargs="+", help="CPU-scale batches (64; quick 2)")
    p.add_argument("--models", nargs="+", choices=MODELS, help="several models (default: all)")
    p.add_argument(
        "--docs",
        action="store_true",
        help="replace the results block of the models benchmarks page",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="only re-render the saved <out-dir>/models_throughput.json (no timing)",
    )
    args = p.parse_args(argv)
    if args.docs and not args.update_results:
        raise ValueError(
            "--docs rewrites the source checkout's docs/benchmarks/models.md: add --update-results"
        )
    if args.report:
        src = results_dir(args) / f"{NAME}.json"
        if not src.exists():
            raise ValueError(f"--report: no results to re-render at {src}")
        payload, checks = json.loads(src.read_text()), []
        for scale, pk in payload["peak_gflops"].items():  # derived columns from the timings
            srows = [r for r in payload["rows"] if r.get("group", r["scale"]) == scale]
            derive(srows, pk)
            checks += targets(srows, scale)
        payload["targets"] = checks
        path = save(payload, results_dir(args), args.docs)
        print(f"re-rendered {path.with_suffix('.md')}")
        return 0
    repeats = args.repeats or (1 if args.quick else 5)
    models = [args.only] if args.only else args.models or list(SA_MODELS)
    scales = ["quick"] if args.quick else ["paper", "cpu"] if args.scale == "both" else [args.scale]
    rows, peaks, checks = [], {}, []
    for scale in scales:
        batches = (args.batch_cpu or [2]) if args.quick else batch_list(args, scale)
        for batch in batches:
            group = scale if len(batches) == 1 else f"{scale} B{batch}"
            specs = cases(scale, models, batch, args.compile)
            res = (
                run_scale(specs, repeats, args.threads)
                if args.quick
                else run_scale_subprocess(specs, repeats, args.threads, args.malloc)
            )
            for r in res["rows"]:
                r["group"] = group
            if not (args.quick or args.no_memory):
                measure_memory(res["rows"], args.threads, args.malloc)
            derive(res["rows"], res["peak_gflops"])
            rows += res["rows"]
            peaks[group] = res["peak_gflops"]
            checks += targets(res["rows"], group)
            for r in res["rows"]:
                x = f"{r['x_reference']:.2f}x ref" if r["x_reference"] else ""
                print(
                    f"{group:<9} {r['model']:<20} {r['impl']:<9} {r['precision']} "
                    f"{r['img_s']:8.1f} img/s {r['gflops_s']:7.1f} GFLOP/s {x}",
                    flush=True,
                )
    cmd = suite_command("models", args)
    extra = [f"--scale {args.scale}"] if args.scale != "both" else []
    extra += ["--models " + " ".join(args.models)] if args.models and not args.only else []
    extra += [f"--{k.replace('_', '-')}" for k in ("compile", "no_memory") if getattr(args, k)]
    extra += [
        f"--batch-{s} " + " ".join(map(str, getattr(args, f"batch_{s}")))
        for s in ("paper", "cpu")
        if getattr(args, f"batch_{s}")
    ]
    if extra:
        cmd += (" " if " -- " in cmd else " -- ") + " ".join(extra)
    payload = dict(
        command=cmd,
        threads=args.threads,
        repeats=repeats,
        torch=torch.__version__,
        machine=cpu_name(),
        malloc=args.malloc,
        peak_gflops=peaks,
        targets=checks,
        rows=rows,
    )
    path = save(payload, results_dir(args), args.docs)
    print(markdown_table(checks, TARGET_COLUMNS))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        spec = json.loads(sys.argv[2])
        print(json.dumps(run_scale(spec["specs"], spec["repeats"], spec["threads"])))
    else:
        raise SystemExit(main())
