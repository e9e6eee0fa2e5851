"""The report's readers of a run's wall.json (benchmarks/experiments_report.py,
experiments_long.py) take a run for finished by the runner's own check
(``experiments_runs.finished``: complete JSON with its training seconds): a cut or empty
wall.json, as a copy or a write killed half-way leaves, is no finished run there either (the
report kept going on it, and the long-budget section stopped on the run's missing logs)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import experiments_long as long_  # noqa: E402
import experiments_report as report_  # noqa: E402

CUT = '{"train_seconds": 12'  # a write killed half-way


def test_table1_is_done_only_by_a_complete_wall_json(tmp_path, monkeypatch):
    monkeypatch.setattr(report_, "RUNS", tmp_path)
    run = tmp_path / "table1_resnet18"
    run.mkdir()
    for text in (CUT, "", "[]", '{"train_seconds": "12"}'):
        (run / "wall.json").write_text(text)
        assert not report_.table1_done(), text
    (run / "wall.json").write_text('{"train_seconds": 12.5}')
    assert report_.table1_done()


def test_the_long_budget_section_is_kept_for_a_cut_wall_json(tmp_path):
    for _, name in long_.RUNS_COMPARED:  # every compared run "finished", one of them cut
        (tmp_path / name).mkdir()
        (tmp_path / name / "wall.json").write_text('{"train_seconds": 1.0}')
    (tmp_path / long_.RUNS_COMPARED[-1][1] / "wall.json").write_text(CUT)
    lines: list[str] = []
    long_.long_budget(lines, tmp_path)  # no metrics.csv read: the section is kept as it was
    assert lines == long_.kept(long_.TITLE, "\n### ")
