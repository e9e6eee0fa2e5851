"""benchmarks/README.md indexes every script of benchmarks/ (one line each: what it answers,
how to run it; the retired ones with the commit that last had them), and `attnconv bench --list`
prints the suites and that index, running nothing."""

from __future__ import annotations

import re
from pathlib import Path

from attnconv.bench import SUITES
from attnconv.cli import main
from attnconv.commands import bench as bench_cmd

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"


def _rows(section: str) -> list[str]:
    text = README.read_text()
    part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", part, re.M)


def test_the_index_names_every_script_once_and_only_scripts_that_exist():
    here = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    live = _rows("Tools") + _rows("The experiments pipeline")
    retired = _rows("Retired")
    assert len(live) == len(set(live)) and not set(live) & set(retired)
    assert set(live) == here, (here - set(live), set(live) - here)
    assert not set(retired) & here, "a retired script is still there"
    commits = re.findall(r"^\| `[^`]+` \| .+ \| ([0-9a-f]{7,}) \|$", README.read_text(), re.M)
    assert len(commits) == len(retired)


def test_bench_list_prints_the_suites_and_the_scripts(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in SUITES:
        assert f"\n  {name} " in out
    for name, what, how in bench_cmd.scripts():
        assert name in out and what in out and f"run: {how}" in out
    assert "`" not in out


def test_bench_list_without_a_source_checkout_says_so(tmp_path, monkeypatch):
    import attnconv.bench.common as common

    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "benchmarks" / "results")
    assert bench_cmd.scripts() is None
    text = bench_cmd.listing()
    assert "only in a source checkout" in text and all(name in text for name in SUITES)
