"""Training throughput of the paper's models: Cordonnier et al. 2020, Table 1 (sa_quadratic,
sa_learned, sa_learned_content) and the CIFAR ResNet18 baseline.

`attnconv bench --suite models [--quick] [--threads N] [--repeats N] [--out-dir DIR]
[-- --scale paper|cpu|both --models M [M ...] --batch-paper B --batch-cpu B --readme
--report]`

Per model, at two scales: ``paper`` (the paper's configuration: the models' defaults, hidden
400, 16x16 tokens, 6 layers, 9 heads; ResNet18 at full width) and ``cpu`` (the CPU experiment
of configs/experiments/_sa_small.yaml: the same geometry at hidden 64, ResNet18 at a quarter
width), one training step = forward, cross-entropy, backward, SGD step (momentum 0.9), in
float32 and under bf16 autocast; attention models with attention dropout 0 and 0.1, 0.1 with one
(Nh, T, T) mask per step shared by the batch (the reference code's, ``batch``) and with a mask
per image (``sample``, content models always). Hidden dropout stays at the models' 0.1.

Method: every case of a scale is built in one fresh subprocess (one thread by default); after a
warm-up step each, the cases run round-robin, ``--repeats`` rounds (default 3), so every ratio
compares steps taken under the same machine load; the median step time gives img/s. FLOPs per
image: one float32 step under ``torch.utils.flop_counter.FlopCounterMode`` (forward + backward;
matmul/conv/attention kernels, elementwise ops not counted) divided by the batch, i.e. the FLOPs
each path executes (the separable path executes fewer than the dense one). Achieved GFLOP/s =
FLOPs / median time; the matmul peak (1024^3 GEMM, float32 and bfloat16) is timed in the same
rounds. Writes <out-dir>/models_throughput.{json,md} (default benchmarks/results/); ``--readme``
also replaces the block between the models-throughput markers of README.md.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnconv.bench.common import (
    MALLOC_POLICIES,
    RESULTS_DIR,
    count_flops,
    markdown_table,
    output_dir,
    suite_command,
    suite_parser,
    write_results,
)

NAME = "models_throughput"
README = RESULTS_DIR.parents[1] / "README.md"
BEGIN, END = "<!-- models-throughput:begin -->", "<!-- models-throughput:end -->"
MODELS = ("sa_quadratic", "sa_learned", "sa_learned_content", "resnet18_cifar")
# the CPU experiment's geometry (configs/experiments/_sa_small.yaml and table1_resnet18.yaml;
# a test keeps them equal)
CPU_SA = {"hidden_size": 64, "num_layers": 6, "num_heads": 9, "ff_size": 128, "downsample": 2}
CPU_RESNET = {"widths": [16, 32, 64, 128]}
QUICK_SA = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "ff_size": 16, "downsample": 4}
QUICK_RESNET = {"widths": [4, 4, 4, 4]}
P_DROP = 0.1  # the paper's attention dropout
PEAK_N = 1024


def model_kwargs(model: str, scale: str) -> dict:
    """The model's constructor options at a scale ("paper" = its defaults)."""
    resnet = model.startswith("resnet")
    table = {"paper": ({}, {}), "cpu": (CPU_RESNET, CPU_SA), "quick": (QUICK_RESNET, QUICK_SA)}
    return dict(table[scale][0 if resnet else 1])


def variants(model: str) -> list[tuple[float, str | None]]:
    """(attention dropout, mask) cases of a model: None for ResNet18 (no attention)."""
    if model.startswith("resnet"):
        return [(0.0, None)]
    if model == "sa_learned_content":  # content attention: a mask per image only
        return [(0.0, None), (P_DROP, "sample")]
    return [(0.0, None), (P_DROP, "batch"), (P_DROP, "sample")]


def make_step(model: str, scale: str, batch: int, p_drop: float, mask: str | None, bf16: bool):
    """One case: returns step(), a full training step on a fixed random batch."""
    from attnconv.models import create_model

    torch.manual_seed(0)
    kw = model_kwargs(model, scale)
    if not model.startswith("resnet"):
        kw.update(attn_dropout=p_drop, attn_dropout_mask=mask or "batch")
    net = create_model(model, num_classes=10, **kw).train()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _gemm(dtype: torch.dtype, n: int):
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return lambda: a @ b


def cases(scale: str, models: list[str], batch: int) -> list[dict]:
    out = []
    for m in models:
        for p, mask in variants(m):
            for bf16 in (False, True):
                out.append(dict(model=m, scale=scale, batch=batch, p_drop=p, mask=mask, bf16=bf16))
    return out


def run_scale(specs: list[dict], repeats: int, threads: int) -> dict:
    """In this process: build every case, warm up, count FLOPs, time ``repeats`` rounds."""
    torch.set_num_threads(threads)
    steps = [make_step(**s) for s in specs]
    peaks = {"fp32": _gemm(torch.float32, PEAK_N), "bf16": _gemm(torch.bfloat16, PEAK_N)}
    flops = {}
    for s, step in zip(specs, steps):  # warm-up; FLOPs of the float32 cases (bf16 does the same)
        key = (s["model"], s["p_drop"], s["mask"])
        if not s["bf16"] and key not in flops:
            flops[key] = count_flops(step)
        else:
            step()
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
    for s, t in zip(specs, times):
        med = statistics.median(t)
        gflop = flops[(s["model"], s["p_drop"], s["mask"])] / 1e9
        rows.append({**s, "times_s": t, "median_s": med, "img_s": s["batch"] / med,
                     "gflop_img": gflop / s["batch"], "gflops_s": gflop / med})  # fmt: skip
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


def _label(r: dict) -> str:
    return "0" if not r["p_drop"] else f"{r['p_drop']:g} ({r['mask']} mask)"


def derive(rows: list[dict], peak: dict[str, float]) -> None:
    """Ratios within a run: against the same model without attention dropout, bf16 / fp32."""
    by = {(r["model"], r["p_drop"], r["mask"], r["bf16"]): r for r in rows}
    for r in rows:
        base = by.get((r["model"], 0.0, None, r["bf16"]))
        fp32 = by.get((r["model"], r["p_drop"], r["mask"], False))
        r["x_no_dropout"] = r["img_s"] / base["img_s"] if base else None
        r["bf16_speedup"] = r["img_s"] / fp32["img_s"] if r["bf16"] and fp32 else None
        r["pct_peak"] = 100 * r["gflops_s"] / peak["bf16" if r["bf16"] else "fp32"]
        r["precision"], r["attn_dropout"] = ("bf16" if r["bf16"] else "fp32"), _label(r)


def targets(rows: list[dict], scale: str) -> list[dict]:
    """The issue's checks: dropout 0.1 (batch mask) >= 0.8x of dropout 0 for sa_quadratic; the
    paper model's achieved GFLOP/s within 1.5x of ResNet18's (dropout 0.1, batch mask)."""
    by = {(r["model"], r["p_drop"], r["mask"], r["bf16"]): r for r in rows}
    out = []
    for bf16 in (False, True):
        prec = "bf16" if bf16 else "fp32"
        drop = by.get(("sa_quadratic", P_DROP, "batch", bf16))
        if drop is not None:
            v = drop["x_no_dropout"]
            out.append(dict(target=f"{scale} {prec}: sa_quadratic img/s, attn dropout 0.1 "
                            "(batch mask) / dropout 0", measured=v, required=">= 0.8",
                            met=v >= 0.8))  # fmt: skip
        res = by.get(("resnet18_cifar", 0.0, None, bf16))
        if drop is not None and res is not None:
            v = res["gflops_s"] / drop["gflops_s"]
            out.append(dict(target=f"{scale} {prec}: ResNet18 GFLOP/s / sa_quadratic GFLOP/s "
                            "(dropout 0.1, batch mask)", measured=v, required="<= 1.5",
                            met=v <= 1.5))  # fmt: skip
    return out


TARGET_COLUMNS = [("target", "target", ""), ("measured", "measured", ".2f"),
                  ("required", "required", ""), ("met", "met", "")]  # fmt: skip
COLUMNS = [
    ("scale", "scale", ""), ("model", "model", ""), ("batch", "B", ""),
    ("precision", "precision", ""), ("attn_dropout", "attn dropout", ""),
    ("img_s", "img/s", ".3g"), ("x_no_dropout", "x dropout 0", ".2f"),
    ("bf16_speedup", "bf16 / fp32", ".2f"), ("gflop_img", "GFLOP/img (fwd+bwd)", ".2f"),
    ("gflops_s", "GFLOP/s", ".1f"), ("pct_peak", "% of GEMM peak", ".0f"),
]  # fmt: skip


def render(payload: dict) -> str:
    """The Markdown report (also the README block)."""
    peak = "; ".join(
        f"{s}: fp32 {p['fp32']:.0f}, bf16 {p['bf16']:.0f} GFLOP/s"
        for s, p in payload["peak_gflops"].items()
    )
    lines = [
        f"Regenerated by `{payload['command']}` ({payload['threads']} thread(s), "
        f"{payload['repeats']} interleaved rounds, medians; {payload['machine']}, torch "
        f"{payload['torch']}). Training step = forward + backward + SGD step on random "
        "32x32 images. Measured GEMM peak ({0}^3 matmul) in the same rounds: {1}.".format(
            PEAK_N, peak
        ),
        "",
        *summary(payload["rows"]),
        markdown_table(payload["targets"], TARGET_COLUMNS),
        "",
        markdown_table(payload["rows"], COLUMNS),
    ]
    return "\n".join(lines)


def summary(rows: list[dict]) -> list[str]:
    """What attention dropout costs sa_quadratic, and what each model costs per image, per scale
    (sentences from the rows, so they are regenerated with the table)."""
    out = []
    for scale in dict.fromkeys(r["scale"] for r in rows):
        by = {(r["model"], r["p_drop"], r["mask"], r["bf16"]): r
              for r in rows if r["scale"] == scale}  # fmt: skip
        cost = []
        for mask in ("batch", "sample"):
            ratios = [by[k]["x_no_dropout"] for bf in (False, True)
                      if (k := ("sa_quadratic", P_DROP, mask, bf)) in by]  # fmt: skip
            if len(ratios) == 2:
                cost.append(f"{mask} mask {ratios[0]:.2f}x / {ratios[1]:.2f}x")
        flops = [f"{m} {r['gflop_img']:.2f}" + (f" (dropout {p:g}, {mask} mask)" if p else "")
                 for (m, p, mask, bf), r in by.items() if not bf]  # fmt: skip
        line = f"- `{scale}`: "
        if cost:
            line += ("sa_quadratic with attention dropout 0.1 trains at "
                     + ", ".join(cost) + " the img/s of dropout 0 (fp32 / bf16). ")  # fmt: skip
        out.append(line + "GFLOP per image (fwd+bwd, executed): " + ", ".join(flops) + ".")
    return out + [""] if out else []


def replace_readme_block(text: str, path: Path = README, begin: str = BEGIN,
                         end: str = END) -> None:  # fmt: skip
    """Replace what lies between the ``begin`` and ``end`` markers of ``path`` with ``text``."""
    readme = path.read_text()
    if begin not in readme or end not in readme:
        raise ValueError(f"{path.name} has no {begin} ... {end} block to replace")
    head, rest = readme.split(begin, 1)
    path.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])


def results_dir(args) -> Path:
    """Where this suite reads and writes its results: bench/common.py's ``output_dir`` (the
    committed benchmarks/results/ only with --update-results)."""
    return output_dir(args)


def save(payload: dict, out_dir: Path, readme: bool) -> Path:
    """Write the results (the one place this suite writes files)."""
    text = render(payload)
    path = write_results(NAME, payload, text, out_dir)
    if readme:
        replace_readme_block(text)
    return path


def main(argv: list[str] | None = None) -> int:
    p = suite_parser("models", __doc__.splitlines()[0], list(MODELS))
    p.add_argument("--scale", choices=("paper", "cpu", "both"), default="both",
                   help="paper configuration, CPU experiment scale, or both (both)")  # fmt: skip
    p.add_argument("--batch-paper", type=int, default=16, help="batch at the paper scale (16)")
    p.add_argument("--batch-cpu", type=int, default=64, help="batch at the CPU scale (64)")
    p.add_argument("--models", nargs="+", choices=MODELS, help="several models (default: all)")
    p.add_argument("--readme", action="store_true", help="replace the README's results block")
    p.add_argument("--report", action="store_true",
                   help="only re-render the saved <out-dir>/models_throughput.json (no timing)")
    args = p.parse_args(argv)
    if args.readme and not args.update_results:
        raise ValueError("--readme rewrites the source checkout's README: add --update-results")
    if args.report:
        src = results_dir(args) / f"{NAME}.json"
        if not src.exists():
            raise ValueError(f"--report: no results to re-render at {src}")
        path = save(json.loads(src.read_text()), results_dir(args), args.readme)
        print(f"re-rendered {path.with_suffix('.md')}")
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    models = [args.only] if args.only else args.models or list(MODELS)
    scales = ["quick"] if args.quick else ["paper", "cpu"] if args.scale == "both" else [args.scale]
    rows, peaks, checks = [], {}, []
    for scale in scales:
        batch = 2 if args.quick else args.batch_paper if scale == "paper" else args.batch_cpu
        specs = cases(scale, models, batch)
        res = (run_scale(specs, repeats, args.threads) if args.quick else
               run_scale_subprocess(specs, repeats, args.threads, args.malloc))  # fmt: skip
        derive(res["rows"], res["peak_gflops"])
        rows += res["rows"]
        peaks[scale] = res["peak_gflops"]
        checks += targets(res["rows"], scale)
        for r in res["rows"]:
            print(f"{scale:<6} {r['model']:<20} {r['precision']} {r['attn_dropout']:<22} "
                  f"{r['img_s']:8.1f} img/s {r['gflops_s']:7.1f} GFLOP/s", flush=True)  # fmt: skip
    cmd = suite_command("models", args)
    extra = [f"--scale {args.scale}"] if args.scale != "both" else []
    extra += ["--models " + " ".join(args.models)] if args.models and not args.only else []
    extra += [f"--batch-{s} {getattr(args, f'batch_{s}')}" for s, d in (("paper", 16), ("cpu", 64))
              if getattr(args, f"batch_{s}") != d]  # fmt: skip
    if extra:
        cmd += (" " if " -- " in cmd else " -- ") + " ".join(extra)
    payload = dict(command=cmd, threads=args.threads, repeats=repeats, torch=torch.__version__,
                   machine=platform.processor() or platform.machine(), malloc=args.malloc,
                   peak_gflops=peaks, targets=checks, rows=rows)  # fmt: skip
    path = save(payload, results_dir(args), args.readme)
    print(markdown_table(checks, TARGET_COLUMNS))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        spec = json.loads(sys.argv[2])
        print(json.dumps(run_scale(spec["specs"], spec["repeats"], spec["threads"])))
    else:
        raise SystemExit(main())
