"""The paper models' full training step on one CUDA GPU (Cordonnier et al. 2020, Table 1), the
models group of the cuda suite:

`attnconv bench --suite cuda [--quick] [--repeats N] -- --only models`

Per model (sa_quadratic, sa_learned, sa_learned_content) at the paper configuration (hidden
400, 6 layers, 9 heads, batch 100, the paper's dropout 0.1 on the attention probabilities and
the hidden states), one step = forward, cross-entropy, backward, SGD with momentum, on a fixed
random batch already on the GPU, five ways, interleaved round-robin in one process:

- ``reference``: the reference code's algorithm (bench/reference_algo.py, checked equal to the
  model before anything is timed) in float32, as the reference trains;
- ``attnconv fp32`` and ``attnconv bf16`` (autocast): the plan's kernels;
- ``attnconv bf16 triton``: content layers on the Triton kernel (backend="triton"), where it
  takes the heads (``triton_applies``: the content model, whose heads are hidden_size wide,
  400 at the paper's width);
- ``dense bf16``: the same model with each attention layer written as a user would on a GPU,
  ``F.scaled_dot_product_attention`` with the dense positional logits as a float bias (softmax
  of the bias @ v for position-only attention), dropout by SDPA's own ``dropout_p``.

Reports img/s (median step), the peak memory allocated during one step above the model, and the
hours that 300 epochs of CIFAR-10's 50,000 images (Table 1's schedule) take at that rate. The
ceiling of each path: the FLOPs of its step (FlopCounterMode: matmuls and SDPA, counted once
after the timing) at the GPU's measured GEMM peak in its precision (a square matmul, TF32 off),
the img/s no kernel of that step's work can pass; not counted for the Triton row (the counter
does not see a Triton kernel's products).
"""

from __future__ import annotations

import copy
import platform
import statistics
import types

import torch

from attnconv.bench import cuda_timing
from attnconv.bench.anchors import dense_sdpa
from attnconv.bench.common import count_flops, markdown_table, suite_command, write_results
from attnconv.bench.models import P_DROP, SA_MODELS, build, gemm, model_kwargs, training_step
from attnconv.layers.checks import set_backend
from attnconv.layers.kernels import triton_axis
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.models.sa_cifar import SACifarConfig

EPOCHS, TRAIN_IMAGES = 300, 50_000  # Table 1's schedule (configs/sa_*.yaml)
PEAK_N = 4096  # the GEMM peak's square matmul (a CPU dry run: 256)


def dense_sdpa_forward(layer: MultiHeadSelfAttention2d):
    """The layer with its forward replaced by ``anchors.dense_sdpa``: SDPA with the dense
    positional logits (B|1, Nh, T, T) as a float bias and SDPA's dropout (a user's GPU code)."""

    def forward(self, x, return_attention=False):
        return dense_sdpa(self, x)

    layer.forward = types.MethodType(forward, layer)
    # the paper models call forward_tokens (H, W, B, C): through the dense forward too
    layer.forward_tokens = lambda x: layer.forward(x.permute(2, 3, 0, 1)).permute(2, 3, 0, 1)
    return layer


def triton_applies(model: str, scale: str) -> bool:
    """Whether the Triton kernel takes the model's content heads: they are hidden_size wide
    (each head reads the raw input; value="identity"), 400 at the paper's configuration, within
    the kernel's MAX_HEAD_DIM (over the FlashAttention library's 256); a wider model's row would
    time the dense fallback under the kernel's name."""
    width = model_kwargs(model, scale).get("hidden_size", SACifarConfig.hidden_size)
    content = model == "sa_learned_content"
    return content and triton_axis.INSTALLED and width <= triton_axis.MAX_HEAD_DIM


def variants(model: str, scale: str = "paper") -> list[tuple[str, str, bool]]:
    """(name, how, bf16) of each way a model is trained."""
    out = [
        ("reference", "reference", False),
        ("attnconv fp32", "attnconv", False),
        ("attnconv bf16", "attnconv", True),
    ]
    if triton_applies(model, scale):
        out.append(("attnconv bf16 triton", "triton", True))
    return out + [("dense bf16", "dense", True)]


def make_step(model: str, scale: str, batch: int, how: str, bf16: bool, device: str = "cuda"):
    net = build(model, scale, "reference" if how == "reference" else "attnconv")
    if how == "dense":
        for m in net.modules():
            if isinstance(m, MultiHeadSelfAttention2d):
                dense_sdpa_forward(m)
    elif how == "triton":  # position-only layers: the plan's position kernels, as unset
        set_backend(net, "triton")
    return training_step(net.to(device), batch, bf16, device)


def gemm_peaks(device: str = "cuda", repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of an n x n x n matmul in fp32 (TF32 as set: off in ``report``) and bf16, the
    median of ``repeats`` timings of 3 calls each."""
    n = PEAK_N if device == "cuda" else 256
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        step = gemm(dtype, n, device)
        ms = [cuda_timing.ms_per_call(step, 3, device) for _ in range(repeats + 1)]
        out[name] = 2 * n**3 / (statistics.median(ms[1:]) / 1e3) / 1e9  # the first: a warm-up
    return out


def measure(steps: dict, repeats: int, device: str = "cuda") -> dict[str, dict]:
    """Median seconds per step (cuda_timing.time_and_memory: CUDA events, interleaved, one step
    per repeat) and the peak MB one step allocates."""
    res = cuda_timing.time_and_memory(steps, repeats, inner=1, device=device)
    return {k: dict(v, s=v.pop("ms") / 1e3) if "ms" in v else v for k, v in res.items()}


def _gflop_img(step, batch: int) -> float | None:
    """GFLOP per image of one counted step; None where counting fails (the timing stands)."""
    try:
        return count_flops(step) / 1e9 / batch
    except Exception:  # noqa: BLE001 - a ceiling not counted is a result, not a crash
        return None


def run(models, scale, batch, repeats, device="cuda", peaks=None, save=None) -> list[dict]:
    """Each model's rows; ``peaks`` (``gemm_peaks``): each path's ceiling besides;
    ``save(rows)`` after each model (a run cut short keeps what it measured)."""
    rows = []
    for model in models:
        specs = {name: (how, bf16) for name, how, bf16 in variants(model, scale)}
        steps = {n: make_step(model, scale, batch, *spec, device) for n, spec in specs.items()}
        res = measure(steps, repeats, device)
        gflop = {  # one counted step each, after the timing (the counter slows the step it sees)
            n: _gflop_img(steps[n], batch)
            for n in steps
            if "s" in res[n] and specs[n][0] != "triton"
        }
        ref = res.get("reference", {}).get("s")
        dense = res.get("dense bf16", {}).get("s")
        for name, r in res.items():
            row = dict(model=model, path=name, batch=batch, error=r.get("error", ""))
            if "s" in r:
                row.update(
                    img_s=batch / r["s"],
                    mb=r.get("mb"),  # none on a CPU dry run
                    hours=EPOCHS * TRAIN_IMAGES / (batch / r["s"]) / 3600,
                )
                row["x_ref"] = ref / r["s"] if ref else None
                row["x_dense"] = dense / r["s"] if dense else None
                if "mb" in r and "mb" in res.get("reference", {}):
                    row["mem_ref"] = r["mb"] / res["reference"]["mb"]
                if gflop.get(name) and peaks:
                    row["gflop_img"] = gflop[name]
                    row["ceiling_img_s"] = peaks["bf16" if specs[name][1] else "fp32"] / gflop[name]
            rows.append(row)
            print(
                f"{model:<20} {name:<22} "
                + (f"{row['img_s']:.0f} img/s" if "s" in r else row["error"]),
                flush=True,
            )
        del steps
        if device == "cuda":
            torch.cuda.empty_cache()
        if save is not None:
            save(rows)
    return rows


COLUMNS = [
    ("model", "model", ""),
    ("path", "path", ""),
    ("img_s", "img/s", ".0f"),
    ("x_ref", "x reference fp32", ".2f"),
    ("x_dense", "x dense SDPA+bias bf16", ".2f"),
    ("mb", "peak MB", ".0f"),
    ("mem_ref", "memory / reference", ".2f"),
    ("hours", "Table 1 hours (300 epochs)", ".1f"),
    ("gflop_img", "GFLOP/img", ".3g"),
    ("ceiling_img_s", "ceiling img/s", ".0f"),
    ("error", "note", ""),
]


def report(args, repeats: int, out_dir) -> int:
    scale, batch = ("quick", 8) if args.quick else ("paper", 100)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as the reference trained
    peaks, dev = gemm_peaks(args.device), cuda_timing.device_name(args.device)

    def save(rows):  # the rows so far, read by gpu_goals where the time ran out; removed below
        write_results("cuda_models.partial", dict(rows=rows, device=dev), "", out_dir)

    rows = run(SA_MODELS, scale, batch, repeats, args.device, peaks, save)
    for suffix in (".json", ".md"):
        (out_dir / f"cuda_models.partial{suffix}").unlink(missing_ok=True)
    command = suite_command("cuda", args)
    header = (
        f"Command: `{command}`; {repeats} interleaved repeats (median step), CUDA events, "
        f"batch {batch}, {scale} configuration, dropout {P_DROP}. Device: {dev}; torch "
        f"{torch.__version__}; Python {platform.python_version()}. GEMM peak (a square "
        f"matmul): fp32 {peaks['fp32'] / 1e3:.1f}, bf16 {peaks['bf16'] / 1e3:.1f} TFLOP/s; "
        "ceiling img/s: the step's counted FLOPs (matmuls, SDPA) at the peak of its precision "
        "(not counted for the Triton row)."
    )
    md = "\n".join(
        [
            "# Paper models' training step on CUDA\n",
            header + "\n",
            markdown_table(rows, COLUMNS),
            "",
        ]
    )
    path = write_results(
        "cuda_models",
        dict(
            command=command, header=header, device=dev, peak_gflops=peaks, rows=copy.deepcopy(rows)
        ),
        md,
        out_dir,
    )
    print(md)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0
