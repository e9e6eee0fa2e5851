"""The layers suite's cases (the sweep and the targets' cases), the reference path's memory
estimate that skips what would not fit, and the targets' checks (bench/layers.py runs them)."""

from __future__ import annotations

from attnconv.layers.encodings import build_encoding
from attnconv.layers.encodings.relative import LearnedRelativeEncoding, RelativeEncoding
from attnconv.layers.mhsa2d import POSITIONALS

FACTORY = "attnconv.bench.layers:make_step"
KERNEL_FACTORY = "attnconv.bench.layers:make_kernel_step"


def ref_bytes(b: int, heads: int, t: int, positional: str) -> float:
    """Rough peak of the reference path: ~4 dense (B, Nh, T, T) float32 tensors (logits, probs,
    their gradients), plus the (T, T, Dp) r_delta tables of the relative encodings (those the
    factory builds as RelativeEncoding or LearnedRelativeEncoding)."""
    enc = build_encoding(positional, num_heads=1, in_channels=4, qk_dim=4, content=True)
    relative = isinstance(enc, (RelativeEncoding, LearnedRelativeEncoding))
    extra = 4 * t * t * 64 * 4 if relative else 0
    return 4 * b * heads * t * t * 4 + extra


def sweep_cases(quick: bool) -> list[dict]:
    sizes = [8] if quick else [16, 32, 64]
    b, c, heads = (2, 16, 4) if quick else (4, 64, 8)
    variants = [(p, ct) for p in POSITIONALS for ct in (True, False)]
    if quick:
        variants = [("quadratic", False), ("quadratic", True), ("relative_learned", True)]
    cases = []
    for s in sizes:
        cases.append(dict(group="sweep", name=f"conv3x3 {s}x{s}", kind="conv", b=b, c=c, h=s, w=s))
        for pos, content in variants:
            for impl in ("auto", "reference"):
                cases.append(
                    dict(
                        group="sweep",
                        name=f"{pos}{' +content' if content else ''} {s}x{s} {impl}",
                        kind="mhsa",
                        b=b,
                        c=c,
                        h=s,
                        w=s,
                        heads=heads,
                        positional=pos,
                        content=content,
                        impl=impl,
                    )
                )
    return cases


def target_cases(quick: bool) -> list[dict]:
    q = dict(kind="mhsa", c=144, heads=9, head_dim=16, positional="quadratic", content=False)
    if quick:
        q = dict(q, c=18, heads=9, head_dim=2)
        sizes = [(4, 8, 2), (4, 8, 2)]
    else:  # (batch vs reference, size, batch vs paper)
        sizes = [(32, 32, 32), (2, 64, 8)]
    cases = []
    for b_ref, s, b_paper in sizes:
        for impl in ("auto", "reference"):
            cases.append(
                dict(
                    q,
                    group=f"quad{s}",
                    name=f"quadratic pos-only {s}x{s} B={b_ref} {impl}",
                    b=b_ref,
                    h=s,
                    w=s,
                    impl=impl,
                )
            )
        cases.append(
            dict(
                q,
                group=f"quad{s}p",
                name=f"quadratic pos-only {s}x{s} B={b_paper} auto",
                b=b_paper,
                h=s,
                w=s,
                impl="auto",
            )
        )
        cases.append(
            dict(
                q,
                group=f"quad{s}p",
                name=f"paper-code algorithm {s}x{s} B={b_paper}",
                kind="paper",
                b=b_paper,
                h=s,
                w=s,
            )
        )
        if quick:
            break
    big = 16 if quick else 224
    cases.append(
        dict(
            group="global224",
            name=f"quadratic global {big}x{big} B=1 C=64 9 heads (value=identity) auto",
            kind="mhsa",
            b=1,
            c=64,
            h=big,
            w=big,
            heads=9,
            positional="quadratic",
            content=False,
            value="identity",
        )
    )
    qc = dict(kind="mhsa", b=32, c=432, heads=9, h=32, w=32, positional="quadratic", content=True)
    if quick:
        qc = dict(qc, b=2, c=18, h=8, w=8)
    for impl in ("auto", "reference"):
        cases.append(
            dict(
                qc,
                group="quadcontent",
                impl=impl,
                name=f"quadratic +content {qc['h']}x{qc['w']} B={qc['b']} C={qc['c']} "
                f"9 heads {impl}",
            )
        )
    for impl in ("auto", "reference"):
        cases.append(
            dict(
                group="quadkernel",
                factory=KERNEL_FACTORY,
                impl=impl,
                b=qc["b"],
                c=qc["c"],
                h=qc["h"],
                w=qc["w"],
                heads=9,
                name=f"  its attention kernel alone {impl}",
            )
        )
    return cases


def _ratio(rows: list[dict], group: str, key: str, num: str, den: str) -> float | None:
    """rows[name contains num][key] / rows[name contains den][key] within a group."""
    g = [r for r in rows if r.get("group") == group and key in r]
    a = [r[key] for r in g if num in r["name"]]
    b = [r[key] for r in g if den in r["name"]]
    return a[0] / b[0] if a and b and b[0] > 0 else None


def check_targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, each as measured ratio vs required."""
    t = []

    def add(what, value, need, better="higher"):
        ok = (
            None
            if value is None or need is None
            else (value >= need if better == "higher" else value <= need)
        )
        t.append(dict(target=what, measured=value, required=need, met=ok))

    add(
        "quad pos-only 32x32: reference / fast time",
        _ratio(rows, "quad32", "median_s", "reference", "auto"),
        8.0,
    )
    add(
        "quad pos-only 64x64: reference / fast time",
        _ratio(rows, "quad64", "median_s", "reference", "auto"),
        20.0,
    )
    add(
        "quad pos-only 64x64: fast / reference peak memory",
        _ratio(rows, "quad64", "peak_mb", "auto", "reference"),
        0.1,
        "lower",
    )
    add(
        "quad pos-only 32x32 B=32: paper-code / fast time",
        _ratio(rows, "quad32p", "median_s", "paper", "auto"),
        5.0,
    )
    add(
        "  (FLOP ratio paper-code / fast: the ratio at equal GFLOP/s)",
        _ratio(rows, "quad32p", "gflop", "paper", "auto"),
        None,
    )
    add(
        "quad pos-only 64x64 B=8: paper-code / fast time",
        _ratio(rows, "quad64p", "median_s", "paper", "auto"),
        10.0,
    )
    g = [r for r in rows if r.get("group") == "global224" and "peak_mb" in r]
    add(
        "global 224x224 fwd+bwd peak memory (GB)",
        g[0]["peak_mb"] / 1024 if g else None,
        8.0,
        "lower",
    )
    add(
        "quad +content 32x32: reference / fast time",
        _ratio(rows, "quadcontent", "median_s", "reference", "auto"),
        2.5,
    )
    add(
        "quad +content 32x32: fast / reference peak memory",
        _ratio(rows, "quadcontent", "peak_mb", "auto", "reference"),
        1 / 3,
        "lower",
    )
    add(
        "  (its attention kernels alone: reference / fast time, a bound on the layer ratio)",
        _ratio(rows, "quadkernel", "median_s", "reference", "auto"),
        None,
    )
    return t
