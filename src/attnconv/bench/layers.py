"""Layer benchmark: MultiHeadSelfAttention2d, fast (the plan's kernel, case label "auto") vs
reference vs Conv2d 3x3.

`attnconv bench --suite layers [--quick] [--threads N] [--repeats N] [--out-dir DIR]`

1. Sweep: every positional encoding x content on/off, fast vs reference, and an nn.Conv2d 3x3 of
   the same width, at 16x16, 32x32, 64x64: forward+backward median time, peak memory, GFLOP/s.
2. Targets: quadratic position-only (B=32, C=144, 9 heads of 16) vs the reference
   path and vs the paper code's algorithm (dense T x T probabilities computed once, shared across
   the batch, one einsum with the values); a global quadratic layer on a 224x224 image; quadratic
   + content at 32x32 (B=32, 9 heads of 48), plus its attention kernel alone (fast: the fused
   SDPA call on the folded q/k/v; reference: the plain softmax(q k^T * scale + bias) v), whose
   ratio bounds the layer's: both paths add the same q/k/v/out projections.
Every case runs in a fresh subprocess (see common.py for the method). Reference cases whose
T x T tensors would exceed --budget-gb are skipped and reported as such.
Writes <out-dir>/layers.json and layers.md (default ./attnconv-bench/; the committed
benchmarks/results/ only with --update-results).
"""

from __future__ import annotations

import platform

import torch

from attnconv.bench.anchors import ANCHOR_COLUMNS, run_anchors
from attnconv.bench.common import (
    TARGET_COLUMNS,
    markdown_table,
    matmul_peak_gflops,
    output_dir,
    run_case,
    suite_command,
    suite_parser,
    write_results,
)
from attnconv.bench.layers_cases import (
    FACTORY,
    check_targets,
    ref_bytes,
    sweep_cases,
    target_cases,
)
from attnconv.layers.functional import scaled_dot_product_attention
from attnconv.layers.kernels.content import folded_qkv
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d


class PaperQuadraticAttention(torch.nn.Module):
    """The paper code's algorithm (epfml/attention-cnn, position-only Gaussian attention):
    probabilities (H, W, Nh, H, W) computed densely once per forward from the rank-5 relative
    encoding, shared across the batch, then one einsum with the values."""

    def __init__(self, layer: MultiHeadSelfAttention2d):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay, (b, _, h, w) = self.layer, x.shape
        nh, d = lay.num_heads, lay.head_dim
        probs = torch.softmax(lay.positional_encoding.dense_logits(h, w), dim=-1)  # (Nh, T, T)
        probs = probs.view(nh, h, w, h, w).permute(1, 2, 0, 3, 4)  # (H, W, Nh, H, W)
        v = lay.value_proj(x.permute(0, 2, 3, 1)).view(b, h, w, nh, d)  # (B, H, W, Nh, D)
        y = torch.einsum("ijhkl,bklhd->bijhd", probs, v).reshape(b, h, w, nh * d)
        return lay.out_proj(y).permute(0, 3, 1, 2)  # (B, Cout, H, W)


def make_step(
    kind: str,
    b: int,
    c: int,
    h: int,
    w: int,
    heads: int = 8,
    head_dim=None,
    positional: str = "none",
    content: bool = True,
    impl: str = "auto",
    value: str = "linear",
    seed: int = 0,
):
    """Build one case; returns step() = one forward + backward."""
    torch.manual_seed(seed)
    if kind == "conv":
        model = torch.nn.Conv2d(c, c, 3, padding=1)
    else:
        model = MultiHeadSelfAttention2d(
            c,
            c,
            heads,
            head_dim=head_dim,
            positional=positional,
            content=content,
            backend=None if impl == "auto" else impl,  # impl: the case's label
            value=value,
            max_size=max(64, h, w),
        )
        if kind == "paper":
            model = PaperQuadraticAttention(model)
    x = torch.randn(b, c, h, w, requires_grad=True)

    def step():
        x.grad = None
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    return step


def make_kernel_step(impl: str, b: int, c: int, h: int, w: int, heads: int = 9, seed: int = 0):
    """Only the attention kernel of a quadratic + content layer, fwd+bwd: the exact q/k/v (and,
    reference, positional bias) the layer's ``impl`` path feeds it, as leaf tensors."""
    torch.manual_seed(seed)
    backend = None if impl == "auto" else impl  # impl: the case's label
    lay = MultiHeadSelfAttention2d(
        c, c, heads, positional="quadratic", content=True, backend=backend
    )
    with torch.no_grad():
        x = torch.randn(b, c, h, w)
        q, k, v = lay.project(x)
        if impl == "auto":
            term = lay.positional_encoding.term(h, w, content=True)
            q, k, v = folded_qkv(q, k, v, term, lay.scale)
            bias, scale = None, 1.0
        else:
            q, k, bias = lay.dense(x)
            scale = lay.scale
    leaves = [
        t.contiguous().requires_grad_() for t in (q, k, v) + ((bias,) if bias is not None else ())
    ]

    def step():
        for t in leaves:
            t.grad = None
        scaled_dot_product_attention(
            *leaves[:3], bias=leaves[3] if len(leaves) > 3 else None, scale=scale, backend=backend
        ).sum().backward()

    return step


def main(argv: list[str] | None = None) -> int:
    args = suite_parser("layers", __doc__, ["sweep", "targets", "anchors"]).parse_args(argv)
    out_dir = output_dir(args)  # checked before any case runs
    repeats = args.repeats or (1 if args.quick else 3)

    anchors = []
    if args.only == "anchors":  # the issue-17 table alone (anchors.py): no sweep, no peak
        anchors = run_anchors(
            args.quick, args.repeats or (1 if args.quick else 5), args.threads, args.malloc
        )
        md = [
            f"# Content attention vs anchors\n\nCommand: `{suite_command('layers', args)} "
            f"--threads {args.threads}`\n",
            markdown_table(anchors, ANCHOR_COLUMNS),
        ]
        path = write_results(
            "layers_anchors",
            dict(command=suite_command("layers", args), threads=args.threads, rows=anchors),
            "\n".join(md),
            out_dir,
        )
        print(md[-1])
        print(f"wrote {path} and {path.with_suffix('.md')}")
        return 0
    peak = matmul_peak_gflops(
        256 if args.quick else 2048, args.threads, in_process=args.quick, malloc=args.malloc
    )
    print(f"fp32 matmul peak: {peak:.1f} GFLOP/s ({args.threads} thread(s))", flush=True)
    cases = []
    if args.only in (None, "sweep"):
        cases += sweep_cases(args.quick)
    if args.only in (None, "targets"):
        cases += target_cases(args.quick)
    rows: list[dict] = []
    for case in cases:
        kw = {k: v for k, v in case.items() if k not in ("group", "name", "factory")}
        row = dict(case)
        est = (
            ref_bytes(
                case["b"],
                case.get("heads", 1),
                case["h"] * case["w"],
                case.get("positional", "none"),
            )
            / 2**30
        )
        if case.get("impl") == "reference" and est > args.budget_gb:
            row["error"] = f"skipped: reference needs ~{est:.0f} GB > budget {args.budget_gb} GB"
        else:
            row.update(
                run_case(
                    case.get("factory", FACTORY),
                    kw,
                    repeats=repeats,
                    threads=args.threads,
                    in_process=args.quick,
                    malloc=args.malloc,
                )
            )
        rows.append(row)
        print(
            f"{row['name']:<60} "
            + (
                f"{row['median_s']:.4f} s  {row.get('peak_mb', 0):.0f} MB"
                if "median_s" in row
                else row["error"]
            ),
            flush=True,
        )

    # the machine is shared: measure the matmul peak again at the end and keep the best
    peak_end = matmul_peak_gflops(
        256 if args.quick else 2048, args.threads, in_process=args.quick, malloc=args.malloc
    )
    peak = max(peak, peak_end)
    print(f"fp32 matmul peak at the end: {peak_end:.1f} GFLOP/s; using {peak:.1f}", flush=True)
    for row in rows:
        if "gflops_per_s" in row:
            row["pct_peak"] = 100 * row["gflops_per_s"] / peak
    cols = [
        ("name", "case", ""),
        ("median_s", "fwd+bwd s", ".4f"),
        ("peak_mb", "peak MB", ".0f"),
        ("gflop", "GFLOP", ".2f"),
        ("gflops_per_s", "GFLOP/s", ".1f"),
        ("pct_peak", "% matmul peak", ".0f"),
        ("error", "note", ""),
    ]
    # the targets are defined at the sizes: not evaluated on --quick's tiny ones
    targets = check_targets(rows) if args.only in (None, "targets") and not args.quick else []
    cmd = suite_command("layers", args)
    md = [
        f"# Layer benchmark\n\nCommand: `{cmd} --threads {args.threads}`; "
        f"{repeats} timed repeat(s) per case (median), each case in a fresh subprocess.",
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"fp32 matmul peak {peak:.1f} GFLOP/s with {args.threads} thread(s) (best of a "
        "2048^3 matmul measured before and after the cases; cases that ran while the "
        "machine was less loaded, and oneDNN convolutions (Winograd), can exceed 100%).",
        "Peak MB = extra resident memory of one forward+backward above the process after "
        "setup (ru_maxrss). GFLOP = matmul/conv/attention FLOPs counted by FlopCounterMode.",
        f"Allocator policy: `{args.malloc}` (bench/common.py: `glibc` = the default a user "
        "gets, freed blocks return to the OS and are page-faulted in again; `retain` = freed "
        "memory is kept and reused, as jemalloc/tcmalloc do; its peak MB then counts that "
        "kept memory too: read memory from a `glibc` run).",
        "The machine is shared with other jobs: compare ratios within this run.\n",
    ]
    if targets:
        md += ["## Targets\n", markdown_table(targets, TARGET_COLUMNS), ""]
    md += ["## All cases\n", markdown_table(rows, cols)]
    payload = dict(
        command=cmd,
        threads=args.threads,
        repeats=repeats,
        malloc=args.malloc,
        matmul_peak_gflops=peak,
        torch=torch.__version__,
        rows=rows,
        targets=targets,
    )
    path = write_results("layers", payload, "\n".join(md), out_dir)
    if targets:
        print(markdown_table(targets, TARGET_COLUMNS))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
