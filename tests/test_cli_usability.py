"""The first hour of a user: help on every option, ``--device``, progress and the start-up
summary, ``--quiet`` (all in-process and on tiny models: seconds)."""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import pkgutil
import re
import time

import pytest
import torch
import yaml

import attnconv.bench
from attnconv.cli import build_parser, main
from attnconv.device import resolve_device
from attnconv.models import create_model
from attnconv.progress import Progress, configure_logging
from attnconv.train.checkpoint import save_checkpoint

HAS_CUDA = torch.cuda.is_available()


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _suite_parsers(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    """The argparse parser of every benchmark suite, caught at its parse_args (nothing runs)."""

    def catch(self, *a, **k):
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    out = {}
    for info in pkgutil.iter_modules(attnconv.bench.__path__):
        if info.name == "common":
            continue
        mod = importlib.import_module(f"attnconv.bench.{info.name}")
        if not hasattr(mod, "main"):
            continue
        with pytest.raises(_Captured) as e:
            mod.main([])
        out[f"bench --suite {info.name} --"] = e.value.parser
    return out


def _walk(parser: argparse.ArgumentParser, name: str, found: dict) -> None:
    found[name] = parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                _walk(sub, f"{name} {sub_name}".strip(), found)


def test_every_option_of_every_subcommand_has_help(monkeypatch):
    parsers: dict[str, argparse.ArgumentParser] = {}
    _walk(build_parser(), "", parsers)
    parsers.update(_suite_parsers(monkeypatch))
    assert {"train", "eval", "convert", "analyze", "explore", "demo", "bench"} <= set(parsers)
    assert {"bench --suite layers --", "bench --suite convert --"} <= set(parsers)
    missing = [
        f"attnconv {name} {'/'.join(a.option_strings) or a.dest}"
        for name, p in parsers.items()
        for a in p._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and not (a.help and a.help.strip() and a.help != argparse.SUPPRESS)
    ]
    assert missing == [], f"options without help: {missing}"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tpu", "not a device name"),
        ("meta", "unsupported device type 'meta'"),
        pytest.param(
            "cuda",
            "CUDA is not available here",
            marks=pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA"),
        ),
        pytest.param(
            "cuda:1",
            "CUDA is not available here",
            marks=pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA"),
        ),
        pytest.param(
            "cuda:64", "CUDA device", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
        ),
    ],
)
def test_resolve_device_refuses_what_is_not_there(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(spec)


def test_resolve_device_defaults():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cuda" if HAS_CUDA else "cpu")
    if not (torch.backends.mps.is_available()):
        with pytest.raises(ValueError, match="MPS backend is not available"):
            resolve_device("mps")


@pytest.fixture
def files(tmp_path):
    torch.manual_seed(0)
    model = create_model("tiny_cnn", num_classes=10, width=4)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, "tiny_cnn", {"num_classes": 10, "width": 4})
    cfg = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 4}},
        "data": {"dataset": "sample", "max_per_class": 4, "eval_max_per_class": 2},
        "train": {"epochs": 1, "batch_size": 8, "log_every": 1, "threads": 1},
        "out_dir": str(tmp_path / "run"),
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    return {"tmp": tmp_path, "ckpt": str(ckpt), "cfg": str(tmp_path / "c.yaml")}


BAD_DEVICE = "cuda:7" if not HAS_CUDA else "cuda:64"


@pytest.mark.parametrize("command", ["train", "eval", "convert", "analyze", "explore"])
def test_unavailable_device_is_one_line_before_any_work(command, files, capsys):
    tmp = files["tmp"]
    argv = {
        "train": ["train", files["cfg"]],
        "eval": ["eval", files["ckpt"], "--data", "sample"],
        "convert": ["convert", files["ckpt"], "--out", str(tmp / "conv")],
        "analyze": ["analyze", files["ckpt"], "--data", "sample", "--out", str(tmp / "an")],
        "explore": ["explore", files["ckpt"], "--data", "sample", "--out", str(tmp / "p.html")],
    }[command]
    capsys.readouterr()
    assert main([*argv, "--device", BAD_DEVICE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"attnconv {command}: error: --device {BAD_DEVICE}")
    for left in ("run", "conv", "an", "p.html"):  # nothing was written
        assert not (tmp / left).exists()


def test_eval_and_convert_on_cpu(files, capsys):
    capsys.readouterr()
    argv = ["eval", files["ckpt"], "--data", "sample", "--max-per-class", "2", "--device", "cpu"]
    assert main(argv) == 0
    assert "20 images: accuracy" in capsys.readouterr().out
    argv = ["convert", files["ckpt"], "--num-images", "4", "--device", "cpu"]
    assert main(argv) == 0
    assert "convolutions -> self-attention" in capsys.readouterr().out


def test_convert_out_never_deletes_what_it_did_not_write(files, tmp_path, capsys):
    """--out DIR holding anything but an earlier convert output is refused before any work
    (saving replaced the folder whole: a run or a user's notes were deleted); an earlier
    convert output is replaced, an empty folder filled."""
    notes = tmp_path / "mine" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("keep me")
    argv = ["convert", files["ckpt"], "--num-images", "2", "--device", "cpu", "--out"]
    assert main([*argv, str(notes.parent)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not an earlier `attnconv convert` output" in err[0], err
    assert notes.read_text() == "keep me" and sorted(notes.parent.iterdir()) == [notes]
    assert main([*argv, files["ckpt"]]) == 2  # a training checkpoint is not replaced either
    capsys.readouterr()
    out = tmp_path / "conv"
    out.mkdir()
    assert main([*argv, str(out)]) == 0  # empty: filled
    first = (out / "checkpoint.json").read_text()
    assert main([*argv, str(out)]) == 0  # an earlier convert output: replaced whole
    assert '"converted"' in first and (out / "checkpoint.json").is_file()
    assert {c.name for c in out.iterdir()} == {"checkpoint.json", "model.safetensors"}


def test_train_prints_a_startup_summary_and_progress_lines(files, capsys):
    """Not a terminal (captured): the summary block, then plain progress lines with elapsed
    time, ETA, rate and the training numbers; no carriage returns."""
    capsys.readouterr()
    assert main(["train", files["cfg"], "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    for field in ("model", "device", "dtype", "data", "steps", "run folder"):
        assert re.search(rf"^  {field} +\S", err, re.M), (field, err)
    assert re.search(r"^  model +tiny_cnn, 0\.\d+M parameters$", err, re.M), err
    assert re.search(r"^  device +cpu x1 process", err, re.M)
    assert re.search(r"^  steps +5 \(1 epoch\(s\) of 5 steps, batch 8\)", err, re.M), err
    assert f"run folder  {files['tmp'] / 'run'}" in err
    assert "eval acc" in err or "eval loss" in err
    assert main(["train", files["cfg"], "--resume"]) == 0  # says where it resumes, and that
    err = capsys.readouterr().err  # the run had finished there (was silent: issue 28)
    assert re.search(
        r"^  steps +5 \(.*\), resuming at step 5 \(the run had already finished: "
        r"nothing left to train\)$",
        err,
        re.M,
    ), err


def test_quiet_prints_no_status(files, capsys):
    capsys.readouterr()
    assert main(["--quiet", "train", files["cfg"], "--overwrite"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "run folder:" in captured.out
    configure_logging(0)  # as the next command would


def test_progress_lines_in_logs(caplog):
    """Not a terminal: one line per ``line_every_s`` and a last one, each with done/total,
    elapsed, ETA, rate and the caller's numbers."""
    log = logging.getLogger("attnconv.test_progress")
    log.propagate = True
    with caplog.at_level(logging.INFO, logger="attnconv.test_progress"):
        with Progress(4, "work", unit="step", logger=log, line_every_s=0.0) as p:
            for i in range(4):
                p.update(1, loss=f"{1.0 / (i + 1):.3f}")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines  # four updates and the closing line
    assert re.fullmatch(
        r"work: 4/4 \[00:00 elapsed, ETA 00:00, +[\d.]+(step/s|s/step), loss 0\.250\]", lines[-1]
    ), lines[-1]
    assert lines[0].startswith("work: 1/4 [") and "loss 1.000" in lines[0]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_bar_is_redrawn_while_a_step_runs(monkeypatch):
    """On a terminal the bar is redrawn every REFRESH_S even without an update, so elapsed
    time moves while one long step runs."""
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    with Progress(3, "slow", unit="step") as p:
        p.update(1, loss="2.000")
        before = tty.getvalue().count("\r")
        time.sleep(1.3)
        redraws = tty.getvalue().count("\r") - before
    assert redraws >= 2, tty.getvalue()
    out = tty.getvalue()
    assert "slow:  33%|" in out and "1/3 [" in out and "loss 2.000" in out


@pytest.mark.parametrize("passed_over", [None, "this CPU has no bf16 instructions"])
def test_bf16_passed_over_says_why(passed_over, files, capsys, monkeypatch):
    """Where bf16 autocast would slow the step (device.bf16_passed_over gives the reason), the
    training runs in float32 and the start-up block's dtype line says why; elsewhere bf16
    autocast as asked."""
    import attnconv.device as device

    monkeypatch.setattr(device, "bf16_passed_over", lambda device: passed_over)
    capsys.readouterr()
    assert main(["train", files["cfg"], "--device", "cpu", "--set", "train.bf16=true"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("  dtype"))
    if passed_over is None:
        assert "bfloat16 autocast (float32 weights)" in line, line
    else:
        assert line.split()[1] == "float32" and f"passed over: {passed_over}" in line, line


def test_one_vocabulary_across_commands(files, capsys):
    """--json [PATH] (printed, or written to PATH) in eval and convert; --num-images (images
    averaged) in analyze and explore; --out (a folder) in bench too; the old spellings kept."""
    import json

    from attnconv.cli import build_parser

    tmp, ck = files["tmp"], files["ckpt"]
    assert main(["eval", ck, "--data", "sample", "--max-per-class", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        main(
            ["eval", ck, "--data", "sample", "--max-per-class", "1", "--json", str(tmp / "e.json")]
        )
        == 0
    )
    assert json.loads((tmp / "e.json").read_text())["accuracy"] == printed["accuracy"]
    assert main(["convert", ck, "--num-images", "2", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert isinstance(report, dict) and report
    parser = build_parser()
    for argv in (
        ["explore", ck, "--out", "p", "--num-images", "3"],
        ["explore", ck, "--out", "p", "--average", "3"],
    ):
        assert parser.parse_args(argv).average == 3
    for argv in (["bench", "--out", "d"], ["bench", "--out-dir", "d"]):
        assert parser.parse_args(argv).out_dir == "d"
