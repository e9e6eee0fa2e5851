"""Before/after equality of the attention layers across two source trees (a refactor's check):
outputs, attention maps and every gradient over a grid of cases (encodings x content x values x
dropout x backends x dtypes x sizes for MultiHeadSelfAttention2d; positional x logits x padding x
backends x dtypes for LocalSelfAttention2d; the stem), compared with ``torch.equal``, and the
state_dict keys of every layer. A case that raises must raise the same one-line message in both.

    git worktree add /tmp/before <commit>
    python benchmarks/layers_equal.py --before /tmp/before --after .

Each tree runs in its own process (``PYTHONPATH=<tree>/src``) and writes its tensors to a
safetensors file; the constructor arguments are the ones both trees accept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import itertools, json, sys, warnings, torch
from safetensors.torch import save_file
from attnconv import AttentionStem2d, LocalSelfAttention2d, MultiHeadSelfAttention2d
from attnconv.layers.mhsa2d import POSITIONALS
warnings.simplefilter("ignore")
tensors, meta = {}, {}

def run(name, build, x, dtype, maps):
    try:
        torch.manual_seed(0)
        m = build()
        keys = sorted(m.state_dict())
        m = m.to(torch.float64) if dtype == "float64" else m
        xx = (x.double() if dtype == "float64" else x).clone().requires_grad_(True)
        torch.manual_seed(1)
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bf16"):
            out = m(xx, return_attention=True) if maps else m(xx)
        y, a = out if maps else (out, None)
        (y.float() * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        tensors[name + "/y"] = y.detach().float().contiguous()
        if a is not None:
            tensors[name + "/attention"] = a.detach().float().contiguous()
        tensors[name + "/dx"] = xx.grad.float().contiguous()
        for p, t in m.named_parameters():
            if t.grad is not None:
                tensors[f"{name}/d{p}"] = t.grad.float().contiguous()
        meta[name] = {"keys": keys}
    except Exception as e:
        meta[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}

torch.manual_seed(2)
for (h, w), pos, content, value, drop, backend, dtype in itertools.product(
        ((5, 7), (8, 8)), POSITIONALS, (True, False), ("linear", "identity"), (0.0, 0.1),
        (None, "reference", "flex", "blocked", "fused", "fold"), ("float32", "float64", "bf16")):
    x = torch.randn(2, 8, h, w)
    build = lambda: MultiHeadSelfAttention2d(8, 8, 2, positional=pos, content=content, value=value,
                                             dropout=drop, backend=backend).train(drop > 0)
    run(f"mhsa {h}x{w} {pos} c{int(content)} {value} p{drop} {backend} {dtype}", build, x, dtype,
        maps=drop == 0 and dtype == "float64")
for pos, logits, padding, backend, dtype in itertools.product(
        ("relative", "absolute", "none"), (None, "qk", "qr"), ("mask", "zeros"),
        (None, "reference", "flex", "fused", "window"), ("float32", "float64", "bf16")):
    x = torch.randn(2, 8, 6, 5)
    build = lambda: LocalSelfAttention2d(8, 8, 2, kernel_size=3, positional=pos, logits=logits,
                                         padding=padding, backend=backend)
    run(f"local {pos} {logits} {padding} {backend} {dtype}", build, x, dtype,
        maps=dtype == "float64")
for backend, dtype in itertools.product((None, "reference"), ("float32", "float64", "bf16")):
    x = torch.randn(2, 3, 8, 8)
    name = "auto" if backend is None else backend  # the case names of the earlier runs
    run(f"stem {name} {dtype}", lambda: AttentionStem2d(3, 8, 2, kernel_size=3, backend=backend),
        x, dtype, maps=False)
save_file(tensors, sys.argv[1])
json.dump(meta, open(sys.argv[2], "w"))
"""


def run_tree(tree: Path, out: Path) -> tuple[Path, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src"), "OMP_NUM_THREADS": "1"}
    st, js = out / f"{tree.name}.safetensors", out / f"{tree.name}.json"
    subprocess.run([sys.executable, "-c", CHILD, str(st), str(js)], env=env, check=True)
    return st, json.loads(js.read_text())


def compare(before: tuple[Path, dict], after: tuple[Path, dict]) -> list[str]:
    """One line per difference: a case missing, an error changed, a key or a tensor unequal."""
    import torch
    from safetensors.torch import load_file

    (st_a, meta_a), (st_b, meta_b) = before, after
    ta, tb = load_file(st_a), load_file(st_b)
    diffs = [f"case only in one tree: {c}" for c in sorted(set(meta_a) ^ set(meta_b))]
    diffs += [
        f"{c}: {meta_a[c]} != {meta_b[c]}"
        for c in sorted(set(meta_a) & set(meta_b))
        if meta_a[c] != meta_b[c]
    ]
    diffs += [f"tensor only in one tree: {k}" for k in sorted(set(ta) ^ set(tb))]
    diffs += [f"unequal: {k}" for k in sorted(set(ta) & set(tb)) if not torch.equal(ta[k], tb[k])]
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="source tree before the change")
    p.add_argument("--after", type=Path, required=True, help="source tree after the change")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        a = Path(tmp) / "a"
        b = Path(tmp) / "b"
        a.mkdir(), b.mkdir()
        before, after = run_tree(args.before, a), run_tree(args.after, b)
        diffs = compare(before, after)
        cases = len(before[1])
        errors = sum("error" in v for v in before[1].values())
        tensors = len(load_count(before[0]))
    for line in diffs[:50]:
        print(line)
    print(
        f"{cases} cases ({errors} refused alike when equal), {tensors} tensors: "
        f"{'equal' if not diffs else f'{len(diffs)} differences'}"
    )
    return 1 if diffs else 0


def load_count(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


if __name__ == "__main__":
    sys.exit(main())
