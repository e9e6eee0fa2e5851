"""The anchors: attnconv's content attention against what a user would write instead.

`attnconv bench --suite layers -- --only anchors [--quick] [--repeats N] [--threads N]`

For each case of the anchors' table (quadratic / learned-relative + content, train = fwd+bwd or
inference, fp32 or bf16 autocast, B x C x H x W, 9 heads):
- time: attnconv (the plan's kernels), attnconv without its query-blocked kernel ("fold": the exact
  fold into fused SDPA, or in inference the shared-bias kernel; blocked.py, mhsa2d.py), the
  dense anchor (``F.scaled_dot_product_attention`` with the positional logits as a float
  ``attn_mask``) and, for inference, compiled FlexAttention (the row/column logits as a
  score_mod, flex.py; no CPU backward), built in one process and timed interleaved
  (round-robin), median of --repeats (>= 5 unless --quick); ratio = anchor time / attnconv time
  (> 1: attnconv is faster);
- memory and FLOPs (train cases): peak extra RSS and matmul GFLOP (FlopCounterMode) of one
  fwd+bwd of attnconv and of the dense anchor (the plain equations' FLOPs), each in a fresh
  subprocess (common.run_case), all measured before the timings;
- precision: relative max error of the output against the float64 dense reference (B = 1, same
  C, H, W; under bf16 autocast for the bf16 cases), for attnconv and for the dense anchor.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F

from attnconv.bench.common import run_case
from attnconv.layers.kernels.flex import flex_axis_attention
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

HEADS = 9


def anchor_cases(quick: bool) -> list[dict]:
    """The issue's table: positional, train, dtype, b, c, hw."""
    q, r = "quadratic", "relative_learned"
    rows = [
        (q, True, "fp32", 32, 144, 32),
        (q, True, "fp32", 32, 432, 32),
        (q, True, "fp32", 2, 144, 64),
        (q, False, "fp32", 32, 144, 32),
        (q, False, "fp32", 32, 432, 32),
        (q, False, "fp32", 8, 144, 64),
        (q, False, "bf16", 32, 144, 32),
        (q, False, "bf16", 32, 432, 32),
        (r, True, "fp32", 32, 144, 32),
        (r, True, "fp32", 2, 144, 64),
        (r, False, "fp32", 32, 144, 32),
        (r, False, "fp32", 8, 144, 64),
    ]
    if quick:
        rows = [
            (q, True, "fp32", 2, 18, 8),
            (q, False, "bf16", 2, 18, 8),
            (r, False, "fp32", 2, 18, 8),
        ]
    keys = ("positional", "train", "dtype", "b", "c", "hw")
    return [dict(zip(keys, row)) for row in rows]


def dense_sdpa(layer: MultiHeadSelfAttention2d, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward as a user writes it: its own q, k, v and dense positional logits
    (B|1, Nh, T, T) as a float ``attn_mask`` of ``F.scaled_dot_product_attention``, with SDPA's
    dropout in training; x (B, Cin, H, W) -> (B, Cout, H, W)."""
    b, _, h, w = x.shape
    q, k, bias = layer.dense(x)
    v = layer.project(x)[2]  # (B, Nh, T, Dv)
    p = layer.dropout if layer.training else 0.0
    if q.shape[-1] == 0:  # position only: softmax(bias) @ v
        probs = torch.softmax(bias, -1, dtype=torch.promote_types(bias.dtype, torch.float32))
        y = F.dropout(probs, p).to(v.dtype) @ v
    else:
        y = F.scaled_dot_product_attention(
            q, k, v.to(q.dtype), attn_mask=bias.to(q.dtype), dropout_p=p, scale=layer.scale
        )
    y = layer.out_proj(y.transpose(1, 2).reshape(b, h * w, -1))
    return y.transpose(1, 2).reshape(b, -1, h, w)


class DenseSDPA(torch.nn.Module):
    """The anchor: ``dense_sdpa`` of the layer."""

    def __init__(self, layer: MultiHeadSelfAttention2d):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_sdpa(self.layer, x)


class CompiledFlex(torch.nn.Module):
    """The anchor: compiled FlexAttention with the row/column logits as a score_mod."""

    def __init__(self, layer: MultiHeadSelfAttention2d):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay, (b, _, h, w) = self.layer, x.shape
        q, k, v = lay.project(x)  # (B, Nh, T, dk), (B, Nh, T, Dv)
        q_axis = lay.positional_encoding.term(h, w, content=True).q_axis(q)
        y = flex_axis_attention(
            q, k, v.to(q.dtype), q_axis.to(q.dtype), h, w, lay.scale, compiled=True
        )
        y = lay.out_proj(y.transpose(1, 2).reshape(b, h * w, -1))
        return y.transpose(1, 2).reshape(b, -1, h, w)


def build(kind: str, positional: str, c: int, hw: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention2d(
        c, c, HEADS, positional=positional, content=True, max_size=max(64, hw)
    )
    if kind == "fold":  # attnconv's paths without the query-blocked kernel
        layer.backend = "fold"
        return layer
    return {"attnconv": layer, "dense": DenseSDPA(layer), "flex": CompiledFlex(layer)}[kind]


def model_step(model: torch.nn.Module, x: torch.Tensor, train: bool, bf16: bool):
    """One call of a model on x (on x's device): fwd+bwd (train) or an inference forward, under
    bfloat16 autocast if bf16."""

    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            if not train:
                with torch.no_grad():
                    return model(x)
            y = model(x)
        x.grad = None
        model.zero_grad(set_to_none=True)
        y.float().sum().backward()

    return step


def make_step(kind: str, positional: str, train: bool, dtype: str, b: int, c: int, hw: int):
    """One call of a case (run_case factory): fwd+bwd (train) or an inference forward."""
    x = torch.randn(b, c, hw, hw, requires_grad=train)
    return model_step(build(kind, positional, c, hw), x, train, dtype == "bf16")


def interleaved_medians(steps: dict, repeats: int) -> dict[str, float]:
    """Median wall time of each step, run round-robin after one warm-up call each."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def precision(positional: str, dtype: str, c: int, hw: int) -> dict[str, float]:
    """Relative max output error vs the float64 dense reference, B = 1."""
    layer = build("attnconv", positional, c, hw)
    x = torch.randn(1, c, hw, hw)
    ref64 = copy.deepcopy(layer).double()
    ref64.backend = "reference"
    with torch.no_grad():
        y64 = ref64(x.double())
        out = {}
        for name, model in (("attnconv", layer), ("dense", DenseSDPA(layer))):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                y = model(x).double()
            out[name] = ((y - y64).abs().max() / y64.abs().max()).item()
    return out


def run_anchors(quick: bool, repeats: int, threads: int, malloc: str = "glibc") -> list[dict]:
    torch.set_num_threads(threads)
    # memory first, from a still-small process: a child's ru_maxrss starts from its parent's
    # high-water mark, which the in-process timings below would raise
    memory: dict[int, dict] = {}
    for i, case in enumerate(anchor_cases(quick)):
        if case["train"] and not quick:
            memory[i] = {}
            for k in ("attnconv", "dense"):
                r = run_case(
                    "attnconv.bench.anchors:make_step",
                    dict(case, kind=k),
                    repeats=1,
                    threads=threads,
                    flops=True,
                    malloc=malloc,
                )
                memory[i].update({f"{k}_mb": r.get("peak_mb"), f"{k}_gflop": r.get("gflop")})
    rows = []
    for i, case in enumerate(anchor_cases(quick)):
        kinds = ["attnconv", "fold", "dense"] + ([] if case["train"] else ["flex"])
        steps = {k: make_step(k, **case) for k in kinds}
        med = interleaved_medians(steps, repeats)
        row = dict(case, name=_name(case), **{f"{k}_s": v for k, v in med.items()})
        row["ratio_dense"] = med["dense"] / med["attnconv"]
        row["ratio_fold"] = med["fold"] / med["attnconv"]
        if "flex" in med:
            row["ratio_flex"] = med["flex"] / med["attnconv"]
        row.update(memory.get(i, {}))
        if row.get("attnconv_mb") and row.get("dense_mb"):
            row["mem_ratio"] = row["attnconv_mb"] / row["dense_mb"]
        if row.get("attnconv_gflop") and row.get("dense_gflop"):
            row["flop_ratio"] = row["attnconv_gflop"] / row["dense_gflop"]
        err = precision(case["positional"], case["dtype"], case["c"], case["hw"])
        row["err_attnconv"], row["err_dense"] = err["attnconv"], err["dense"]
        rows.append(row)
        print(
            f"{row['name']:<52} dense/ours {row['ratio_dense']:.2f}"
            f"  fold/ours {row['ratio_fold']:.2f}"
            + (f"  flex/ours {row['ratio_flex']:.2f}" if "ratio_flex" in row else "")
            + f"  err {row['err_attnconv']:.1e} (dense {row['err_dense']:.1e})",
            flush=True,
        )
    return rows


def _name(case: dict) -> str:
    mode = "train" if case["train"] else "infer"
    return (
        f"{case['positional']}+content {mode} {case['dtype']} B{case['b']} C{case['c']} "
        f"{case['hw']}x{case['hw']}"
    )


ANCHOR_COLUMNS = [
    ("name", "case", ""),
    ("ratio_dense", "dense SDPA+bias / ours", ".2f"),
    ("ratio_flex", "compiled Flex / ours", ".2f"),
    ("ratio_fold", "ours without blocked kernel / ours", ".2f"),
    ("attnconv_s", "ours s", ".4f"),
    ("attnconv_mb", "ours MB", ".0f"),
    ("dense_mb", "dense MB", ".0f"),
    ("mem_ratio", "ours/dense memory", ".2f"),
    ("flop_ratio", "ours/dense matmul FLOPs", ".2f"),
    ("err_attnconv", "ours err vs f64", ".1e"),
    ("err_dense", "dense err vs f64", ".1e"),
]
