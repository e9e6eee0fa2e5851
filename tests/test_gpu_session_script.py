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


def _commands() -> list[list[str]]:
    text = SCRIPT.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if "-m attnconv.cli" in line:
            words = shlex.split(line.split("-m attnconv.cli", 1)[1].split("2>&1")[0])
            out.append([w.replace("$OUT", "out") for w in words])
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
        assert ns.mode == ("train" if ns.only == "local" else "both")


def test_each_k_selection_names_tests_that_exist():
    """A renamed test would make a `-k` step select nothing and pass in silence."""
    for path, expr in re.findall(r"(tests/[\w/]+\.py) -k (\w+)", SCRIPT.replace("\\\n", " ")):
        names = re.findall(r"^def (test_\w+)", (ROOT / path).read_text(), flags=re.M)
        assert any(expr in n for n in names), (path, expr)


def test_its_timeouts_fit_one_lent_call():
    """The steps' timeouts add up to less than the 540 s a run call is given (9 minutes,
    leaving the machine's start inside a 15-minute device budget)."""
    steps = [int(t) for t in re.findall(r"^timeout (\d+) ", SCRIPT, flags=re.M)]
    assert len(steps) >= 4 and sum(steps) <= 540, steps
