"""Before/after speed of the global attention layers across two source trees (a refactor's check):
every positional encoding of MultiHeadSelfAttention2d, with and without content, forward+backward
at B=4, C=64, 8 heads, one thread (``--threads N``: N); each tree timed in its own fresh process,
the trees alternated ``--rounds`` times so both see the same machine load; medians over rounds.

    git worktree add /tmp/before <commit>
    python benchmarks/layers_ab.py --before /tmp/before --after . [--rounds 3] [--sizes 16 32]

``--after-patch MOD:NAME=VALUE`` sets a module constant in the after runs only (a tuning
A/B within one tree: ``--before . --after . --after-patch attnconv.layers.kernels.shared_position:
BLOCK_MAX_THREADS=8``).

``--config CFG`` times instead one training step (forward, backward, SGD) of the model a training
config builds, at its batch and precision (bf16 autocast if it says so), on random 32x32 images
(e.g. configs/experiments/table1_sa_learned_content.yaml).

``--inference`` times the forward alone, in eval mode under ``torch.inference_mode`` (what
evaluation and `attnconv analyze` run): of each layer, or of the config's model at its batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, statistics, sys, time, torch
torch.set_num_threads(THREADS)
PATCHES
from attnconv.layers.mhsa2d import POSITIONALS, MultiHeadSelfAttention2d  # in both trees
out = {}
for s in SIZES:
    for pos in POSITIONALS:
        for content in (True, False):
            torch.manual_seed(0)
            m = MultiHeadSelfAttention2d(64, 64, 8, positional=pos, content=content)
            x = torch.randn(4, 64, s, s, requires_grad=True)
            if INFERENCE:
                m.eval()
                def step():
                    with torch.inference_mode():
                        m(x)
            else:
                def step():
                    m.zero_grad(set_to_none=True)
                    m(x).sum().backward()
            step()
            ts = []
            for _ in range(5):
                t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
            out[f"{pos}{' +content' if content else ''} {s}x{s}"] = statistics.median(ts)
print(json.dumps(out))
"""


STEP = """
import json, statistics, time, torch
torch.set_num_threads(THREADS)
PATCHES
from attnconv.models import create_model
from attnconv.train.config import load_config
cfg = load_config(CONFIG)
torch.manual_seed(0)
m = create_model(cfg.model.name, num_classes=10, **cfg.model.kwargs)
x, y = torch.randn(cfg.train.batch_size, 3, 32, 32), torch.randint(0, 10, (cfg.train.batch_size,))
kind = "forward (inference)" if INFERENCE else "step"
if INFERENCE:
    m.eval()
    def step():
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, cfg.train.bf16):
            m(x)
else:
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.bf16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
step()
ts = []
for _ in range(3):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
name = f"{cfg.model.name} B={cfg.train.batch_size} {'bf16' if cfg.train.bf16 else 'fp32'} {kind}"
print(json.dumps({name: statistics.median(ts)}))
"""


def patch_lines(patches: list[str]) -> str:
    """``module:NAME=VALUE`` (VALUE a Python literal) -> lines that set the module constant."""
    lines = []
    for item in patches:
        target, sep, value = item.partition("=")
        module, colon, name = target.partition(":")
        if not (sep and colon and module and name.isidentifier()):
            raise SystemExit(f"layers_ab: --after-patch wants module:NAME=VALUE, got {item!r}")
        lines.append(
            f"import importlib, ast; setattr(importlib.import_module({module!r}), "
            f"{name!r}, ast.literal_eval({value!r}))"
        )
    return "\n".join(lines)


def run_tree(
    tree: Path,
    sizes: list[int],
    config: Path | None = None,
    threads: int = 1,
    patch: str = "",
    inference: bool = False,
) -> dict[str, float]:
    """One fresh process timing ``tree``; ``patch`` the lines of ``patch_lines`` run first;
    ``inference``: the forward alone (eval mode, inference_mode)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    code = CHILD.replace("SIZES", repr(sizes))
    if config is not None:
        code = STEP.replace("CONFIG", repr(str(config.resolve())))
    code = code.replace("THREADS", str(threads)).replace("PATCHES", patch)
    code = code.replace("INFERENCE", repr(inference))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="source tree before the change")
    p.add_argument("--after", type=Path, required=True, help="source tree after the change")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 32])
    p.add_argument("--config", type=Path, help="time a training step of this config's model")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument(
        "--after-patch",
        action="append",
        default=[],
        metavar="MOD:NAME=VALUE",
        help="set a module constant in the after runs (a tuning A/B in one tree)",
    )
    p.add_argument(
        "--inference",
        action="store_true",
        help="time the forward alone, in eval mode under torch.inference_mode",
    )
    args = p.parse_args(argv)
    for tree in (args.before, args.after):
        if not (tree / "src" / "attnconv").is_dir():
            raise SystemExit(f"layers_ab: {tree} has no src/attnconv (a source checkout?)")
    patch = patch_lines(args.after_patch)  # a malformed one is refused before any timing
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for side, tree, lines in (("before", args.before, ""), ("after", args.after, patch)):
            runs[side].append(
                run_tree(tree, args.sizes, args.config, args.threads, lines, args.inference)
            )
    threads = f"{args.threads} thread{'s' if args.threads > 1 else ''}"
    what = "training step" if args.config else "B=4, C=64, 8 heads, fwd+bwd"
    if args.inference:
        what = "forward, inference" if args.config else "B=4, C=64, 8 heads, inference forward"
    what = f"{what}, {threads}"
    print(f"| case ({what}) | before s | after s | before/after |")
    print("|---|---|---|---|")
    ratios = []
    for case in runs["before"][0]:
        b = statistics.median(r[case] for r in runs["before"])
        a = statistics.median(r[case] for r in runs["after"])
        ratios.append(b / a)
        print(f"| {case} | {b:.4f} | {a:.4f} | {b / a:.2f} |")
    print(
        f"\ngeometric mean before/after: {statistics.geometric_mean(ratios):.3f} "
        f"({args.rounds} alternated rounds, medians)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
