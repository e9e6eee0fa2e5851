"""The Triton forward kernel's key loop against a plain flash-attention loop, in instructions:
both compiled for an NVIDIA GPU on this CPU machine (no GPU), at the same query block, key
block, head width and warps, and the SASS instructions of each main loop counted (cuobjdump's
listing: the body of the longest backward branch). What the axis logits (and dropout's counter
hash) add to each step of the loop, a static figure: it says nothing of memory stalls or
tensor-core occupancy, which only a GPU run measures.

    python benchmarks/triton_loops.py [--arch 90] [--quick] [--json] [--out FILE]
    python benchmarks/triton_loops.py --backward [--arch 90] [--out FILE]

``--backward``: the training launches' main loops instead (the dQ kernel's delta pass, the dQ
pass, dK/dV), each loop's instructions over the (query, key) pairs a step covers (BLOCK_M x
keys), and the delta pass's share of the backward's instructions a pair.

The plain loop (``plain_flash_forward`` below): softmax(scale q k^T) v, online softmax, keys
masked past T, nothing else; ours: ``triton_axis_jit._fwd`` as ``triton_axis.forward_launch``
builds it for the case.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
import triton
import triton.language as tl

from attnconv.layers.kernels import triton_axis
from attnconv.layers.kernels import triton_compile as tc


@triton.jit
def plain_flash_forward(
    Q, K, V, Y, T, scale, DK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """softmax(scale q k^T) v of one query block of one (image, head): the baseline loop."""
    base = tl.program_id(1) * T * DK
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, DK)
    q = tl.load(Q + base + i[:, None] * DK + d[None, :], mask=i[:, None] < T, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, DK), tl.float32)
    for n0 in range(0, T, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        kt = tl.load(K + base + n[None, :] * DK + d[:, None], mask=n[None, :] < T, other=0.0)
        s = tl.where(n[None, :] < T, tl.dot(q, kt) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = tl.load(V + base + n[:, None] * DK + d[None, :], mask=n[:, None] < T, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new
    tl.store(Y + base + i[:, None] * DK + d[None, :], acc / l_i[:, None], mask=i[:, None] < T)


def main_loop(sass: str) -> list[str]:
    """The opcodes of the longest loop in a SASS listing: from a backward branch's target to
    the branch."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)
    at = {int(a, 16): j for j, (a, _) in enumerate(lines)}
    best: list[str] = []
    for j, (a, text) in enumerate(lines):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if m and int(m[1], 16) < int(a, 16) and int(m[1], 16) in at:
            body = [
                re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]
                for _, t in lines[at[int(m[1], 16)] : j + 1]
            ]
            best = max(best, body, key=len)
    return best


def _loop(kernel, sig: dict, constexprs: dict, warps: int, arch: int) -> list[str]:
    compiled = tc.compile_for(kernel, sig, constexprs, triton_axis.STAGES[0], warps, arch)
    return main_loop(tc.cuobjdump(compiled.asm["cubin"], "-sass") or "")


def compare(case: tc.Case, arch: int) -> dict:
    """Our forward loop and the plain one at the case's tile: instructions, tensor-core ones."""
    kernel, args, meta = tc.launches(case)[0]
    constexprs, warps = triton_axis.compile_options(meta)
    ours = _loop(kernel, tc.signature(kernel, args, constexprs), constexprs, warps, arch)
    dtype = tc.SIG[case.dtype]
    sig = dict(Q=f"*{dtype}", K=f"*{dtype}", V=f"*{dtype}", Y=f"*{dtype}", T="i32", scale="fp32")
    keys, width = meta["ROWS"] * meta["WP"], max(meta["DKP"], meta["DVP"])
    plain_c = dict(DK=width, BLOCK_M=meta["BLOCK_M"], BLOCK_N=keys)
    sig |= {k: "constexpr" for k in plain_c}
    plain = _loop(plain_flash_forward, sig, plain_c, warps, arch)

    def mma(ops):
        return sum("MMA" in op for op in ops)

    return dict(
        case=str(case), arch=arch, block_m=meta["BLOCK_M"], keys=keys, warps=warps,
        plain=len(plain), ours=len(ours), ratio=len(ours) / max(len(plain), 1),
        plain_mma=mma(plain), ours_mma=mma(ours),
    )  # fmt: skip


def backward(case: tc.Case, arch: int) -> list[dict]:
    """Each backward launch's main loop: instructions, tensor-core ones, per (query, key) pair."""
    rows = []
    for kernel, args, meta in tc.launches(case)[1:]:
        constexprs, warps = triton_axis.compile_options(meta)
        loop = _loop(kernel, tc.signature(kernel, args, constexprs), constexprs, warps, arch)
        pairs = meta["BLOCK_M"] * meta["ROWS"] * meta["WP"]
        name = triton_axis.launch_name(kernel, meta)
        rows.append(dict(case=str(case), arch=arch, kernel=name, block_m=meta["BLOCK_M"]))
        rows[-1].update(keys=pairs // meta["BLOCK_M"], warps=warps, loop=len(loop))
        rows[-1].update(mma=sum("MMA" in op for op in loop), per_pair=len(loop) / pairs)
    return rows


def backward_table(cases: list[tc.Case], arch: int) -> list[str]:
    md = [
        f"triton {triton.__version__}, torch {torch.__version__}, sm_{arch}",
        "| case | kernel | BLOCK_M | keys | warps | loop | mma | a pair | share of the pair's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        rows = backward(case, arch)
        total = sum(r["per_pair"] for r in rows)
        md += [
            f"| {r['case']} | {r['kernel']} | {r['block_m']} | {r['keys']} | {r['warps']} "
            f"| {r['loop']} | {r['mma']} | {r['per_pair']:.3f} | {r['per_pair'] / total:.2f} |"
            for r in rows
        ]
    return md


def cases(quick: bool) -> list[tc.Case]:
    """bfloat16 training at 32x32 tokens, head widths 16 and 64: without dropout (the logits
    alone), with it (its counter hash); the paper's content heads at 16x16 last. The forward
    kernel is the same in training and inference, so one row serves both."""
    bf16 = torch.bfloat16
    if quick:
        return [tc.Case(bf16, 32, 32, 16, 16, train=False)]
    out = [tc.Case(bf16, 32, 32, d, d, p=p) for p in (0.0, 0.1) for d in (16, 64)]
    return out + [tc.Case(bf16, 16, 16, 48, 48, p=0.1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="sm_<arch> (90)")
    p.add_argument("--quick", action="store_true", help="one case")
    p.add_argument("--json", action="store_true", help="one JSON object per case")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    p.add_argument("--backward", action="store_true", help="the training launches' loops")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("triton_loops: unset TRITON_INTERPRET (the interpreter compiles none)")
    if args.backward:
        training = [c for c in cases(args.quick) if c.train] or [
            tc.Case(torch.bfloat16, 32, 32, 16, 16)
        ]
        training += [tc.Case(torch.float32, 32, 32, 64, 64)]
        text = "\n".join(backward_table(training, args.arch)) + "\n"
        sys.stdout.write(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        return 0
    rows = [compare(c, args.arch) for c in cases(args.quick)]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    md = [
        f"triton {triton.__version__}, torch {torch.__version__}, sm_{args.arch}",
        "| case | BLOCK_M | keys | warps | plain loop | ours | ours / plain | plain mma "
        "| ours mma |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    md += [
        f"| {r['case']} | {r['block_m']} | {r['keys']} | {r['warps']} | {r['plain']} "
        f"| {r['ours']} | {r['ratio']:.2f} | {r['plain_mma']} | {r['ours_mma']} |"
        for r in rows
    ]
    text = "\n".join(md) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
