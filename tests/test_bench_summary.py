"""The benchmarks pages' generated parts equal the committed results files they are read from
(benchmarks/bench_summary.py): docs/benchmarks.md's summary, and each area page's table of the
results files it cites with their machine, torch, date and command
(benchmarks/results/provenance.json). A stale page: `python benchmarks/bench_summary.py --docs`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_summary as bs  # noqa: E402

STALE = "stale: `python benchmarks/bench_summary.py --docs`"
FIELDS = {"cpu", "flags", "torch", "date", "date_of", "command", "record"}


def test_the_summary_equals_its_files():
    page = bs.SUMMARY_PAGE.read_text()
    assert bs.block(page, bs.SUMMARY) == bs.summary(), "docs/benchmarks.md's summary is " + STALE


@pytest.mark.parametrize("page", bs.AREA_PAGES, ids=lambda p: p.name)
def test_each_area_page_lists_the_files_it_cites(page):
    text = page.read_text()
    assert bs.block(text, bs.SOURCES) == bs.sources(text), f"{page.name}'s table is " + STALE
    assert bs.cited(text), f"{page.name} cites no results file"


def test_every_results_file_has_its_provenance():
    """Each results file of benchmarks/results/ (the experiments page's files aside) has an
    entry, and each entry a file; every entry has every field, a date, a command."""
    prov = bs.provenance()
    names = {
        bs.stem(p.name)
        for p in bs.RESULTS.iterdir()
        if p.suffix in (".md", ".json", ".jsonl")
        and p.name != "provenance.json"
        and not p.name.startswith(("experiments", "grid_width"))
    }
    assert names == set(prov), (names - set(prov), set(prov) - names)
    for name, entry in prov.items():
        assert FIELDS <= set(entry), (name, FIELDS - set(entry))
        assert re.fullmatch(r"20\d\d-\d\d-\d\d(; 20\d\d-\d\d-\d\d)*", entry["date"]), name
        assert entry["date_of"] in ("run", "commit") and entry["command"], name


def test_a_file_that_names_its_machine_is_logged_and_one_that_does_not_is_not():
    assert bs.logged({"cpu": "X (family 1, model 2)", "torch": "2", "date": "d", "command": "c"})
    assert not bs.logged({"cpu": None, "torch": "2", "date": "d", "command": "c"})
    assert bs.logged({"cpu": None, "torch": None, "date": "d", "command": "c", "static": "counts"})
    # the summary says which of its rows are unlogged
    prov = bs.provenance()
    for line in bs.summary().splitlines()[2:]:
        name = re.search(r"`(\w+)` \|$", line).group(1)
        assert ("(unlogged)" in line) != bs.logged(prov[name]), line


def test_every_area_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in bs.AREA_PAGES:
        assert f"benchmarks/{page.name}" in nav, page.name
    assert len(bs.AREA_PAGES) >= 6


def test_the_cited_files_are_read_from_code_spans_only():
    text = "see [Models](models.md) and `benchmarks/results/local.md`, `triton_sweep_3.9.0.jsonl`"
    assert bs.cited(text) == ["local", "triton_sweep"]
    assert json.loads((bs.RESULTS / "provenance.json").read_text())["about"]


def test_every_suite_file_names_its_machine_torch_date_and_command(tmp_path):
    """What a suite writes from now on (attnconv.bench.common.write_results): the JSON and the
    Markdown name the CPU with its family and model numbers and flags, torch, the day and the
    command; a key the suite set itself (the compile suite's date) is kept."""
    from attnconv.bench.common import write_results

    payload = {"command": "attnconv bench --suite x", "rows": []}
    path = write_results("x", payload, "| a |\n|---|", tmp_path)
    saved = json.loads(path.read_text())
    assert {"machine", "cpu_flags", "torch", "date", "command"} <= set(saved)
    assert re.fullmatch(r"20\d\d-\d\d-\d\d", saved["date"])
    line = (tmp_path / "x.md").read_text().strip().splitlines()[-1]
    assert line.startswith(f"Measured on {saved['machine']}") and saved["torch"] in line
    assert saved["date"] in line and "`attnconv bench --suite x`" in line
    kept = write_results("y", {**payload, "date": "2000-01-01", "device": "GPU 1"}, "t", tmp_path)
    assert json.loads(kept.read_text())["date"] == "2000-01-01"
    assert "Measured on GPU 1 (host: " in (tmp_path / "y.md").read_text()
