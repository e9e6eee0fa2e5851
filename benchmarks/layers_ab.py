"""Before/after speed of the global attention layers across two source trees (a refactor's check):
every positional encoding of MultiHeadSelfAttention2d, with and without content, forward+backward
at B=4, C=64, 8 heads, one thread; each tree timed in its own fresh process, the trees
alternated ``--rounds`` times so both see the same machine load; medians over rounds.

    git worktree add /tmp/before <commit>
    python benchmarks/layers_ab.py --before /tmp/before --after . [--rounds 3] [--sizes 16 32]

``--config CFG`` times instead one training step (forward, backward, SGD) of the model a training
config builds, at its batch and precision (bf16 autocast if it says so), on random 32x32 images
(e.g. configs/experiments/table1_sa_learned_content.yaml).
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
torch.set_num_threads(1)
from attnconv.layers.encoding import POSITIONALS
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
out = {}
for s in SIZES:
    for pos in POSITIONALS:
        for content in (True, False):
            torch.manual_seed(0)
            m = MultiHeadSelfAttention2d(64, 64, 8, positional=pos, content=content)
            x = torch.randn(4, 64, s, s, requires_grad=True)
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
torch.set_num_threads(1)
from attnconv.models import create_model
from attnconv.train.config import load_config
cfg = load_config(CONFIG)
torch.manual_seed(0)
m = create_model(cfg.model.name, num_classes=10, **cfg.model.kwargs)
opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
x, y = torch.randn(cfg.train.batch_size, 3, 32, 32), torch.randint(0, 10, (cfg.train.batch_size,))
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
name = f"{cfg.model.name} B={cfg.train.batch_size} {'bf16' if cfg.train.bf16 else 'fp32'} step"
print(json.dumps({name: statistics.median(ts)}))
"""


def run_tree(tree: Path, sizes: list[int], config: Path | None = None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    code = CHILD.replace("SIZES", repr(sizes))
    if config is not None:
        code = STEP.replace("CONFIG", repr(str(config.resolve())))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="source tree before the change")
    p.add_argument("--after", type=Path, required=True, help="source tree after the change")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 32])
    p.add_argument("--config", type=Path, help="time a training step of this config's model")
    args = p.parse_args(argv)
    for tree in (args.before, args.after):
        if not (tree / "src" / "attnconv").is_dir():
            raise SystemExit(f"layers_ab: {tree} has no src/attnconv (a source checkout?)")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        runs["before"].append(run_tree(args.before, args.sizes, args.config))
        runs["after"].append(run_tree(args.after, args.sizes, args.config))
    what = "training step, 1 thread" if args.config else "B=4, C=64, 8 heads, fwd+bwd, 1 thread"
    print(f"| case ({what}) | before s | after s | before/after |")
    print("|---|---|---|---|")
    ratios = []
    for case in runs["before"][0]:
        b = statistics.median(r[case] for r in runs["before"])
        a = statistics.median(r[case] for r in runs["after"])
        ratios.append(b / a)
        print(f"| {case} | {b:.4f} | {a:.4f} | {b / a:.2f} |")
    print(f"\ngeometric mean before/after: {statistics.geometric_mean(ratios):.3f} "
          f"({args.rounds} alternated rounds, medians)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
