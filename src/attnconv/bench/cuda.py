"""The anchors on a CUDA GPU: attnconv's layers against what a user would run there instead.

`attnconv bench --suite cuda [--quick] [--repeats N] [-- --only content|local|models]
[--mode both|train|infer] [--inner N]]`

Content attention (quadratic / learned-relative + content, 9 heads, 16x16 to 64x64 tokens;
train = fwd+bwd or inference; fp32 or bf16 autocast): attnconv (the plan's kernels: compiled
FlexAttention with the row/column logits as a score_mod, flex.py), attnconv's Triton kernel
(backend="triton", kernels/triton_axis.py, when triton is installed), the dense anchor (SDPA
with the (B, Nh, T, T) logits as a float ``attn_mask``, anchors.DenseSDPA) and
FlashAttention-backed SDPA on the same q, k, v with NO positional term (what content-only
attention of equal shapes costs: a floor, not an equal); "SDPA fold" is the layer's CPU
kernels on the GPU (backend="fold": the exact fold through SDPA in training, the shared bias in
inference).
SASA local attention (k = 7, relative row/column embeddings, 8 heads): attnconv (the plan's
choice: FlexAttention with a block mask, or the window function in float32 from 56x56), our
window function (kernels/window.py, backend="window"), the Triton window kernel
(kernels/triton_local.py, backend="triton", when triton is installed), the unfold reference and
NATTEN's fused kernels when the natten package is installed.
The paper models' full training step (``--only models``): bench/cuda_models.py.

Time: CUDA events around --inner calls, median of --repeats, after warm-up calls (compilation
happens there). Memory: peak allocated bytes above the inputs during one call. Precision:
relative max output error against the float64 reference on the GPU (B = 1).

``--device cpu --quick``: a dry run of the whole suite on the CPU (the Triton kernels through
``TRITON_INTERPRET=1``, wall-clock time, no memory): its code checked before a GPU's scarce
minutes are spent on it; the figures mean nothing.
"""

from __future__ import annotations

import copy
import platform

import torch
import torch.nn.functional as F

from attnconv.bench.anchors import DenseSDPA, model_step
from attnconv.bench.common import (
    count,
    markdown_table,
    output_dir,
    suite_command,
    suite_parser,
    write_results,
)
from attnconv.bench.cuda_timing import device_name, time_and_memory
from attnconv.layers.kernels import triton_axis
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

HEADS, LOCAL_HEADS, KERNEL = 9, 8, 7


class ContentOnlySDPA(torch.nn.Module):
    """The floor: the layer's q, k, v through SDPA with no positional term (FlashAttention in
    bf16)."""

    def __init__(self, layer: MultiHeadSelfAttention2d):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay, (b, _, h, w) = self.layer, x.shape
        q, k, v = lay.project(x)  # (B, Nh, T, dk), (B, Nh, T, Dv)
        y = F.scaled_dot_product_attention(q, k, v.to(q.dtype), scale=lay.scale)
        y = lay.out_proj(y.transpose(1, 2).reshape(b, h * w, -1))
        return y.transpose(1, 2).reshape(b, -1, h, w)


class Natten(torch.nn.Module):
    """NATTEN's fused neighborhood attention on the local layer's own q, k, v (its relative
    positional bias is a (heads, 2k-1, 2k-1) table, not SASA's row/column embeddings: the same
    work, not the same function)."""

    def __init__(self, layer: LocalSelfAttention2d):
        super().__init__()
        import natten

        self.layer, self.natten = layer, natten
        self.rpb = torch.nn.Parameter(torch.zeros(LOCAL_HEADS, 2 * KERNEL - 1, 2 * KERNEL - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay = self.layer
        q, k, v = lay.query(x), lay.key(x), lay.value(x)  # (B, C, H, W)
        b, c, h, w = q.shape

        def heads(t):  # (B, H, W, nh, d)
            return t.view(b, LOCAL_HEADS, c // LOCAL_HEADS, h, w).permute(0, 3, 4, 1, 2)

        y = self.natten.na2d(heads(q), heads(k), heads(v), kernel_size=KERNEL)
        return y.permute(0, 3, 4, 1, 2).reshape(b, c, h, w)


def content_cases(quick: bool) -> list[dict]:
    """In the order a lent GPU's minutes should go (a run cut short keeps the first): bf16
    training, fp32 training, bf16 then fp32 inference; 32x32 and 64x64 (the 1.5x goals of
    gpu_goals.py) before 16x16; both encodings at each."""
    shapes = [(2, 18, 8)] if quick else [(32, 144, 32), (8, 144, 64), (32, 432, 32), (64, 144, 16)]
    return [
        dict(group="content", positional=p, train=t, dtype=d, b=b, c=c, hw=hw)
        for t, d in ((True, "bf16"), (True, "fp32"), (False, "bf16"), (False, "fp32"))
        for (b, c, hw) in shapes
        for p in ("quadratic", "relative_learned")
    ]


def local_cases(quick: bool) -> list[dict]:
    shapes = [(2, 16, 8)] if quick else [(32, 64, 56), (32, 128, 28), (32, 256, 14)]
    return [
        dict(group="local", b=b, c=c, hw=hw, dtype=d, train=t)
        for (b, c, hw) in shapes
        for d in ("fp32", "bf16")
        for t in (True, False)
    ]


def models_for(case: dict, device: str = "cuda") -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    c, hw = case["c"], case["hw"]
    if case["group"] == "content":
        layer = MultiHeadSelfAttention2d(
            c, c, HEADS, positional=case["positional"], content=True, max_size=max(64, hw)
        )
        fold = copy.deepcopy(layer)
        fold.backend = "fold"  # the CPU kernels: exact fold (train), shared bias (infer)
        models = {
            "attnconv": layer,
            "dense": DenseSDPA(layer),
            "flash": ContentOnlySDPA(layer),
            "fold": fold,
        }
        if triton_axis.INSTALLED:
            models["triton"] = copy.deepcopy(layer)
            models["triton"].backend = "triton"
    else:
        layer = LocalSelfAttention2d(c, c, LOCAL_HEADS, KERNEL)
        window, unfold = copy.deepcopy(layer), copy.deepcopy(layer)
        window.backend, unfold.backend = "window", "reference"
        models = {"attnconv": layer, "window": window, "unfold": unfold}
        if triton_axis.INSTALLED:  # the Triton window kernel (triton_local.py)
            models["triton"] = copy.deepcopy(layer)
            models["triton"].backend = "triton"
        if device == "cuda":
            try:
                models["natten"] = Natten(layer)
            except ImportError:
                pass
    return {k: m.to(device) for k, m in models.items()}


def make_step(model: torch.nn.Module, case: dict, device: str = "cuda"):
    b, c, hw = case["b"], case["c"], case["hw"]
    x = torch.randn(b, c, hw, hw, device=device, requires_grad=case["train"])
    return model_step(model, x, case["train"], case["dtype"] == "bf16")


def precision(case: dict, models: dict, device: str = "cuda") -> dict[str, float]:
    """Relative max output error of each model vs the float64 reference, B = 1."""
    layer = models["attnconv"]
    x = torch.randn(1, case["c"], case["hw"], case["hw"], device=device)
    ref = copy.deepcopy(layer).double()
    ref.backend = "reference"
    out = {}
    with torch.no_grad():
        y64 = ref(x.double())
        for name in ("attnconv", "triton", "dense", "fold", "window"):
            if name in models:
                bf16 = case["dtype"] == "bf16"
                with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                    y = models[name](x).double()
                out[name] = ((y - y64).abs().max() / y64.abs().max()).item()
    return out


def run(cases: list[dict], repeats: int, inner: int, save=None, device="cuda") -> list[dict]:
    """Every case in turn; ``save(rows)`` after each (a long run keeps what it measured)."""
    torch._dynamo.config.cache_size_limit = 256  # one compiled Flex kernel per shape and dtype
    rows = []
    for case in cases:
        models = models_for(case, device)
        steps = {k: make_step(m, case, device) for k, m in models.items()}
        res = time_and_memory(steps, repeats, inner, device)
        row = dict(case, name=_name(case))
        for k, v in res.items():
            row.update({f"{k}_{m}": v[m] for m in ("ms", "mb", "error") if m in v})
        for k in res:
            if k != "attnconv" and "ms" in res[k] and "ms" in res["attnconv"]:
                row[f"ratio_{k}"] = res[k]["ms"] / res["attnconv"]["ms"]
            if k != "attnconv" and case["train"] and "mb" in res[k] and "mb" in res["attnconv"]:
                row[f"mem_{k}"] = res["attnconv"]["mb"] / res[k]["mb"]
        if "ms" in res.get("triton", {}):  # the Triton kernel against the anchors
            for k in ("dense", "flash"):
                if "ms" in res.get(k, {}):
                    row[f"triton_over_{k}"] = res[k]["ms"] / res["triton"]["ms"]
            if "mb" in res.get("dense", {}) and res["dense"]["mb"] > 0:
                row["triton_mem_dense"] = res["triton"]["mb"] / res["dense"]["mb"]
        row.update({f"err_{k}": v for k, v in precision(case, models, device).items()})
        rows.append(row)
        times = [f"{k} {row[f'{k}_ms']:.3f} ms" for k in res if f"{k}_ms" in row]
        print(f"{row['name']:<54} " + "  ".join(times), flush=True)
        if save is not None:
            save(rows)
        del models
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _name(case: dict) -> str:
    mode = "train" if case["train"] else "infer"
    what = f"SASA local k{KERNEL}"
    if case["group"] == "content":
        what = f"{case['positional']}+content"
    return f"{what} {mode} {case['dtype']} B{case['b']} C{case['c']} {case['hw']}x{case['hw']}"


CONTENT_COLUMNS = [
    ("name", "case", ""),
    ("attnconv_ms", "ours ms", ".3f"),
    ("ratio_dense", "dense SDPA+bias / ours", ".2f"),
    ("ratio_flash", "SDPA no positional term / ours", ".2f"),
    ("ratio_fold", "SDPA fold / ours", ".2f"),
    ("mem_dense", "ours/dense memory", ".2f"),
    ("err_attnconv", "ours err vs f64", ".1e"),
    ("err_dense", "dense err vs f64", ".1e"),
    ("dense_error", "note", ""),
]
TRITON_COLUMNS = [
    ("name", "case", ""),
    ("triton_ms", "Triton ms", ".3f"),
    ("triton_over_dense", "dense SDPA+bias / Triton", ".2f"),
    ("triton_over_flash", "SDPA no positional term / Triton", ".2f"),
    ("triton_mem_dense", "Triton/dense memory", ".2f"),
    ("err_triton", "Triton err vs f64", ".1e"),
    ("triton_error", "note", ""),
]
LOCAL_COLUMNS = [
    ("name", "case", ""),
    ("attnconv_ms", "ours (the plan's kernel) ms", ".3f"),
    ("ratio_window", "window kernel / ours", ".2f"),
    ("ratio_unfold", "unfold / ours", ".2f"),
    ("ratio_natten", "NATTEN / ours", ".2f"),
    ("ratio_triton", "Triton window kernel / ours", ".2f"),
    ("mem_unfold", "ours/unfold memory", ".2f"),
    ("mem_triton", "ours/Triton memory", ".2f"),
    ("err_attnconv", "ours err vs f64", ".1e"),
    ("err_window", "window err vs f64", ".1e"),
    ("err_triton", "Triton err vs f64", ".1e"),
]


def render(rows: list[dict], header: str) -> str:
    """The markdown report of a run's rows (only the groups it ran)."""
    try:
        import natten  # noqa: F401

        has_natten = "NATTEN installed."
    except ImportError:
        has_natten = "NATTEN not installed (no NATTEN column)."
    md = [
        "# Layers on CUDA\n",
        f"{header} {has_natten} Ratios > 1: attnconv is faster. "
        "Memory: peak allocated MB during one training call, attnconv over the anchor.\n",
    ]
    for group, title, cols in (
        ("content", "Content attention", CONTENT_COLUMNS),
        ("content", "Content attention, the Triton kernel", TRITON_COLUMNS),
        ("local", "SASA local attention", LOCAL_COLUMNS),
    ):
        part = [
            r
            for r in rows
            if r["group"] == group and (cols is not TRITON_COLUMNS or "triton_ms" in r)
        ]
        if part:
            md += [f"## {title}\n", markdown_table(part, cols), ""]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    p = suite_parser("cuda", __doc__, ["content", "local", "models"])
    p.add_argument("--inner", type=count, default=10, help="calls per timed repeat (10)")
    p.add_argument(
        "--mode",
        choices=("both", "train", "infer"),
        default="both",
        help="the layer groups' cases: training, inference or both (both)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a dry run of the suite's code with --quick (no meaningful figures)",
    )
    args = p.parse_args(argv)
    if args.device == "cpu" and not args.quick:
        raise SystemExit("attnconv bench --suite cuda: --device cpu is a dry run; add --quick")
    out_dir = output_dir(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("attnconv bench --suite cuda: no CUDA device (torch.cuda.is_available())")
    repeats = args.repeats or (1 if args.quick else 5)
    if args.only == "models":
        from attnconv.bench import cuda_models

        return cuda_models.report(args, repeats, out_dir)
    cases = ([] if args.only == "local" else content_cases(args.quick)) + (
        [] if args.only == "content" else local_cases(args.quick)
    )
    if args.mode != "both":  # a lent GPU's minutes: training first, say
        cases = [c for c in cases if c["train"] == (args.mode == "train")]

    name = "cuda_layers" + (f"_{args.only}" if args.only else "")

    def save(rows):  # one partial file a group: a later group's run keeps an earlier one's
        partial = dict(rows=rows, device=device_name(args.device))
        write_results(f"{name}.partial", partial, "", out_dir)  # removed at the end

    inner = 1 if args.quick else args.inner
    rows = run(cases, repeats, inner, save, args.device)
    for suffix in (".json", ".md"):
        (out_dir / f"{name}.partial{suffix}").unlink(missing_ok=True)
    dev = device_name(args.device)
    header = (
        f"Command: `{suite_command('cuda', args)}`; {repeats} repeats of {inner} calls "
        f"(median ms per call), CUDA events. Device: {dev}; torch {torch.__version__}; "
        f"Python {platform.python_version()}."
    )
    if args.mode != "both":
        header += f" Only the {args.mode} cases (`--mode {args.mode}`)."
    md = render(rows, header)
    path = write_results(
        name,
        dict(
            command=suite_command("cuda", args),
            header=header,
            device=dev,
            torch=torch.__version__,
            repeats=repeats,
            inner=inner,
            rows=rows,
        ),
        md,
        out_dir,
    )
    print(md)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
