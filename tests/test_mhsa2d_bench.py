"""The layer benchmark runs end to end (tiny --quick sizes) through the CLI and writes its files."""

from __future__ import annotations

import json

import pytest

from attnconv.bench.common import MALLOC_POLICIES, run_case
from attnconv.cli import main


def test_bench_layers_quick_writes_json_and_table(tmp_path):
    assert main(["bench", "--suite", "layers", "--quick", "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "layers.json").read_text())
    assert data["matmul_peak_gflops"] > 0
    timed = [r for r in data["rows"] if "median_s" in r]
    assert len(timed) == len(data["rows"]) >= 10
    assert all(r["median_s"] > 0 and r["gflop"] > 0 for r in timed)
    names = " ".join(r["name"] for r in timed)
    assert "conv3x3" in names and "paper-code" in names and "reference" in names
    assert "| case |" in (tmp_path / "layers.md").read_text()


@pytest.mark.slow
def test_run_case_subprocess_measures_memory():
    res = run_case("attnconv.bench.common:_matmul_step", {"n": 256}, repeats=1, flops=False)
    assert res["median_s"] > 0 and res["peak_mb"] >= 0


@pytest.mark.slow
def test_malloc_policy_reaches_the_case_process(monkeypatch):
    for key in MALLOC_POLICIES["retain"]:  # the glibc case must not inherit them from here
        monkeypatch.delenv(key, raising=False)
    kw = dict(repeats=1, flops=False, memory=False)
    retain = run_case("attnconv.bench.common:_matmul_step", {"n": 64}, malloc="retain", **kw)
    assert retain["malloc_env"] == MALLOC_POLICIES["retain"]
    plain = run_case("attnconv.bench.common:_matmul_step", {"n": 64}, **kw)
    assert plain["malloc_env"] == {}


def test_unknown_suite_is_a_clear_error(capsys):
    assert main(["bench", "--suite", "nope"]) == 2
    err = capsys.readouterr().err
    assert (
        "unknown benchmark suite 'nope' (suites: layers, local, convert, models, compile, cuda)"
        in err
    )


def test_one_list_of_suites():
    """SUITES names every bench module that has a main(), and the command's help uses it."""
    import importlib
    import pkgutil

    import attnconv.bench
    from attnconv.bench import SUITES
    from attnconv.commands.bench import HELP

    mods = [
        importlib.import_module(f"attnconv.bench.{i.name}")
        for i in pkgutil.iter_modules(attnconv.bench.__path__)
    ]
    assert {m.__name__.rsplit(".", 1)[1] for m in mods if hasattr(m, "main")} == set(SUITES)
    assert ", ".join(SUITES) in HELP
