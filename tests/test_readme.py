"""Every fenced code block of README.md runs, or is checked, so a README example cannot rot.

- ``python`` blocks: executed as they are, each in a fresh Python subprocess in an empty
  temporary folder (nothing borrowed from another block).
- ``bash`` blocks: every command line is matched against POLICY below; a line no policy
  knows fails the test (a new README command needs a decision here). Run fully, in a
  temporary folder, with small ``--set`` overrides appended so they take seconds:
  ``attnconv train configs/cpu/...``, its ``--resume`` and ``--overwrite`` forms and
  ``attnconv eval`` of that run. Checked but not run, because a full run is too long, changes
  the environment, or is this very suite: ``pip install`` (the extras it names exist),
  ``python -m pytest`` (this suite), ``attnconv demo`` (2 minutes; run for real by
  tests/test_demo.py), the paper-scale ``train configs/sa_*.yaml`` (300 epochs; its config and
  overrides are loaded and validated), ``torchrun`` (run for real by tests/test_distributed.py).
  Every ``attnconv`` line, run or not, is first parsed by the real argument parser.
- Blocks without a language (the layout): every path they name exists.
- Inline ``attnconv ...`` code spans in the prose: every option they use exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attnconv.cli import build_parser, main
from attnconv.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.M | re.S)
# the runs of the README's training block, made small (seconds on a CPU)
SMALL = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=2",
         "--set", "data.max_per_class=10", "--set", "data.eval_max_per_class=2"]  # fmt: skip


def _blocks(lang: str) -> list[str]:
    return [code for kind, code in BLOCKS if kind == lang]


def test_the_readme_has_the_blocks_this_test_knows():
    kinds = sorted({kind for kind, _ in BLOCKS})
    assert kinds == ["", "bash", "python"], f"new kind of README block: {kinds}"
    assert len(_blocks("python")) >= 2 and len(_blocks("bash")) >= 3


@pytest.mark.parametrize("code", _blocks("python"), ids=lambda c: c.splitlines()[0][:40])
def test_python_block_runs(code, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
           os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, f"README block failed:\n{code}\n{r.stderr[-3000:]}"


def _lines(code: str) -> list[list[str]]:
    """Each command of a bash block as argv (comments dropped, ``a && b`` split)."""
    out = []
    for line in code.splitlines():
        line = re.split(r"\s#", " " + line, maxsplit=1)[0].strip()
        for cmd in filter(None, (c.strip() for c in line.split("&&"))):
            out.append(shlex.split(cmd))
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    """The real parser; an unknown option or command fails here (SystemExit -> assertion)."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"README command does not parse: attnconv {shlex.join(argv)}") from e


class Runner:
    """What each README command line does in the test (see the module docstring)."""

    def __init__(self, tmp: Path, cifar_zip: Path):
        self.tmp, self.cifar_zip = tmp, cifar_zip
        self.config = None  # the last CPU config trained, what CONFIG stands for
        self.done: list[str] = []

    def subst(self, argv: list[str]) -> list[str]:
        out = []
        for a in argv:
            if a == "CONFIG":
                assert self.config, "CONFIG used before a training line"
                a = self.config
            elif a.startswith("configs/"):
                a = str(ROOT / a)
            elif "../shared/data/cifar10-jpeg.zip" in a:
                a = a.replace("../shared/data/cifar10-jpeg.zip", str(self.cifar_zip))
            out.append(a)
        return out

    def __call__(self, argv: list[str]) -> None:
        prog, rest = argv[0], argv[1:]
        if prog == "pip":
            self.pip(rest)
        elif prog == "python" and rest[:2] == ["-m", "pytest"]:
            # the suite this test belongs to: not run recursively; what it needs is declared
            pp = _pyproject()
            assert pp["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
            dev = pp["project"]["optional-dependencies"]["dev"]
            assert any(d.startswith("pytest") for d in dev)
            self.done.append("checked: python -m pytest")
        elif prog == "torchrun":
            i = rest.index("attnconv.cli")
            assert rest[i - 1] == "-m" and "--nproc-per-node" in rest
            _parse(self.subst(rest[i + 1 :]))
            self.done.append("parsed: torchrun ... attnconv train")
        elif prog == "attnconv":
            self.attnconv(self.subst(rest))
        else:
            raise AssertionError(f"README command with no test policy: {shlex.join(argv)}")

    def pip(self, rest: list[str]) -> None:
        assert rest[0] == "install", rest
        deps = _pyproject()["project"]
        for spec in rest[1:]:
            if spec == "-e":
                continue
            if spec.startswith("."):  # the project itself, with extras
                extras = re.findall(r"\[(.*)\]", spec)
                for extra in extras[0].split(",") if extras else []:
                    assert extra in deps["optional-dependencies"], f"no extra {extra!r}"
            else:
                name = re.split(r"[=<>]", spec)[0]
                assert any(d.startswith(name) for d in deps["dependencies"]), spec
        self.done.append(f"checked: pip {shlex.join(rest)}")

    def attnconv(self, argv: list[str]) -> None:
        args = _parse(argv)
        if args.command == "demo":
            self.done.append("parsed: attnconv demo")  # the 2-minute run: tests/test_demo.py
        elif args.command == "train" and "/configs/cpu/" in args.config + "/":
            self.config = args.config
            assert main([*argv, *SMALL]) == 0, argv
            self.done.append(f"ran: attnconv train {Path(args.config).name} {argv[2:]}")
        elif args.command == "train" and args.config == self.config:  # --resume / --overwrite
            assert main([*argv, *SMALL]) == 0, argv
            self.done.append(f"ran: attnconv train CONFIG {argv[2:]}")
        elif args.command == "train":  # paper scale: validate the config and overrides only
            load_config(args.config, args.overrides)
            self.done.append(f"loaded: {Path(args.config).name} {args.overrides}")
        elif args.command == "eval":
            run = Path(args.checkpoint.replace("NAME", Path(self.config).stem))
            assert run.is_dir(), f"attnconv eval {args.checkpoint}: no such run was trained"
            argv = [a if a != args.checkpoint else str(run) for a in argv]
            assert main([*argv, "--max-per-class", "2"]) == 0, argv
            self.done.append("ran: attnconv eval")
        elif args.command in ("analyze", "explore") and getattr(args, "model", None):
            # pretrained weights the user has on disk: tests/test_vit_weights_cli.py runs these
            # commands on small saved models; here the registry name must exist
            from attnconv.models import list_models

            assert args.model in list_models(), args.model
            self.done.append(f"parsed: attnconv {args.command} --model {args.model}")
        else:
            raise AssertionError(f"README command with no test policy: attnconv {argv}")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("index", range(len(_blocks("bash"))))
def test_bash_block_runs_or_parses(index, tmp_path, monkeypatch, cifar_zip, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNCONV_CACHE", str(tmp_path / "cache"))
    runner = Runner(tmp_path, cifar_zip)
    lines = _lines(_blocks("bash")[index])
    assert lines
    for argv in lines:
        runner(argv)
    assert len(runner.done) == len(lines)
    if any(d.startswith("ran: attnconv train CONFIG ['--resume']") for d in runner.done):
        assert (tmp_path / "runs" / Path(runner.config).stem / "metrics.csv").is_file()


def test_layout_block_names_what_exists():
    (layout,) = _blocks("")
    paths, folder = [], ROOT
    for line in layout.splitlines():
        if line and not line[0].isspace():  # "path/  what it holds" or "a/ b/ c/"
            first = line.split()[0]
            folder = ROOT / first if first.endswith("/") else folder
            paths += [ROOT / w for w in line.split() if w.endswith("/") or w == first]
        # files named in the description live in the line's folder
        paths += [folder / f for f in re.findall(r"\((\w+\.py)\)", line)]
    assert len(paths) >= 10
    for p in paths:
        assert p.exists(), f"README layout names {p.relative_to(ROOT)}, which does not exist"
    for suite in re.findall(r"--suite ([\w|]+)", layout)[0].split("|"):
        assert (ROOT / "src" / "attnconv" / "bench" / f"{suite}.py").is_file(), suite


def test_inline_commands_use_options_that_exist():
    """Inline `attnconv SUB ...` spans: SUB exists and every --option it shows is SUB's."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    spans = [s for s in re.findall(r"`(attnconv [^`]+)`", README) if not s.startswith("attnconv.")]
    assert len(spans) >= 10
    for span in spans:
        words = span.split()
        sub = words[1]
        if not re.fullmatch(r"-*[a-z][a-z-]*", sub):  # a message quoted, e.g. `attnconv CMD: ...`
            continue
        if sub.startswith("-"):  # top-level option, e.g. --version
            assert sub in parser._option_string_actions, span
            continue
        assert sub in subs, f"README names `{span}`: no subcommand {sub!r}"
        head = words[: words.index("--")] if "--" in words else words
        for opt in (w.split("=")[0] for w in head[2:] if w.startswith("--")):
            assert opt in subs[sub]._option_string_actions, f"`{span}`: {sub} has no {opt}"
