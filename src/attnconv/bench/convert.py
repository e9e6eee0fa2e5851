"""`attnconv bench --suite convert [-- --checkpoint CK --data ZIP]`: Theorem 1, measured.

1. Speed: CIFAR ResNet18 inference (batch of 32x32 real images) original vs converted with
   ``convert_model`` (hard, exact heads): medians of interleaved repeats, one process, ratio;
   and the same for networks at 112x112 (ResNet18, a depthwise-separable MobileNet-style
   net, a ConvNeXt-style stack of 7x7 depthwise blocks, and the zoo-like depthwise / grouped
   nets of bench/zoo_nets.py: MNASNet, FBNet, EfficientNetV2, MixNet, Xception, RegNetY,
   GhostNet) with their parameter counts; target <= 3x the original's time.
2. Lemma 2: output error of the soft conversion of a conv against alpha (0.5 .. 1e4), float32
   and float64, on real CIFAR images -> JSON + PNG.
3. With ``--checkpoint CK --data ZIP``: predictions of the trained model and its converted twin
   on a whole test split (identical predictions check).

Writes ``convert.json``, ``convert.md`` and ``convert_lemma2.png`` into ``--out-dir``
(default ``./attnconv-bench/``; the committed benchmarks/results/ only with
``--update-results``). ``--quick``: tiny sizes (CI smoke test).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

from attnconv.bench import common
from attnconv.bench.common import add_output_options, count, output_dir, positive

COMMAND = "attnconv bench --suite convert"
NET_TARGET = 3.0  # converted / original inference time of each network of bench_networks


def _real_images(n: int, spec: str = "sample") -> torch.Tensor:
    from attnconv.data import Loader, load_dataset

    ds = load_dataset(spec, "test")
    return next(Loader(ds, min(n, len(ds)), shuffle=False).batches(0))[0]


def _timings(fns: dict, x: torch.Tensor, repeats: int) -> tuple[dict, dict]:
    """Median wall-clock and process-CPU seconds per call of each fn, interleaved (a load
    spike hits every variant alike). On a shared machine the CPU time of this (single-thread)
    process is the steadier figure; both are reported."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for f in fns.values():  # warm-up
            f(x)
        for _ in range(repeats):
            for k, f in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                f(x)
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
    med = statistics.median
    return {k: med(v) for k, v in wall.items()}, {k: med(v) for k, v in cpu.items()}


def bench_speed(batch: int, repeats: int, widths: tuple[int, ...] | None) -> dict:
    from attnconv.convert import ConvAttention, convert_model
    from attnconv.models import create_model

    torch.manual_seed(0)
    kw = {"widths": widths} if widths else {}
    model = create_model("resnet18_cifar", **kw).eval()
    fast = convert_model(model).eval()
    gather = convert_model(model).eval()  # the layer's own hard attention (a gather) + crop
    for m in gather.modules():
        if isinstance(m, ConvAttention):
            m.forward = m.forward_layer  # this instance runs the layer path (a benchmark copy)
    x = _real_images(batch)
    with torch.no_grad():
        diff = (fast(x) - model(x)).abs().max().item()
    model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    fns = {
        "conv": model,
        "conv_channels_last": lambda x: model_cl(x.contiguous(memory_format=torch.channels_last)),
        "attention_hard": fast,
    }
    t, c = _timings(fns, x, repeats)
    t_ref, c_ref = _timings({"attention_hard_layer_gather": gather}, x, max(1, repeats // 5))
    t, c = {**t, **t_ref}, {**c, **c_ref}
    best = min(t["conv"], t["conv_channels_last"])
    best_cpu = min(c["conv"], c["conv_channels_last"])
    return {
        "model": "resnet18_cifar" + (f" widths={widths}" if widths else ""),
        "batch": len(x),
        "image": list(x.shape[-2:]),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "seconds": t,
        "cpu_seconds": c,
        "ratio_attention_over_conv": t["attention_hard"] / t["conv"],
        "ratio_attention_over_conv_channels_last": t["attention_hard"] / t["conv_channels_last"],
        "ratio_attention_over_best_conv": t["attention_hard"] / best,
        "cpu_ratio_attention_over_best_conv": c["attention_hard"] / best_cpu,
        "max_abs_logit_diff": diff,
        "target_ratio": 2.0,
        "target_met": t["attention_hard"] / best <= 2.0,
    }


def bench_lemma2(alphas: list[float], n_images: int) -> dict:
    from attnconv.convert.report import lemma2_sweep

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 16, 3, padding=1)
    x = _real_images(n_images)
    out = {"conv": "Conv2d(3, 16, 3, padding=1) on real CIFAR test images", "images": len(x)}
    for dt in (torch.float32, torch.float64):
        rows = lemma2_sweep(conv.to(dt), x.to(dt), alphas)
        finite = [r["rel_err"] for r in rows if math.isfinite(r["alpha"])]
        floor = 10 * torch.finfo(dt).eps
        mono = all(b < a or b <= floor for a, b in zip(finite, finite[1:]))
        out[str(dt).replace("torch.", "")] = {"rows": rows, "monotone_to_precision": mono}
    return out


def plot_lemma2(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for dt, style in (("float32", "o-"), ("float64", "s-")):
        rows = res[dt]["rows"]
        a = [r["alpha"] for r in rows if math.isfinite(r["alpha"])]
        e = [max(r["rel_err"], 1e-18) for r in rows if math.isfinite(r["alpha"])]
        (line,) = ax.loglog(a, e, style, ms=3, label=f"soft, {dt}")
        hard = max(rows[-1]["rel_err"], 1e-18)
        ax.axhline(hard, color=line.get_color(), ls=":", lw=1, label=f"hard limit, {dt}")
    ax.set_xlabel(r"$\alpha$ (precision of every head)")
    ax.set_ylabel(r"max $|$attention $-$ conv$|$ / max $|$conv$|$")
    ax.set_title(
        "Lemma 2: quadratic-encoding MHSA -> conv as alpha grows\n"
        "(an error of exactly 0 is drawn at 1e-18)",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def bench_predictions(checkpoint: str, data: str, batch: int) -> dict:
    from attnconv.convert import convert_model
    from attnconv.convert.report import compare_predictions
    from attnconv.data import CIFAR10_MEAN, CIFAR10_STD, Loader, load_dataset
    from attnconv.loading import load_model

    model, info = load_model(checkpoint)
    converted = convert_model(model).eval()
    d = info.get("data") or {}
    ds = load_dataset(data, "test")
    loader = Loader(
        ds, batch, shuffle=False, mean=d.get("mean", CIFAR10_MEAN), std=d.get("std", CIFAR10_STD)
    )
    res = compare_predictions(model, converted, loader.batches(0))
    state = info.get("state") or {}
    return {
        "checkpoint": checkpoint,
        "model": info["model"],
        "data": f"{data}:test",
        "train_step": state.get("step"),
        "batch": batch,
        **res,
    }


def bench_networks(batch: int, repeats: int, size: int, quick: bool = False) -> list[dict]:
    """Converted (hard) vs original inference time and parameters for CNN families."""
    from attnconv.bench.convnets import ConvNeXtStack, DepthwiseSeparableNet
    from attnconv.bench.zoo_nets import calibrate_batchnorm, zoo_networks
    from attnconv.convert import convert_model
    from attnconv.models import create_model

    torch.manual_seed(0)
    nets = {
        "resnet18_cifar": create_model("resnet18_cifar", **({"widths": (8,) * 4} if quick else {})),
        "depthwise_separable": calibrate_batchnorm(
            DepthwiseSeparableNet((8, 8, 8) if quick else (32, 64, 128, 128, 256, 256))
        ),
        "convnext_stack": ConvNeXtStack((8,), 1) if quick else ConvNeXtStack(),
        **zoo_networks(quick),
    }
    x = torch.randn(batch, 3, size, size)
    rows = []
    for name, net in nets.items():
        net = net.eval()
        conv = convert_model(net).eval()
        with torch.no_grad():
            ref = net(x)
            rel = ((conv(x) - ref).abs().max() / ref.abs().max()).item()
            ref64 = copy.deepcopy(net).double()(x.double())  # the fp32 floor of this network:
            floor = ((ref - ref64).abs().max() / ref64.abs().max()).item()  # original vs fp64
        t, c = _timings({"conv": net, "attention_hard": conv}, x, repeats)
        n0, n1 = (sum(p.numel() for p in m.parameters()) for m in (net, conv))
        rows.append(
            {
                "network": name,
                "batch": batch,
                "image": size,
                "seconds": t,
                "cpu_seconds": c,
                "ratio": t["attention_hard"] / t["conv"],
                "cpu_ratio": c["attention_hard"] / c["conv"],
                "params": n0,
                "params_converted": n1,
                "params_ratio": n1 / n0,
                "max_rel_logit_diff": rel,
                "fp32_floor": floor,
                "target_ratio": NET_TARGET,
                "target_met": t["attention_hard"] / t["conv"] <= NET_TARGET,
            }
        )
    return rows


def _command(argv: list[str]) -> str:
    return " ".join([COMMAND, "--", *argv]) if argv else COMMAND


def _markdown(res: dict, argv: list[str]) -> str:
    cmd = _command(argv)
    lines = [
        f"# Conversion benchmark (`{cmd}`)",
        "",
        common.provenance_line(res) + " Shared CPU: noisy timings, ratios from one interleaved run",
        "",
    ]
    s = res["speed"]
    lines += [
        "## Speed: converted (hard) vs original",
        "",
        f"{s['model']}, batch {s['batch']} of {s['image'][0]}x{s['image'][1]} real images, "
        f"{s['threads']} thread(s), median of {s['repeats']} interleaved repeats.",
        "",
        "| model | wall s / batch | ratio to conv | CPU s / batch | CPU ratio |",
        "|---|---|---|---|---|",
    ]
    for k, v in s["seconds"].items():
        cv = s["cpu_seconds"][k]
        lines.append(
            f"| {k} | {v:.4f} | {v / s['seconds']['conv']:.2f}x | {cv:.4f} | "
            f"{cv / s['cpu_seconds']['conv']:.2f}x |"
        )
    met = "met" if s["target_met"] else "NOT met"
    lines += [
        "",
        f"Target <= 2x of the faster original (wall clock): **{met}** "
        f"({s['ratio_attention_over_best_conv']:.2f}x; CPU time "
        f"{s['cpu_ratio_attention_over_best_conv']:.2f}x). "
        f"Max |logit diff| {s['max_abs_logit_diff']:.2e}.",
        "",
    ]
    lines += [
        "## Speed and size: CNN families, converted (hard) vs original",
        "",
        f"Median of interleaved repeats; target <= {NET_TARGET:g}x the original's "
        "time (wall clock). Max rel. logit diff: converted vs original, both float32; "
        "fp32 floor: the original in float32 vs the original in float64 (the "
        "rounding error of the network itself).",
        "",
        "| network | batch x image | original s | converted s | ratio (wall) | ratio (CPU) "
        "| params | converted params | max rel. logit diff | fp32 floor | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res.get("networks", []):
        lines.append(
            f"| {r['network']} | {r['batch']} x {r['image']}^2 | "
            f"{r['seconds']['conv']:.4f} | {r['seconds']['attention_hard']:.4f} | "
            f"{r['ratio']:.2f}x | {r['cpu_ratio']:.2f}x | {r['params']:,} | "
            f"{r['params_converted']:,} ({r['params_ratio']:.3f}x) | "
            f"{r['max_rel_logit_diff']:.1e} | {r.get('fp32_floor', math.nan):.1e} | "
            f"{'met' if r.get('target_met', True) else 'NOT met'} |"
        )
    lines += [
        "",
        "## Lemma 2: error of the soft conversion vs alpha",
        "",
        res["lemma2"]["conv"]
        + f" ({res['lemma2']['images']} images); relative error = max|attn - conv| / "
        "max|conv|. Figure: convert_lemma2.png.",
        "",
        "| alpha | float32 | float64 |",
        "|---|---|---|",
    ]
    r32, r64 = res["lemma2"]["float32"]["rows"], res["lemma2"]["float64"]["rows"]
    for a, b in zip(r32, r64):
        alpha = "inf (hard)" if not math.isfinite(a["alpha"]) else f"{a['alpha']:g}"
        lines.append(f"| {alpha} | {a['rel_err']:.2e} | {b['rel_err']:.2e} |")
    mono = all(res["lemma2"][d]["monotone_to_precision"] for d in ("float32", "float64"))
    lines += [
        "",
        f"Monotone decreasing down to float precision: {mono}. (At large alpha the "
        "float32 attention weights are exactly one-hot, so the error is 0 or float32 "
        "rounding, depending on the order in which the heads are summed.)",
        "",
    ]
    if "predictions" in res:
        p = res["predictions"]
        lines += [
            "## Trained model: predictions before/after conversion",
            "",
            f"{p['model']} checkpoint `{p['checkpoint']}` (train step {p['train_step']}) on "
            f"{p['data']}, {p['images']} images: accuracy {100 * p['accuracy_before']:.2f}% "
            f"before, {100 * p['accuracy_after']:.2f}% after, predictions differ on "
            f"**{p['predictions_differ']}** images, max |logit diff| "
            f"{p['max_abs_logit_diff']:.2e}; {p['seconds_before']:.1f} s vs "
            f"{p['seconds_after']:.1f} s in batches of {p['batch']} (not interleaved: "
            "a rough figure; the speed table above is the measurement).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke test)")
    add_output_options(p)
    p.add_argument("--budget-gb", type=positive, help="(accepted for `attnconv bench`; unused)")
    p.add_argument("--batch", type=count, default=32, help="images per timed batch, 32x32 (32)")
    p.add_argument("--repeats", type=count, default=15, help="interleaved timed repeats (15)")
    p.add_argument("--threads", type=count, default=1, help="torch threads (1)")
    p.add_argument("--net-batch", type=count, default=4, help="batch of the network table")
    p.add_argument("--net-size", type=count, default=112, help="image side of that table")
    p.add_argument("--checkpoint", help="trained checkpoint for the predictions check")
    p.add_argument("--data", help="dataset for the predictions check (e.g. the CIFAR-10 zip)")
    args = p.parse_args(argv)
    if (args.checkpoint is None) != (args.data is None):
        raise ValueError("--checkpoint and --data go together")
    out = output_dir(args)
    torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        speed = bench_speed(4, 3, (8, 8, 8, 8))
        networks = bench_networks(2, 2, 32, quick=True)
        lemma2 = bench_lemma2([0.5, 2.0, 10.0, 1e4], 2)
    else:
        speed = bench_speed(args.batch, args.repeats, None)
        networks = bench_networks(args.net_batch, args.repeats, args.net_size)
        alphas = [float(f"{a:.3g}") for a in torch.logspace(math.log10(0.5), 4, 22).tolist()]
        lemma2 = bench_lemma2(alphas, 8)
    res = {**common.provenance(), "command": _command(argv), "speed": speed, "networks": networks}
    res["lemma2"] = lemma2
    if args.checkpoint:
        res["predictions"] = bench_predictions(args.checkpoint, args.data, 500)
    plot_lemma2(lemma2, out / "convert_lemma2.png")
    (out / "convert.json").write_text(json.dumps(res, indent=1))
    (out / "convert.md").write_text(_markdown(res, argv))
    s, sec = speed, speed["seconds"]
    print(
        f"speed of {s['model']}, batch {s['batch']} of {s['image'][0]}x{s['image'][1]}, per "
        f"batch: original {sec['conv']:.4f} s (channels_last {sec['conv_channels_last']:.4f} "
        f"s), converted (hard) {sec['attention_hard']:.4f} s; converted / faster original: "
        f"{s['ratio_attention_over_best_conv']:.2f}x wall time, "
        f"{s['cpu_ratio_attention_over_best_conv']:.2f}x CPU time (target <= 2x wall: "
        f"{'met' if s['target_met'] else 'NOT met'})"
    )
    if networks:
        print(
            "network table (each its own size), converted / original in wall time and in CPU "
            "time (wall time counts waits for a busy core, CPU time does not):"
        )
    for r in networks:
        print(
            f"  {r['network']}, batch {r['batch']} of {r['image']}x{r['image']}: original "
            f"{r['seconds']['conv']:.4f} s, converted {r['seconds']['attention_hard']:.4f} s: "
            f"{r['ratio']:.2f}x wall, {r['cpu_ratio']:.2f}x CPU; {r['params_ratio']:.3f}x its "
            f"parameters, max rel. logit diff {r['max_rel_logit_diff']:.1e}"
        )
    for dt in ("float32", "float64"):
        rows = lemma2[dt]["rows"]
        print(
            f"lemma 2 ({dt}): rel err {rows[0]['rel_err']:.2e} at alpha={rows[0]['alpha']:g} "
            f"-> {rows[-2]['rel_err']:.2e} at alpha={rows[-2]['alpha']:g}; monotone: "
            f"{lemma2[dt]['monotone_to_precision']}"
        )
    if "predictions" in res:
        pr = res["predictions"]
        print(
            f"predictions: {pr['images']} images, differ on {pr['predictions_differ']}, "
            f"accuracy {100 * pr['accuracy_before']:.2f}% -> {100 * pr['accuracy_after']:.2f}%"
        )
    print(f"wrote {out / 'convert.md'}, {out / 'convert.json'}, {out / 'convert_lemma2.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
