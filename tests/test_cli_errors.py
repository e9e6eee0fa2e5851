"""Every `attnconv` subcommand with bad arguments, run as a real subprocess (issue 8).

Bad input never shows a traceback: argparse-level mistakes (unknown command or option, missing or
mistyped argument) print the usage and one ``error:`` line; mistakes found while running (missing
or foreign files, unknown model names or config keys, out-of-range values) print exactly one line
``attnconv COMMAND: error: ...`` on stderr. Both exit with code 2 and write nothing on stdout
that looks like a crash. The subprocesses run two at a time in one module fixture; their cases
are marked slow (the default run checks the others, in-process).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from attnconv.catalog import RECIPES
from attnconv.models import create_model
from attnconv.train.checkpoint import save_checkpoint
from cli_run import run_cli

ROOT = Path(__file__).resolve().parents[1]

# (id, argv with {tmp} placeholders, regex the last stderr line must match, usage error?)
USAGE = [
    ("unknown-command", ["frobnicate"], r"invalid choice: 'frobnicate'"),
    ("train-unknown-option", ["train", "{ok}", "--bogus"], r"unrecognized arguments: --bogus"),
    ("train-int-type", ["train", "{ok}", "--stop-at-step", "abc"], r"invalid int value: 'abc'"),
    ("eval-int-type", ["eval", "{ckpt}", "--batch-size", "x"], r"invalid int value: 'x'"),
    ("convert-float-type", ["convert", "tiny_cnn", "--alpha", "x"], r"invalid float value"),
    ("analyze-no-out", ["analyze", "{ckpt}"], r"required: --out"),
    ("explore-no-out", ["explore", "{ckpt}"], r"required: --out"),
    ("bench-int-type", ["bench", "--threads", "two"], r"invalid int value: 'two'"),
    ("demo-float-type", ["demo", "--minutes", "soon"], r"invalid float value: 'soon'"),
]
RUN = [
    # train: config files, keys, values, model names, data, resume
    ("train-no-config", ["train"], r"name a recipe or a YAML config"),
    ("train-missing-config", ["train", "{tmp}/nope.yaml"], r"nope.yaml: no such config file"),
    ("train-unknown-key", ["train", "{tmp}/typo.yaml"], r"unknown config key 'modle'.*model"),
    ("train-bad-yaml", ["train", "{tmp}/broken.yaml"], r"broken.yaml: invalid YAML"),
    (
        "train-unknown-override",
        ["train", "{ok}", "--set", "optim.lrr=0.1", "--out", "{tmp}/r1"],
        r"unknown config key 'optim.lrr'; did you mean optim.lr",
    ),
    (
        "train-override-type",
        ["train", "{ok}", "--set", "optim.lr=abc", "--out", "{tmp}/r2"],
        r"'optim.lr' must be a number, got 'abc'",
    ),
    (
        "train-unknown-model",
        ["train", "{ok}", "--set", "model.name=resnet99", "--out", "{tmp}/r3"],
        r"unknown model 'resnet99'",
    ),
    (
        "train-missing-data",
        ["train", "{ok}", "--set", "data.dataset={tmp}/none.zip", "--out", "{tmp}/r4"],
        r"none.zip: no such dataset",
    ),
    (
        "train-threads",
        ["train", "{ok}", "--set", "train.threads=0", "--out", "{tmp}/r5"],
        r"'train.threads' must be in \[1, 1024\]",
    ),
    ("train-out-is-a-file", ["train", "{ok}", "--out", "{ok}"], r"File exists"),
    (
        "train-resume-nothing",
        ["train", "{ok}", "--resume", "--out", "{tmp}/r6"],
        r"--resume: no checkpoint",
    ),
    # eval: missing, pickle, truncated checkpoints; data and split
    ("eval-missing", ["eval", "{tmp}/nothing"], r"nothing: missing checkpoint"),
    ("eval-pickle", ["eval", "{tmp}/weights.pt"], r"weights.pt: pickle checkpoint"),
    ("eval-truncated", ["eval", "{tmp}/trunc"], r"truncated checkpoint"),
    ("eval-missing-data", ["eval", "{ckpt}", "--data", "{tmp}/none.zip"], r"none.zip: no such"),
    (
        "eval-unknown-split",
        ["eval", "{ckpt}", "--data", "sample", "--split", "val"],
        r"no split 'val'",
    ),
    (
        "eval-class-count",
        ["eval", "{tmp}/two", "--data", "sample"],
        r"sample: 10 classes, the model predicts 2",
    ),
    (
        "eval-batch-size",
        ["eval", "{ckpt}", "--data", "sample", "--batch-size", "0"],
        r"--batch-size must be >= 1",
    ),
    (
        "eval-json-under-a-file",
        ["eval", "{ckpt}", "--data", "sample", "--json", "{ok}/x.json"],
        r"--json .*ok.yaml/x.json: .*ok.yaml is a file, not a folder",
    ),
    # convert: unknown model, bad options, pickle
    ("convert-unknown-model", ["convert", "resnet99"], r"unknown model 'resnet99'"),
    ("convert-pickle", ["convert", "{tmp}/weights.pt"], r"pickle checkpoint"),
    ("convert-head-dim", ["convert", "tiny_cnn", "--head-dim", "0"], r"--head-dim must be >= 1"),
    ("convert-alpha", ["convert", "tiny_cnn", "--alpha", "-1"], r"alpha must be > 0"),
    ("convert-threads", ["convert", "tiny_cnn", "--threads", "-1"], r"--threads must be >= 1"),
    ("convert-missing-path", ["convert", "{tmp}/no/run"], r"run: no such checkpoint"),
    ("convert-json-is-a-folder", ["convert", "tiny_cnn", "--json", "{tmp}"], r"is a folder"),
    (
        "convert-out-not-converted",
        ["convert", "tiny_cnn", "--out", "{tmp}/ckpt"],
        r"--out .*ckpt exists and is not an earlier `attnconv convert` output",
    ),
    # analyze / explore: checkpoints, ranges, output file
    ("analyze-truncated", ["analyze", "{tmp}/trunc", "--out", "{tmp}/an"], r"truncated"),
    (
        "analyze-image-range",
        ["analyze", "{sa}", "--out", "{tmp}/an", "--data", "sample", "--image", "100000"],
        r"--image 100000 is out of range",
    ),
    (
        "analyze-bad-centers-log",
        ["analyze", "{ckpt}", "--out", "{tmp}/an2", "--centers-log", "{ok}"],
        r"ok.yaml:1: bad centre-log line",
    ),
    (
        "analyze-out-is-a-file",
        ["analyze", "{ckpt}", "--out", "{ok}", "--data", "sample"],
        r"--out .*ok.yaml: .*ok.yaml is a file, not a folder",
    ),
    (
        "explore-not-html",
        ["explore", "{ckpt}", "--out", "{tmp}/page.txt", "--data", "sample"],
        r"--out must name an .html file",
    ),
    ("explore-missing", ["explore", "{tmp}/nothing", "--out", "{tmp}/p.html"], r"missing"),
    # bench (nothing is written: the options are refused first)
    ("bench-unknown-suite", ["bench", "--suite", "nosuch"], r"unknown benchmark suite 'nosuch'"),
    ("bench-repeats", ["bench", "--repeats", "0", "--out-dir", "{tmp}/b"], r"--repeats must be"),
    # demo
    (
        "demo-minutes",
        ["demo", "--minutes", "-1", "--out", "{tmp}/d1"],
        r"--minutes must be a finite number > 0",
    ),
    (
        "demo-missing-data",
        ["demo", "--data", "{tmp}/none.zip", "--out", "{tmp}/d2"],
        r"none.zip: no such dataset",
    ),
    (
        "demo-unknown-key",
        ["demo", "--set", "modle.name=x", "--out", "{tmp}/d3"],
        r"unknown config key 'modle'",
    ),
]
CASES = [(i, a, m, True) for i, a, m in USAGE] + [(i, a, m, False) for i, a, m in RUN]
# run as real subprocesses (each imports torch, ~1.2 s of CPU): every usage error (cheap) and at
# least one run-time error per subcommand; the others run in-process through attnconv.cli.main
SUBPROCESS = {i for i, *_ in USAGE} | {
    "train-unknown-key",
    "train-threads",
    "eval-truncated",
    "eval-class-count",
    "convert-unknown-model",
    "analyze-image-range",
    "explore-not-html",
    "bench-unknown-suite",
    "bench-repeats",
    "demo-unknown-key",
}


def _files(tmp: Path) -> dict[str, str]:
    torch.manual_seed(0)
    model = create_model("tiny_cnn", num_classes=10, width=4)
    ckpt = save_checkpoint(tmp / "ckpt", model, "tiny_cnn", {"num_classes": 10, "width": 4})
    trunc = save_checkpoint(tmp / "trunc", model, "tiny_cnn", {"num_classes": 10, "width": 4})
    w = Path(trunc) / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    two = create_model("tiny_cnn", num_classes=2, width=4)  # a 2-class model vs 10-class data
    save_checkpoint(tmp / "two", two, "tiny_cnn", {"num_classes": 2, "width": 4})
    torch.save(model.state_dict(), tmp / "weights.pt")  # a pickle: must be refused, not loaded
    (tmp / "ok.yaml").write_text("model:\n  name: tiny_cnn\ndata:\n  dataset: sample\n")
    (tmp / "typo.yaml").write_text("modle:\n  name: tiny_cnn\n")
    (tmp / "broken.yaml").write_text("model: [\n")
    kw = {"hidden_size": 16, "num_layers": 1, "num_heads": 2}  # attention: analyze reads it
    sa = save_checkpoint(
        tmp / "sa", create_model("sa_learned_content", **kw), "sa_learned_content", kw
    )
    return {"tmp": str(tmp), "ok": str(tmp / "ok.yaml"), "ckpt": str(ckpt), "sa": str(sa)}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return _files(tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def results(files):
    """Run every SUBPROCESS case once, two at a time: {id: (returncode, stdout, stderr)}."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")

    def run(case):
        cmd = [sys.executable, "-m", "attnconv.cli", *[a.format(**files) for a in case[1]]]
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, cwd=files["tmp"], env=env
        )
        return case[0], (p.returncode, p.stdout, p.stderr)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, [c for c in CASES if c[0] in SUBPROCESS]))


PARAMS = [
    pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[0] in SUBPROCESS else []) for c in CASES
]


@pytest.mark.parametrize("case", PARAMS)
def test_bad_arguments_exit_2_with_one_clear_line(case, files, request, capsys):
    name, argv, pattern, usage = case
    if name in SUBPROCESS:
        code, out, err = request.getfixturevalue("results")[name]
    else:
        code, out, err = run_cli([a.format(**files) for a in argv], capsys)
    assert "Traceback" not in err + out, err
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert lines, "no message on stderr"
    last = lines[-1]
    # argparse names the subcommand ("attnconv train: error:") except for unknown options
    prefix = "attnconv" if usage else f"attnconv {argv[0]}: error: "
    assert last.startswith(prefix) and ": error: " in last, last
    assert re.search(pattern, last), f"{pattern!r} not in {last!r}"
    if usage:  # argparse: usage lines, then the error
        assert err.startswith("usage: attnconv"), err
    else:  # a mistake found while running: exactly one error line (after any status lines
        # of the work done before it, e.g. "reading DATA"), no usage dump
        assert [ln for ln in lines if "error" in ln.lower()] == [last], err
        assert "usage:" not in err, err


def test_no_command_prints_help_and_exits_2():
    proc = subprocess.run(
        [sys.executable, "-m", "attnconv.cli"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "usage: attnconv" in proc.stdout and "COMMAND" in proc.stdout


def test_console_script_is_the_same_entry_point():
    """The installed `attnconv` script (pip install -e .) behaves like python -m attnconv.cli."""
    script = Path(sys.executable).with_name("attnconv")
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(script), "frobnicate"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'frobnicate'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_eval_of_a_config_file_says_it_is_a_config(capsys):
    from attnconv.cli import main

    cfg = str(RECIPES / "cpu" / "sa_quadratic.yaml")
    assert main(["eval", cfg]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "a training config, not a checkpoint" in last and "attnconv train" in last
