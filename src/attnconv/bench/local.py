"""SASA local attention benchmark: LocalSelfAttention2d fast (the plan's kernel, label "auto") vs
unfold reference.

`attnconv bench --suite local [--quick] [--threads N] [--repeats N] [--out-dir DIR] [--budget-gb G]`

1. Target: k=7, 32x32, C=64, 8 heads, B=32, forward+backward: the fast path against
   the unfold reference (time and peak memory) and an nn.Conv2d 3x3 of the same width.
2. Sweep of the spatial extent k = 3..11 at 32x32, B=8, C=64, 8 heads (fast vs reference).
3. sasa_resnet26 (attention stem, 224x224, B=8) forward (eval, no_grad), fast vs reference, with
   the bottleneck baseline resnet26 beside it. A reference case estimated above --budget-gb is
   run at the largest batch that fits instead and labelled so (memory grows ~linearly in B).
Every case runs in a fresh subprocess (method in bench/common.py). Writes <out-dir>/local.json
and local.md (default ./attnconv-bench/; benchmarks/results/ only with --update-results).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import torch

from attnconv.bench.common import (
    TARGET_COLUMNS,
    markdown_table,
    output_dir,
    run_case,
    suite_command,
    suite_parser,
    write_results,
)

FACTORY = "attnconv.bench.local:make_step"


def make_step(
    kind: str,
    b: int,
    c: int = 64,
    h: int = 32,
    w: int = 32,
    heads: int = 8,
    k: int = 7,
    impl: str = "auto",
    model: str = "",
    seed: int = 0,
):
    """Build one case; returns step(): forward+backward for layers, forward for models."""
    torch.manual_seed(seed)
    backend = None if impl == "auto" else impl  # impl: the case's label
    if kind == "model":
        from attnconv.models import create_model

        net = (
            create_model(model, backend=backend)
            if model.startswith("sasa")
            else create_model(model)
        )
        net.eval()
        x = torch.randn(b, 3, h, w)

        def fwd():
            with torch.no_grad():
                net(x)

        return fwd
    if kind == "conv":
        layer = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
    else:
        from attnconv.layers.local import LocalSelfAttention2d

        layer = LocalSelfAttention2d(c, c, heads, k, backend=backend)
    x = torch.randn(b, c, h, w, requires_grad=True)

    def step():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()

    return step


def alloc_peak_mb(**kw) -> float:
    """Peak of the memory PyTorch's CPU allocator hands out during one step, above what is live
    before it (profiler memory timeline: tensors only, no malloc fragmentation or lazy library
    state, unlike the RSS measure). Run in this process, single-threaded."""
    import tempfile
    import warnings

    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    step = make_step(**kw)
    step()  # warm-up: lazily created state is not part of the step's peak
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline: deprecated
        prof.export_memory_timeline(f"{d}/t.raw.json", device="cpu")
        _, sizes = json.load(open(f"{d}/t.raw.json"))
    total = [sum(x) for x in sizes]
    return (max(total) - total[0]) / 2**20


def _alloc_peak_subprocess(kw: dict) -> float | None:
    """alloc_peak_mb in a fresh process: this one must stay small, because children inherit
    the parent's ru_maxrss across fork + exec (it would inflate the RSS peaks of later cases)."""
    code = "import json, sys; from attnconv.bench.local import alloc_peak_mb; "
    code += "print(alloc_peak_mb(**json.loads(sys.argv[1])))"
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(kw)], capture_output=True, text=True
    )
    try:
        return float(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


def ref_layer_gb(b: int, c: int, h: int, w: int, k: int) -> float:
    """Rough peak of the unfold reference, fwd+bwd: ~8 (B, C, k^2, H, W) float32 tensors."""
    return 8 * b * c * k * k * h * w * 4 / 2**30


def ref_model_gb(b: int, size: int) -> float:
    """Rough forward peak of the unfold reference sasa_resnet26: the attention stem's 4 value
    maps (64 channels) unfolded over its 4x4 window ~3 times (unfold, window-major copy,
    mixture product), float32."""
    return 3 * b * 64 * 4 * 16 * size * size * 4 / 2**30


def cases(quick: bool, budget_gb: float) -> list[dict]:
    if quick:
        tb, ts, sweep, ks, mb, msize = 2, 8, 8, (3, 5), 1, 32
    else:
        tb, ts, sweep, ks, mb, msize = 32, 32, 32, (3, 5, 7, 9, 11), 8, 224
    out = []
    t = dict(b=tb, c=64, h=ts, w=ts, heads=8, k=7)
    for impl in ("auto", "reference"):
        out.append(
            dict(
                t,
                group="target",
                kind="local",
                impl=impl,
                name=f"local k=7 {ts}x{ts} C=64 8 heads B={tb} {impl}",
            )
        )
    out.append(dict(t, group="target", kind="conv", name=f"conv3x3 {ts}x{ts} C=64 B={tb}"))
    sb = 2 if quick else 8
    for k in ks:
        for impl in ("auto", "reference"):
            out.append(
                dict(
                    group=f"k{k}",
                    kind="local",
                    b=sb,
                    c=64,
                    h=sweep,
                    w=sweep,
                    heads=8,
                    k=k,
                    impl=impl,
                    name=f"local k={k} {sweep}x{sweep} B={sb} {impl}",
                )
            )
    rb = mb  # the reference's batch: the largest power-of-2 fraction of mb within the budget
    while rb > 1 and ref_model_gb(rb, msize) > budget_gb:
        rb //= 2
    runs = [("resnet26", "auto", mb), ("sasa_resnet26", "auto", mb)]
    if rb != mb:  # the fast path at the reference's batch too, for a like-for-like ratio
        runs.append(("sasa_resnet26", "auto", rb))
    runs.append(("sasa_resnet26", "reference", rb))
    for model, impl, b in runs:
        note = f" (B={mb} estimated over --budget-gb)" if impl == "reference" and b != mb else ""
        name = f"{model} forward {msize}x{msize} B={b} {impl}{note}"
        out.append(
            dict(
                group="model",
                kind="model",
                model=model,
                b=b,
                h=msize,
                w=msize,
                impl=impl,
                name=name,
            )
        )
    return out


def _get(rows, group, key, needle):
    for r in rows:
        if r.get("group") == group and needle in r["name"] and key in r:
            return r[key]
    return None


def check_targets(rows: list[dict]) -> list[dict]:
    t = []

    def add(what, num, den, need):
        v = num / den if num is not None and den else None
        t.append(dict(target=what, measured=v, required=need, met=None if v is None else v >= need))

    add(
        "k=7 32x32 B=32: reference / fast fwd+bwd time",
        _get(rows, "target", "median_s", "reference"),
        _get(rows, "target", "median_s", "auto"),
        3.0,
    )
    add(
        "k=7 32x32 B=32: reference / fast peak memory",
        _get(rows, "target", "peak_mb", "reference"),
        _get(rows, "target", "peak_mb", "auto"),
        5.0,
    )
    add(
        "same, allocator peak (profiler memory timeline)",
        _get(rows, "target", "alloc_mb", "reference"),
        _get(rows, "target", "alloc_mb", "auto"),
        5.0,
    )
    return t


def main(argv: list[str] | None = None) -> int:
    args = suite_parser("local", __doc__, ["target", "sweep", "model"]).parse_args(argv)
    out_dir = output_dir(args)  # checked before any case runs
    repeats = args.repeats or (1 if args.quick else 3)

    rows = []
    for case in cases(args.quick, args.budget_gb):
        g = case["group"]
        if args.only and not (g == args.only or (args.only == "sweep" and g.startswith("k"))):
            continue
        kw = {k: v for k, v in case.items() if k not in ("group", "name")}
        row = dict(case)
        est = (
            ref_layer_gb(case["b"], case["c"], case["h"], case["w"], case["k"])
            if (case["kind"] == "local" and case["impl"] == "reference")
            else 0.0
        )
        if est > args.budget_gb:
            row["error"] = f"skipped: reference needs ~{est:.0f} GB > budget {args.budget_gb} GB"
        else:
            reps = 1 if case["kind"] == "model" and not args.quick else repeats
            row.update(
                run_case(
                    FACTORY,
                    kw,
                    repeats=reps,
                    threads=args.threads,
                    flops=False,
                    in_process=args.quick,
                    malloc=args.malloc,
                )
            )
        if g == "target" and case["kind"] == "local" and not args.quick and "error" not in row:
            row["alloc_mb"] = _alloc_peak_subprocess(kw)
        rows.append(row)
        print(
            f"{row['name']:<62} "
            + (
                f"{row['median_s']:.4f} s  {row.get('peak_mb', 0):.0f} MB"
                if "median_s" in row
                else row["error"]
            ),
            flush=True,
        )

    conv = _get(rows, "target", "median_s", "conv3x3")
    fast = _get(rows, "target", "median_s", "auto")
    for r in rows:
        if conv and "median_s" in r and r["group"] == "target":
            r["x_conv"] = r["median_s"] / conv
    cols = [
        ("name", "case", ""),
        ("median_s", "time s", ".4f"),
        ("peak_mb", "peak MB", ".0f"),
        ("alloc_mb", "alloc peak MB", ".0f"),
        ("x_conv", "time / conv3x3", ".1f"),
        ("error", "note", ""),
    ]
    targets = check_targets(rows) if not args.quick and args.only in (None, "target") else []
    cmd = suite_command("local", args)
    md = [
        f"# Local (SASA) attention benchmark\n\nCommand: `{cmd} --threads {args.threads}`; "
        f"{repeats} timed repeat(s) per layer case (median; model forwards: 1 after a warmup), "
        "each case in a fresh subprocess.",
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{args.threads} thread(s). Layer cases are forward+backward; model cases are "
        "eval-mode forwards under no_grad.",
        "Peak MB = extra resident memory of one step above the process after setup "
        "(ru_maxrss). Alloc peak MB (target layer cases) = peak of the tensors PyTorch's CPU "
        "allocator holds during one step above those live before it (profiler memory timeline). "
        "The machine is shared with other jobs: compare ratios within this run.\n",
    ]
    if targets:
        md += ["## Targets\n", markdown_table(targets, TARGET_COLUMNS), ""]
    if fast and conv:
        md += [
            f"Fast local attention (k=7) / Conv2d 3x3 time at the target size: "
            f"{fast / conv:.1f}x.\n"
        ]
    md += ["## All cases\n", markdown_table(rows, cols)]
    payload = dict(
        command=cmd,
        threads=args.threads,
        repeats=repeats,
        malloc=args.malloc,
        torch=torch.__version__,
        rows=rows,
        targets=targets,
    )
    path = write_results("local", payload, "\n".join(md), out_dir)
    if targets:
        print(markdown_table(targets, TARGET_COLUMNS))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
