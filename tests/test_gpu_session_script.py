"""benchmarks/gpu_session.sh, the prepared run for a lent GPU (minutes at a time, rarely), stays
runnable: the test files it names exist, and every `attnconv` command in it parses with the real
parsers, its suite options included (nothing here needs a GPU)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from attnconv.bench import cuda
from attnconv.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "benchmarks" / "gpu_session.sh").read_text()


def _gpu_values() -> dict[str, str]:
    """The script's variables as a GPU run sets them (the first assignment of each; a dry run
    sets some again)."""
    values: dict[str, str] = {}
    for name, value in re.findall(r"\b([A-Z_]+)=(\d+)\b", SCRIPT):
        values.setdefault(name, value)
    return values


def _commands() -> list[list[str]]:
    text = SCRIPT.replace("\\\n", " ")
    for name, value in sorted(_gpu_values().items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"${name}", value)
    out = []
    for line in text.splitlines():
        if "-m attnconv.cli" in line:
            words = shlex.split(line.split("-m attnconv.cli", 1)[1].split("2>&1")[0])
            out.append([w.replace("$OUT", "out") for w in words if w != "$DRY"])
    return out


def test_the_tests_it_runs_exist():
    named = re.findall(r"tests/[\w/]+\.py", SCRIPT)
    assert named and all((ROOT / n).is_file() for n in named), named


def test_the_scripts_it_runs_exist():
    """benchmarks/gpu_goals.py among them: the goals read from what the run wrote."""
    named = re.findall(r"\$py (benchmarks/[\w/]+\.py)", SCRIPT)
    assert "benchmarks/gpu_goals.py" in named and all((ROOT / n).is_file() for n in named), named


def test_its_commands_parse(monkeypatch):
    from attnconv.commands.bench import suite_argv

    cmds = _commands()
    assert len(cmds) >= 2
    parser = build_parser()
    real = argparse.ArgumentParser.parse_args

    class Parsed(Exception):
        pass

    def capture(self, a=None, namespace=None):  # the suite's own parser, stopped after parsing
        raise Parsed(real(self, a, namespace))

    for argv in cmds:
        args = parser.parse_args(argv)
        assert args.command == "bench" and args.suite == "cuda"
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(Parsed) as e:
            cuda.main(suite_argv(args))  # what `attnconv bench` hands the suite
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", real)
        ns = e.value.args[0]
        assert ns.only in ("models", "content", "local") and ns.out_dir == "out"
        assert args.repeats >= 3  # a GPU run's medians (a dry run times each call once)
        assert ns.mode == ("train" if ns.only == "local" else "both")


def test_each_test_it_names_by_node_exists():
    """A renamed test named FILE::NAME would make pytest stop with an error, not run the rest."""
    for path, name in re.findall(r"(tests/[\w/]+\.py)::(\w+)", SCRIPT):
        names = re.findall(r"^def (test_\w+)", (ROOT / path).read_text(), flags=re.M)
        assert name in names, (path, name)


def test_each_k_selection_names_tests_that_exist():
    """A renamed test would make a `-k` step select nothing and pass in silence."""
    for path, expr in re.findall(r"(tests/[\w/]+\.py) -k (\w+)", SCRIPT.replace("\\\n", " ")):
        names = re.findall(r"^def (test_\w+)", (ROOT / path).read_text(), flags=re.M)
        assert any(expr in n for n in names), (path, expr)


def test_its_timeouts_fit_one_lent_call():
    """The steps' timeouts add up to at most 390 s before the goals' 30: the script ends within
    420 s, so a 15-minute device budget holds a machine's start, one run and a rerun; the paper
    models' step runs first."""
    steps = [int(t) for t in re.findall(r"^timeout (?:\$\{\w+:-)?(\d+)\}? ", SCRIPT, flags=re.M)]
    fixed = [int(x) for x in re.findall(r"^timeout (\d+) ", SCRIPT, flags=re.M)]
    local = int(re.search(r"^LOCAL_S=(\d+)", SCRIPT, flags=re.M).group(1))
    assert len(steps) >= 4 and sum(fixed) + local + 40 <= 390, (fixed, local)
    # the tests' own time: what the steps above left of 390 s (30 s for the goals), at least 40
    assert "TESTS_S=$((390 - ($(date +%s) - START)))" in SCRIPT
    assert SCRIPT.index("--only models") < SCRIPT.index("tests/test_triton_axis.py -k")


@pytest.mark.slow
def test_the_script_runs_end_to_end_as_a_cpu_dry_run(tmp_path):
    """`DRY_RUN=1 bash benchmarks/gpu_session.sh` on the CPU: every step of the script (the
    suites with `--device cpu --quick`, the Triton kernels under the interpreter, 25 s of the
    CUDA tests) runs through its own shell and the suite's code, writes its files, and
    gpu_goals reads them, so a lent GPU's minutes are not spent finding an error in either.
    The figures of a dry run mean nothing."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, DRY_RUN="1", OUT=str(tmp_path), PYTHON=sys.executable)
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_session.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # the steps' own timeouts add to 575 s in a dry run
    )
    assert run.returncode == 0, run.stderr[-2000:]
    log = (tmp_path / "gpu_session.log").read_text()
    assert "Error" not in log.split("== CUDA tests")[0], log[-3000:]  # the suites' steps
    names = ("cuda_layers_content", "cuda_layers_local", "cuda_models")
    rows = {n: json.loads((tmp_path / f"{n}.json").read_text())["rows"] for n in names}
    assert not list(tmp_path.glob("*.partial.*"))  # a finished group leaves no partial file
    content = rows["cuda_layers_content"]
    assert len(content) == 8 and all(
        f"{k}_ms" in r for r in content for k in ("attnconv", "dense", "flash", "fold", "triton")
    )
    assert all("triton_ms" in r and "window_ms" in r for r in rows["cuda_layers_local"])
    paths = {(r["model"], r["path"]) for r in rows["cuda_models"] if "img_s" in r}
    assert ("sa_learned_content", "attnconv bf16 triton") in paths and len(paths) == 13
    # every path's ceiling but the Triton row's (the FLOP counter does not see its kernel)
    ceilings = {r["path"] for r in rows["cuda_models"] if r.get("ceiling_img_s", 0) > 0}
    assert ceilings == {"reference", "attnconv fp32", "attnconv bf16", "dense bf16"}
    tests = (tmp_path / "cuda_tests.log").read_text()
    assert " PASSED" in tests and " FAILED" not in tests
    assert "passed," in log and "0 failed" in log
    goals = (tmp_path / "gpu_goals.md").read_text()
    assert "CPU dry run" in goals and "not measured" in goals  # no memory on a CPU
    assert goals.splitlines()[0] in log  # the script printed the goals it wrote


def test_a_cut_short_content_run_keeps_the_goals_first_cases():
    """The content group runs bf16 training at 32x32 and 64x64 first (issue 45's 1.5x goals),
    both encodings each, inference last: the script's timeout cuts the least needed."""
    cases = cuda.content_cases(quick=False)
    first = [(c["train"], c["dtype"], c["hw"], c["positional"]) for c in cases[:4]]
    assert first == [
        (True, "bf16", hw, p) for hw in (32, 64) for p in ("quadratic", "relative_learned")
    ]
    modes = [(c["train"], c["dtype"]) for c in cases]
    assert modes == sorted(
        modes, key=[(True, "bf16"), (True, "fp32"), (False, "bf16"), (False, "fp32")].index
    )
    assert len(set(map(str, cases))) == len(cases) == 32
