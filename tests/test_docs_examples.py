"""Every fenced code block of README.md and docs/*.md runs, or is checked, so an example cannot rot.

- A page's blocks run in order, in one temporary folder per page (with ``configs/`` linked in,
  as in a checkout), so an example may use what a command above it made (the run folder a
  training wrote). ``python`` blocks run in this process, each in a fresh namespace; a block
  preceded by the line ``<!-- no-test -->`` is not run (for a long computation; the opt-outs
  are listed and kept few). Every import statement of every block is also run alone in a fresh
  interpreter with attnconv's modules unloaded before it, so a documented import that does not
  exist, or only works after another one, fails.
- ``bash`` blocks: every command line is matched against Runner below; a line no policy knows
  fails the test (a new documented command needs a decision here). Run, with small sizes
  appended so they take seconds: ``attnconv train configs/cpu/...``, its ``--resume`` and
  ``--overwrite`` forms, ``attnconv eval`` and ``attnconv explore`` of that run,
  ``attnconv build-kernels``. Checked but not run, because a full run is too long, changes the
  environment, or is this very suite:
  ``pip install`` (the extras it names exist), ``python -m pytest`` (the full run is what CI
  runs, the quick run is the default, named tests exist), ``mkdocs build`` (CI builds it),
  ``attnconv demo`` (2 minutes; run for real by tests/test_demo.py), the paper-scale ``train
  configs/sa_*.yaml`` (300 epochs; its config and overrides are loaded and validated),
  ``torchrun`` (run for real by tests/test_distributed.py), ``hf download`` (the network: its
  form is checked, the folder it makes is built offline by tests/test_vit_weights_cli.py).
  Every ``attnconv`` line, run or not, is first parsed by the real argument parser.
- The one block without a language is the layout in docs/development.md (its paths, both
  ways: tests/test_development_recipes.py).
- Inline ``attnconv ...`` code spans in the prose: every subcommand and option they use exists.
"""

from __future__ import annotations

import argparse
import ast
import linecache
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attnconv.catalog import RECIPES, find_recipe, list_pretrained
from attnconv.cli import build_parser, main
from attnconv.train.config import load_config
from attnconv.train.distributed import RENDEZVOUS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NO_TEST = "<!-- no-test -->"
# the runs of the training commands, made small (seconds on a CPU)
SMALL = [
    "--set",
    "train.epochs=1",
    "--set",
    "train.steps_per_epoch=2",
    "--set",
    "data.max_per_class=10",
    "--set",
    "data.eval_max_per_class=2",
]
CI = (ROOT / ".ci" / "run").read_text()


def blocks(page: Path) -> list[tuple[str, str, bool]]:
    """(language, code, opted out) of every fenced block of ``page``, in order."""
    text = "\n" + page.read_text()
    found = re.finditer(r"^([^\n]*)\n```(\w*)\n(.*?)^```", text, re.M | re.S)
    return [(m[2], m[3], m[1].strip() == NO_TEST) for m in found]


def all_blocks(lang: str) -> list[str]:
    return [code for p in PAGES for kind, code, _ in blocks(p) if kind == lang]


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_pages_have_the_blocks_this_test_knows():
    kinds = {kind for p in PAGES for kind, _, _ in blocks(p)}
    assert kinds == {"", "bash", "python"}, f"new kind of code block: {kinds}"
    assert len(all_blocks("python")) >= 6 and len(all_blocks("bash")) >= 6
    readme = [kind for kind, _, _ in blocks(ROOT / "README.md")]
    assert readme.count("python") >= 4, "the README's examples"
    opted_out = [rel(p) for p in PAGES for _, _, off in blocks(p) if off]
    assert len(opted_out) <= 2, f"blocks not run: {opted_out}"


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
        cmd = shlex.join(argv)
        raise AssertionError(f"documented command does not parse: attnconv {cmd}") from e


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


class Runner:
    """What each documented command line does in the test (see the module docstring)."""

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
                a = str(RECIPES.parent / a)  # as a checkout spelled it: the recipe
            elif "PATH/cifar10-jpeg.zip" in a:  # the full CIFAR-10 the page points at
                a = a.replace("PATH/cifar10-jpeg.zip", str(self.cifar_zip))
            out.append(a)
        return out

    def __call__(self, argv: list[str]) -> None:
        prog, rest = argv[0], argv[1:]
        if prog == "pip":
            self.pip(rest)
        elif prog == "python" and rest[:2] == ["-m", "pytest"]:
            self.pytest(rest[2:])
        elif prog == "mkdocs":
            assert rest[0] in ("build", "serve") and (ROOT / "mkdocs.yml").is_file(), rest
            assert "mkdocs build --strict" in CI, ".ci/run does not build the documentation"
            self.done.append(f"checked: mkdocs {rest[0]}")
        elif prog == "torchrun":
            i = rest.index("attnconv.cli")
            assert rest[i - 1] == "-m" and "--nproc-per-node" in rest
            # the rendezvous the tests and the runner launch with (no fixed port to collide on)
            assert " ".join(RENDEZVOUS) in " ".join(rest[:i]), rest
            _parse(self.subst(rest[i + 1 :]))
            self.done.append("parsed: torchrun ... attnconv train")
        elif prog == "attnconv":
            self.attnconv(self.subst(rest))
        elif prog == "git":  # the development clone: shallow (the history is large)
            assert rest[:3] == ["clone", "--depth", "1"], rest
            self.done.append("checked: git clone --depth 1")
        elif prog == "hf":  # Hugging Face's download (network): its form only; the folder it
            # makes is what tests/test_vit_weights_cli.py builds offline and analyzes
            assert rest[0] == "download" and "--local-dir" in rest, rest
            repo, folder = rest[1], rest[rest.index("--local-dir") + 1]
            assert repo.startswith("google/vit-") and Path(folder).name == repo.split("/")[1]
            self.done.append(f"checked: hf download {repo}")
        else:
            raise AssertionError(f"documented command with no test policy: {shlex.join(argv)}")

    def pip(self, rest: list[str]) -> None:
        assert rest[0] == "install", rest
        deps = _pyproject()["project"]
        args = iter(rest[1:])
        for spec in args:
            if spec == "-e":
                continue
            if spec == "--index-url":  # PyTorch's CPU-only index, as pytorch.org gives it
                assert next(args) == "https://download.pytorch.org/whl/cpu"
                continue
            if spec.startswith("."):  # the project itself, with extras
                extras = re.findall(r"\[(.*)\]", spec)
                for extra in extras[0].split(",") if extras else []:
                    assert extra in deps["optional-dependencies"], f"no extra {extra!r}"
            else:
                name = re.split(r"[=<>]", spec)[0]
                assert any(d.startswith(name) for d in deps["dependencies"]), spec
        self.done.append(f"checked: pip {shlex.join(rest)}")

    def pytest(self, args: list[str]) -> None:
        """This suite: not run recursively. The full run is the line CI runs; the quick run is
        the configured default (slow tests left out); a named test exists."""
        ini = _pyproject()["tool"]["pytest"]["ini_options"]
        assert ini["testpaths"] == ["tests"]
        assert '-m "not slow"' in ini["addopts"], "the default run must leave out slow tests"
        cmd = shlex.join(["python", "-m", "pytest", *args]).replace("'", '"')
        if "-m" in args:
            assert re.search(rf"^{re.escape(cmd)}$", CI, re.M), f"`{cmd}` is not what CI runs"
        for a in args:
            if not a.startswith("-") and a.startswith("tests/"):
                path, _, name = a.partition("::")
                assert (ROOT / path).is_file(), a
                assert not name or f"def {name}(" in (ROOT / path).read_text(), a
        self.done.append(f"checked: {cmd}")

    def attnconv(self, argv: list[str]) -> None:
        args = _parse(argv)
        if args.command == "train" and args.config:  # a recipe's name: its file
            args.config = str(find_recipe(args.config))
            argv = [a if a != argv[1] else args.config for a in argv]
        if args.command == "demo":
            self.done.append("parsed: attnconv demo")  # the 2-minute run: tests/test_demo.py
        elif args.command == "train" and args.list:
            assert main(argv) == 0, argv
            self.done.append("ran: attnconv train --list")
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
        elif args.command == "build-kernels":  # the build the fused tests use anyway
            assert main(argv) == 0, argv
            self.done.append("ran: attnconv build-kernels")
        elif args.command in ("analyze", "explore") and getattr(args, "model", None):
            # pretrained weights the user has on disk: tests/test_vit_weights_cli.py runs these
            # commands on small saved models; here the registry name must exist
            from attnconv.models import list_models

            assert args.model in list_models(), args.model
            self.done.append(f"parsed: attnconv {args.command} --model {args.model}")
        elif (args.checkpoint if args.command == "eval" else getattr(args, "source", None)) in (
            list_pretrained()
        ):
            self.pretrained(args, argv)
        elif args.command in ("eval", "explore"):  # of the run trained above
            given = args.checkpoint if args.command == "eval" else args.source
            run = Path(given.replace("NAME", Path(self.config or "NAME").stem))
            assert run.is_dir(), f"attnconv {args.command} {given}: no such run"
            argv = [a if a != given else str(run) for a in argv]
            small = ["--max-per-class", "2"] if args.command == "eval" else ["--average", "4"]
            assert main([*argv, *small]) == 0, argv
            if args.command == "explore":
                assert Path(args.out).stat().st_size > 10_000, args.out
            self.done.append(f"ran: attnconv {args.command}")
        else:
            raise AssertionError(f"documented command with no test policy: attnconv {argv}")

    def pretrained(self, args: argparse.Namespace, argv: list[str]) -> None:
        """A shipped model by name: run, on the real test images where --data names them
        (else the embedded sample, as a user without the full set gets), at small sizes."""
        small = {
            "eval": ["--max-per-class", "2"],
            "explore": ["--average", "4", "--images", "1"],
            "analyze": ["--num-images", "4"],
            "convert": ["--num-images", "4", "--max-per-class", "2"],
        }[args.command]
        argv = [a.replace("PATH/cifar10-jpeg.zip", str(self.cifar_zip)) for a in argv]
        assert main([*argv, *small]) == 0, argv
        self.done.append(f"ran: attnconv {args.command} (pretrained)")


def run_python(code: str, where: str) -> None:
    linecache.cache[where] = (len(code), None, code.splitlines(True), where)  # for tracebacks
    exec(compile(code, where, "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=rel)
def test_page_blocks_run_in_order(page, tmp_path, monkeypatch, cifar_zip):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNCONV_CACHE", str(tmp_path / "cache"))
    (tmp_path / "configs").symlink_to(RECIPES)
    runner, ran = Runner(tmp_path, cifar_zip), 0
    for i, (kind, code, opted_out) in enumerate(blocks(page)):
        where = f"{rel(page)}, block {i + 1}"
        if kind == "python" and not opted_out:
            run_python(code, where)
            ran += 1
        elif kind == "bash":
            lines = _lines(code)
            assert lines, where
            before = len(runner.done)
            for argv in lines:
                runner(argv)
            assert len(runner.done) - before == len(lines), where
            ran += 1
    assert ran, f"{rel(page)}: no block ran"
    if any(d.startswith("ran: attnconv train CONFIG ['--resume']") for d in runner.done):
        assert (tmp_path / "runs" / Path(runner.config).stem / "metrics.csv").is_file()


def documented_imports() -> list[str]:
    """Every import statement of every python block (module level, as written)."""
    out = []
    for code in all_blocks("python"):
        tree = ast.parse(code)
        out += [ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    return sorted(set(out))


# Each statement alone, with attnconv unloaded first (torch stays loaded: it is not ours).
FRESH = """
import sys, attnconv
names = ["import attnconv; attnconv." + n for n in attnconv.__all__ if n != "__version__"]
for stmt in sys.argv[1:] + names:
    for m in [m for m in sys.modules if m == "attnconv" or m.startswith("attnconv.")]:
        del sys.modules[m]
    try:
        exec(stmt, {})
    except Exception as e:
        sys.exit(f"{stmt}: {type(e).__name__}: {e}")
print(len(sys.argv) - 1 + len(names))
"""


def test_every_documented_import_works_alone_in_a_fresh_interpreter():
    stmts = documented_imports()
    assert "from attnconv import load_model" in stmts
    assert any("RelativeEncoding" in s for s in stmts)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    r = subprocess.run(
        [sys.executable, "-c", FRESH, *stmts], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) >= len(stmts) + 10


def test_the_one_block_without_a_language_is_the_layout():
    """docs/development.md's layout; tests/test_development_recipes.py checks what it names."""
    (layout,) = all_blocks("")
    assert layout.startswith("src/attnconv/ ") and "\nbenchmarks/ tests/" in layout


def test_inline_commands_use_options_that_exist():
    """Inline `attnconv SUB ...` spans: SUB exists and every --option it shows is SUB's."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    text = "\n".join(p.read_text() for p in PAGES)
    spans = [s for s in re.findall(r"`(attnconv [^`]+)`", text) if not s.startswith("attnconv.")]
    assert len(spans) >= 10
    seen = set()
    for span in spans:
        words = span.split()
        sub = words[1]
        if not re.fullmatch(r"-*[a-z][a-z-]*", sub):  # a message quoted, e.g. `attnconv CMD: ...`
            continue
        if sub.startswith("-"):  # top-level option, e.g. --version
            assert sub in parser._option_string_actions, span
            continue
        assert sub in subs, f"the docs name `{span}`: no subcommand {sub!r}"
        seen.add(sub)
        head = words[: words.index("--")] if "--" in words else words
        for opt in (w.split("=")[0] for w in head[2:] if w.startswith("--")):
            assert opt in subs[sub]._option_string_actions, f"`{span}`: {sub} has no {opt}"
    assert seen == set(subs), f"subcommands the docs never show: {set(subs) - seen}"
