"""Model sizes against the papers, and (``--time``) fwd+bwd time per model at its default input.

    python benchmarks/models.py                 # parameter table (exact, instant)
    python benchmarks/models.py --time --batch 4 --repeats 3

Prints a Markdown table and writes models.{md,json} into --out-dir (default ./attnconv-bench/;
benchmarks/results/ with --update-results).
Parameter counts are built on the meta device (shapes only). Times are medians of
``--repeats`` training steps (forward, cross-entropy, backward) after one warm-up, in train
mode (dropout on, as in the paper's training) on this machine's CPU threads.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from attnconv.bench.common import add_output_options, output_dir
from attnconv.models import create_model
from attnconv.models._common import num_params

# (registry name, num_classes, input size, paper's parameter count, source)
MODELS = [
    ("resnet18_cifar", 10, 32, 11.2e6, "Cordonnier et al. Table 1"),
    ("sa_quadratic", 10, 32, 12.1e6, "Cordonnier et al. Table 1"),
    ("sa_quadratic_generalized", 10, 32, None, ""),
    ("sa_learned", 10, 32, 12.3e6, "Cordonnier et al. Table 1"),
    ("sa_learned_content", 10, 32, 29.5e6, "Cordonnier et al. Table 1"),
    ("vit_tiny_cifar", 10, 32, None, ""),
    ("vit_small_cifar", 10, 32, None, ""),
    ("vit_base_patch16_224", 1000, 224, 86.6e6, "ViT paper Table 1: 86M"),
    ("transformer_base", None, None, 65e6, "Vaswani et al. Table 3"),
    ("transformer_small", None, None, None, ""),
]


def time_step(name: str, num_classes: int | None, size: int | None, batch: int, repeats: int):
    torch.manual_seed(0)
    if num_classes is None:  # sequence model: 32-token source and target
        m = create_model(name).train()
        V = m.cfg.src_vocab_size
        src = torch.randint(3, V, (batch, 32))
        tgt = torch.randint(3, V, (batch, 32))

        def loss_fn():
            return F.cross_entropy(m(src, tgt).flatten(0, 1), tgt.flatten())
    else:
        m = create_model(name, num_classes=num_classes).train()
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, num_classes, (batch,))

        def loss_fn():
            return F.cross_entropy(m(x), y)

    times = []
    for i in range(repeats + 1):
        m.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss_fn().backward()
        if i:  # the first step is a warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", action="store_true", help="also time a training step per model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--only", nargs="*", help="model names to include")
    add_output_options(ap)
    args = ap.parse_args()
    out = output_dir(args) / "models"
    torch.set_num_threads(args.threads)
    rows = []
    for name, classes, size, paper, source in MODELS:
        if args.only and name not in args.only:
            continue
        with torch.device("meta"):
            kw = {} if classes is None else {"num_classes": classes}
            n = num_params(create_model(name, **kw))
        row = {"model": name, "params": n, "paper_params": paper, "source": source}
        if paper:
            row["diff_pct"] = round(100 * (n / paper - 1), 2)
        if args.time:
            row["step_s"] = round(time_step(name, classes, size, args.batch, args.repeats), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)

    head = "| model | params | paper | diff |" + (" fwd+bwd step (s) |" if args.time else "")
    lines = [head, "|---" * (5 if args.time else 4) + "|"]
    for r in rows:
        paper = f"{r['paper_params'] / 1e6:.1f}M ({r['source']})" if r["paper_params"] else "-"
        diff = f"{r['diff_pct']:+.1f}%" if "diff_pct" in r else "-"
        line = f"| {r['model']} | {r['params'] / 1e6:.2f}M | {paper} | {diff} |"
        if args.time:
            line += f" {r['step_s']:.3f} |"
        lines.append(line)
    cmd = "python benchmarks/models.py" + (
        f" --time --batch {args.batch} --repeats {args.repeats} --threads {args.threads}"
        if args.time
        else ""
    )
    note = (
        f"\nCommand: `{cmd}`. Classes: 10 (CIFAR models), 1000 (ViT-B/16); transformers "
        "with their default vocabulary (37000 shared for transformer_base)."
    )
    if args.time:
        note += (
            f" Step = forward + cross-entropy + backward in train mode, batch {args.batch} "
            "(images at the model's default size; transformers: 32-token source and target), "
            f"median of {args.repeats} after one warm-up, {args.threads} CPU thread(s) on "
            f"{platform.processor() or platform.machine()}, torch {torch.__version__}."
        )
    text = "\n".join(lines) + "\n" + note + "\n"
    print("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
