"""Shipped code quotes no measured figure and names no issue number: a figure lives in
docs/benchmarks.md or docs/experiments.md (a results file and the command that measured it), and
the code names that place. Scanned: every source, recipe and page template under src/attnconv
(.py, .yaml, .cpp, .h, .html), comments and docstrings included. Not scanned: the data files
shipped beside them (a pretrained model's card.json records its measured accuracy by design).

Each pattern is narrow enough that the tree has no false positive; the examples below pin what
each one catches and what it leaves alone. A hit is fixed in the code, never allowed here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnconv"
SUFFIXES = (".py", ".yaml", ".cpp", ".h", ".html")

FIGURES = {
    "a speed or error ratio": r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x (?:faster|slower|"
    r"the (?:plain|dense|reference) path|its [\w' ]*error)",
    "a measured ratio": r"\bmeasured [^.;\n]{0,40}?\b\d+(?:\.\d+)?x\b",
    "a time": r"\b\d+(?:\.\d+)? ?(?:ms|µs)\b",
    "an approximate duration": r"~ ?\d[\d,.]* ?(?:s|ms|min|h)\b|\b\d+(?:\.\d+)? ?(?:h|min) of "
    r"(?:one|a|an)\b",
    "a throughput": r"\b\d[\d,.]* ?(?:img/s|images/s|[GMK]i?B/s|[GT]FLOP/s)",
    "a GPU's run": r"\b(?:H100|H200|A100|V100|A10G|L40S?)\b",
    "an accuracy": r"\b\d+\.\d+ ?%",
    "a share of a run": r"\b\d+ ?% of (?:its|the|a|each) [\w ]*?(?:step|run|time|training)",
    "accuracy points": r"\b\d+(?:\.\d+)?[- ]points?\b",
    "a list of accuracies": r"\b\d\d\.\d(?:/\d\d\.\d)+\b|\b\d\d\.\d vs \d\d\.\d\b",
    "a date": r"\b20\d\d-\d\d-\d\d\b",
}
ISSUES = {
    "an issue number": r"(?i)\b(?:issues?|PRs?|pull requests?) ?#?\d+",
    "a #number": r"(?<![&\w])#\d+\b",  # not in .html: there #RGB is a colour
}
PATTERNS = {name: re.compile(p) for name, p in {**FIGURES, **ISSUES}.items()}


def hits(text: str, suffix: str = ".py") -> list[tuple[int, str, str]]:
    """(line number, pattern name, the match) of every hit in ``text``."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for name, pattern in PATTERNS.items():
            if name == "a #number" and suffix == ".html":
                continue
            out += [(i, name, m.group(0)) for m in pattern.finditer(line)]
    return out


@pytest.mark.parametrize(
    "text",
    [
        "1.08-1.13x faster at 1 thread",
        "c10's conversions keep it scalar (14x slower, measured)",
        "came out at up to 6x the plain path's error",
        "up to 2.3x its float32 error",
        "the blocks measured 0.96x, so the batch runs whole",
        "about 50 ms",
        "~28 h of one Zen 4 core",
        "95 img/s measured",
        "where one H100 run measured it faster",
        "Table 1: 93.8%, 12.1M params",
        "took about 15% of its CPU training step",
        "their 0.9-point gap",
        "paper, ImageNet: 76.4/77.2/77.4",
        "paper: 76.9 vs 77.4",
        "measured on 2026-11-28",
        "issue 45's goals",
        "Issue 17 anchors",
        "fixed in #83",
    ],
)
def test_each_pattern_catches_its_kind(text):
    assert hits(text), text


@pytest.mark.parametrize(
    "text",
    [
        "a 3x3 kernel at 32x32 and 64x64 tokens",
        "bottleneck widths; block output = 4x",
        "learning rate 0.03 (0.3x the reference's 0.1)",
        "float32 >= 1.5x and bf16 autocast >= 10x the reference's float32 step",
        "contours holding 50% (solid) and 90% (dashed) of each head's mass",
        "with a 30% warm-up (300 steps to lr 0.1)",
        "0.332M parameters against 0.349M (0.95x)",
        "train for ~2 minutes",
        "#include <cstdint>",
        "model.layers.0.attn",
    ],
)
def test_the_patterns_leave_plain_facts_alone(text):
    assert not hits(text), hits(text)


def test_a_colour_in_a_page_is_no_issue_number():
    assert not hits('body { color: #222; } ["#000", 3]', ".html")
    assert hits("see #222", ".py")


def test_no_figure_or_issue_number_in_shipped_code():
    files = sorted(p for p in SRC.rglob("*") if p.suffix in SUFFIXES)
    assert len(files) > 100 and any(p.suffix == ".cpp" for p in files)
    found = [
        f"{p.relative_to(SRC.parent)}:{i}: {name}: {match!r}"
        for p in files
        for i, name, match in hits(p.read_text(), p.suffix)
    ]
    assert not found, (
        "a measured figure or an issue number in shipped code (move the figure to "
        "docs/benchmarks.md or docs/experiments.md and name it there):\n" + "\n".join(found)
    )
