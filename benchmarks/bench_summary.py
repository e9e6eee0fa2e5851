"""The benchmarks pages' generated parts, read from the committed results files.

- The one-screen summary of docs/benchmarks.md: per area, the headline ratio against each
  anchor, with the CPU or GPU, torch version and date of the run that measured it.
- Each area page's table of the results files it cites (benchmarks/results/provenance.json:
  CPU and flags, torch, date, command; logged or not).

    python benchmarks/bench_summary.py           # print the summary block
    python benchmarks/bench_summary.py --docs    # rewrite the generated blocks of the pages

tests/test_bench_summary.py checks that the pages hold what this writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
SUMMARY_PAGE = DOCS / "benchmarks.md"
AREA_PAGES = sorted((DOCS / "benchmarks").glob("*.md"))
SUMMARY = ("<!-- bench-summary:begin -->", "<!-- bench-summary:end -->")
SOURCES = ("<!-- bench-sources:begin -->", "<!-- bench-sources:end -->")


def provenance() -> dict[str, dict]:
    """benchmarks/results/provenance.json's entries by file stem."""
    return json.loads((RESULTS / "provenance.json").read_text())["files"]


def stem(name: str) -> str:
    """A results file's entry in provenance.json (the triton sweeps share one)."""
    base = name.rsplit("/", 1)[-1].split(".")[0]
    return "triton_sweep" if base.startswith("triton_sweep") else base


def logged(entry: dict) -> bool:
    """A file is logged when it names its machine (or its figures do not depend on one), its
    torch version (or its figures are compiler output or counts), its date and its command."""
    static = bool(entry.get("static"))
    return all(
        [entry.get("cpu") or static, entry.get("torch") or static, entry["date"], entry["command"]]
    )


def _json(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _fmt(v: float) -> str:
    return f"{v:.3g}" if v >= 10 else f"{v:.2f}"


def _span(values: list[float]) -> str:
    lo, hi = _fmt(min(values)), _fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _md_ratios(name: str, threads: int) -> list[float]:
    """The last column of a content_vs_dense table at ``threads``."""
    out, current = [], None
    for line in (RESULTS / f"{name}.md").read_text().splitlines():
        m = re.search(r"(\d+) thread\(s\)", line)
        if m and not line.startswith("|"):
            current = int(m.group(1))
        elif current == threads and re.match(r"\| \d+ \|", line):
            out.append(float(line.strip("| ").split("|")[-1]))
    return out


def _models(name: str, precision: str) -> list[float]:
    rows = _json(name)["rows"]
    return [
        r["x_reference"]
        for r in rows
        if r["scale"] == "paper" and r["code"] == "attnconv" and r["precision"] == precision
    ]


def _column(name: str, table: str, key: str) -> list[float]:
    return [r[key] for r in _json(name)[table]]


def _target(name: str, target: str) -> list[float]:
    return [t["measured"] for t in _json(name)["targets"] if t["target"] == target]


CPUS = ("models_throughput_b8_zen4", "models_throughput_b8_zen5", "models_throughput_b8_intel")
DENSE = ("content_vs_dense_zen4", "content_vs_dense_zen5", "content_vs_dense_intel")

# (page, what is measured, the anchor, how to read the ratio, [(file, ratios)])
HEADLINES = [
    (
        "layers",
        "position-only quadratic layer, 64x64, B=2, forward + backward",
        "the reference algorithm",
        "reference time / attnconv time",
        [("layers", lambda: _target("layers", "quad pos-only 64x64: reference / fast time"))],
    ),
    (
        "layers",
        "quadratic + content inference, 9 heads of 48, 32x32, batch 8 and 32, fp32 and bf16, "
        "one thread",
        "dense SDPA + positional bias",
        "dense time / attnconv time",
        [(n, lambda n=n: _md_ratios(n, 1)) for n in DENSE],
    ),
    (
        "models",
        "paper models' training step at hidden 400, batch 8, float32 (three models)",
        "the reference algorithm, float32",
        "attnconv img/s / reference img/s",
        [(n, lambda n=n: _models(n, "fp32")) for n in CPUS],
    ),
    (
        "models",
        "paper models, training step and inference at both scales (12 cases)",
        "the plain model under torch.compile",
        "attnconv eager speed / plain compiled speed",
        [("compile_models", lambda: _column("compile_models", "summary", "eager_x_plain"))],
    ),
    (
        "sasa",
        "SASA layer, k=7, 32x32, C=64, B=32, forward + backward",
        "the unfold reference",
        "reference time / attnconv time",
        [("local", lambda: _target("local", "k=7 32x32 B=32: reference / fast fwd+bwd time"))],
    ),
    (
        "convert",
        "ten converted CNNs' inference, batch 4 of 112x112",
        "the original convolutions",
        "converted time / original time (above 1: slower)",
        [("convert", lambda: [r["ratio"] for r in _json("convert")["networks"]])],
    ),
    (
        "gpu",
        "SASA layer, k=7, training and inference (12 cases)",
        "the unfold reference",
        "reference time / attnconv time",
        [("cuda_layers_local", lambda: _column("cuda_layers_local", "rows", "ratio_unfold"))],
    ),
    (
        "gpu",
        "quadratic / learned-relative + content, training and inference (24 cases)",
        "dense SDPA + positional bias",
        "dense time / attnconv time",
        [
            (
                "cuda_layers_content",
                lambda: _column("cuda_layers_content", "rows", "ratio_dense"),
            )
        ],
    ),
    (
        "precision",
        "paper models' training step at hidden 400, batch 8, under bf16 autocast",
        "the reference algorithm, float32",
        "attnconv img/s / reference img/s",
        [(n, lambda n=n: _models(n, "bf16")) for n in CPUS],
    ),
    (
        "precision",
        "sa_learned_content's training step at hidden 400, batch 8, bf16 autocast, with its bf16 "
        "operands",
        "the reference algorithm, float32",
        "attnconv img/s / reference img/s",
        [
            (
                "models_throughput_b8_zen5_bf16_operands",
                lambda: _models("models_throughput_b8_zen5_bf16_operands", "bf16"),
            )
        ],
    ),
]


def _machine(entry: dict) -> str:
    cpu = entry.get("cpu") or "not recorded"
    return f"{cpu}; {entry['flags']}" if entry.get("flags") else cpu


def summary() -> str:
    """The summary block's Markdown."""
    prov = provenance()
    lines = [
        "| area | measured, against | ratio | range | machine | torch | date | file |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for page, what, anchor, ratio, sources in HEADLINES:
        for i, (name, read) in enumerate(sources):
            entry = prov[name]
            values = read()
            mark = "" if logged(entry) else " (unlogged)"
            date = entry["date"] + (" (committed)" if entry["date_of"] == "commit" else "")
            head = f"[{page}](benchmarks/{page}.md) | {what}, against {anchor} | {ratio}"
            lines.append(
                f"| {head if i == 0 else ' | (same) | '} | {_span(values)}{mark} | "
                f"{_machine(entry)} | {entry['torch'] or 'not recorded'} | {date} | `{name}` |"
            )
    return "\n".join(lines)


def cited(text: str) -> list[str]:
    """The provenance entries of the results files a page names in its code spans, in order of
    first mention (a link to another page is no results file)."""
    spans = " ".join(re.findall(r"`([^`]+)`", text))
    names = re.findall(r"\b((?:triton_sweep|[a-z0-9_]+)[\w<>.]*)\.(?:md|json|jsonl)\b", spans)
    prov, out = provenance(), []
    for name in names:
        key = stem(name)
        if key in prov and key not in out:
            out.append(key)
    return out


def sources(text: str) -> str:
    """An area page's table of the results files it cites."""
    prov = provenance()
    lines = [
        "| file | logged | machine | torch | date | command |",
        "|---|---|---|---|---|---|",
    ]
    for key in cited(_outside(text, SOURCES)):
        e = prov[key]
        date = e["date"] + (" (committed)" if e["date_of"] == "commit" else "")
        what = "yes" if logged(e) else "**unlogged**"
        machine = _machine(e) if not e.get("static") else f"any: {e['static']}"
        lines.append(
            f"| `{key}` | {what} | {machine} | {e['torch'] or 'not recorded'} | {date} | "
            f"`{e['command']}` |"
        )
    return "\n".join(lines)


def _outside(text: str, markers: tuple[str, str]) -> str:
    begin, end = markers
    if begin not in text:
        return text
    return text[: text.index(begin)] + text[text.index(end) + len(end) :]


def block(text: str, markers: tuple[str, str]) -> str:
    """What a page holds between the markers (ValueError where it has none)."""
    begin, end = markers
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} block")
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n")


def replace(text: str, markers: tuple[str, str], body: str) -> str:
    begin, end = markers
    block(text, markers)
    return text[: text.index(begin) + len(begin)] + "\n" + body + "\n" + text[text.index(end) :]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", action="store_true", help="rewrite the pages' generated blocks")
    args = p.parse_args(argv)
    if not args.docs:
        print(summary())
        return 0
    SUMMARY_PAGE.write_text(replace(SUMMARY_PAGE.read_text(), SUMMARY, summary()))
    for page in AREA_PAGES:
        text = page.read_text()
        page.write_text(replace(text, SOURCES, sources(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
