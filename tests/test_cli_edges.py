"""Command-line edge cases a new user met (each test failed before its fix): a demo on fewer
training images than a batch (a ZeroDivisionError traceback), a demo summary that named the
default model and schedule whatever --set said, a run folder given to `attnconv train` ("no such
config file"), --out paths refused only after all the work (explore, analyze, demo, bench, whose
results were lost), explore printing the image counts asked for rather than those on the page,
and benchmark-suite options after `--` taken unchecked (tracebacks, or silently ignored)."""

from __future__ import annotations

import argparse
import importlib
import zipfile

import pytest
import torch

from attnconv.commands import demo
from attnconv.models import create_model
from attnconv.train.checkpoint import save_checkpoint
from cli_run import run_cli


def _one_error_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines, err
    assert lines[-1].startswith(f"attnconv {command}: error: "), err
    assert [ln for ln in lines if "error" in ln.lower()] == [lines[-1]], err
    return lines[-1]


@pytest.fixture
def vit(tmp_path) -> str:
    torch.manual_seed(0)
    kw = dict(num_classes=10, depth=1, embed_dim=16, num_heads=2)
    model = create_model("vit_tiny_cifar", **kw)
    return str(save_checkpoint(tmp_path / "vit", model, "vit_tiny_cifar", kw))


@pytest.fixture
def never_loaded(monkeypatch):
    """analyze / explore must refuse their --out before the checkpoint and images are read."""

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before --out was checked")

    monkeypatch.setattr("attnconv.analysis.inputs.load_for_analysis", never)


@pytest.fixture
def fast_demo(monkeypatch, tmp_path):
    """The demo without its speed probe (a fixed, modest speed) and a 1 s training minimum."""
    monkeypatch.setenv("ATTNCONV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "_probe", lambda *a, **k: (100.0, 1000.0))
    monkeypatch.setattr(demo, "MIN_TRAIN_S", 1.0)


def test_demo_on_fewer_training_images_than_a_batch_is_one_line(fast_demo, tmp_path, capsys):
    out = tmp_path / "d"
    argv = ["demo", "--data", "sample", "--out", str(out), "--minutes", "0.1", "--no-figures"]
    code, _, err = run_cli([*argv, "--set", "data.max_per_class=2"], capsys)
    line = _one_error_line(err, "demo")
    assert code == 2 and "20 images, fewer than one batch of 50" in line, err
    assert not out.exists()


def test_demo_summary_names_the_model_and_schedule_it_trained(fast_demo, tmp_path, capsys):
    argv = ["demo", "--data", "sample", "--out", str(tmp_path / "d"), "--minutes", "0.05"]
    sets = ["model.kwargs.num_layers=2", "model.kwargs.num_heads=4", "schedule.name=multistep"]
    sets += ["data.eval_max_per_class=2"]
    code, out, err = run_cli([*argv, "--no-figures", *(f"--set={s}" for s in sets)], capsys)
    assert code == 0, err
    assert "It trained sa_quadratic (2 layers of 4 attention heads)" in out, out
    assert "followed its multistep schedule to the end (0.1 -> 0.1)" in out, out


def test_train_of_a_run_folder_says_it_is_a_folder(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  name: tiny_cnn\n")
    code, _, err = run_cli(["train", str(run)], capsys)
    line = _one_error_line(err, "train")
    assert code == 2 and f"{run} is a folder, not a config file" in line, line
    assert f"attnconv train {run / 'config.yaml'} --out {run} --resume" in line, line
    (run / "checkpoints" / "step-00000001").rmdir()  # no run saved there: no such advice
    line = _one_error_line(run_cli(["train", str(run)], capsys)[2], "train")
    assert line.endswith(f"{run} is a folder, not a config file"), line


@pytest.mark.parametrize("flag", [[], ["--resume"], ["--overwrite"]])
def test_train_never_replaces_the_users_config_in_its_run_folder(flag, tmp_path, capsys):
    """A hand-written OUT/config.yaml trained into OUT was replaced by the resolved config (its
    comments and base: gone); the previous run's own config.yaml is still accepted."""
    run = tmp_path / "run"
    run.mkdir()
    mine = (  # tiny: before the fix it trained (and replaced this file)
        "# my notes\nmodel: {name: tiny_cnn, kwargs: {width: 4}}\n"
        "data: {dataset: sample, max_per_class: 1, eval_max_per_class: 1}\n"
        "train: {epochs: 1, batch_size: 8, threads: 1}\n"
    )
    (run / "config.yaml").write_text(mine)
    code, _, err = run_cli(["train", str(run / "config.yaml"), "--out", str(run), *flag], capsys)
    line = _one_error_line(err, "train")
    assert code == 2 and "is the config.yaml that a run in" in line, line
    assert (run / "config.yaml").read_text() == mine and sorted(run.iterdir()) == [
        run / "config.yaml"
    ]


def test_a_runs_own_config_continues_it(tmp_path, capsys):
    """What the folder refusal advises works: the config.yaml a run wrote resumes that run."""
    run, cfg = tmp_path / "run", tmp_path / "c.yaml"
    cfg.write_text(
        "model: {name: tiny_cnn, kwargs: {width: 4}}\n"
        "data: {dataset: sample, max_per_class: 4, eval_max_per_class: 1}\n"
        "train: {epochs: 2, batch_size: 8, threads: 1}\n"
    )
    assert run_cli(["train", str(cfg), "--out", str(run), "--stop-at-step", "3"], capsys)[0] == 0
    code, out, err = run_cli(
        ["train", str(run / "config.yaml"), "--out", str(run), "--resume"], capsys
    )
    assert code == 0 and "resuming at step 3" in err, err


@pytest.mark.parametrize(
    "command, out, message",
    [
        ("explore", "page.html", "--out {tmp}/page.html is a folder; name a file"),
        (
            "explore",
            "f.txt/p.html",
            "--out {tmp}/f.txt/p.html: {tmp}/f.txt is a file, not a folder",
        ),
        ("analyze", "f.txt", "--out {tmp}/f.txt: {tmp}/f.txt is a file, not a folder"),
        ("analyze", "f.txt/figs", "--out {tmp}/f.txt/figs: {tmp}/f.txt is a file, not a folder"),
    ],
)
def test_analysis_out_is_refused_before_any_work(
    command, out, message, vit, never_loaded, tmp_path, capsys
):
    (tmp_path / "f.txt").write_text("mine")
    (tmp_path / "page.html").mkdir()
    code, _, err = run_cli([command, vit, "--data", "sample", "--out", str(tmp_path / out)], capsys)
    line = _one_error_line(err, command)
    assert code == 2 and line.endswith(message.format(tmp=tmp_path)), line
    assert (tmp_path / "f.txt").read_text() == "mine"


def test_demo_out_under_a_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("data read before --out was checked")

    monkeypatch.setattr("attnconv.data.load_dataset", never)
    (tmp_path / "f.txt").write_text("mine")
    for out in ("f.txt", "f.txt/run"):
        code, _, err = run_cli(["demo", "--out", str(tmp_path / out)], capsys)
        line = _one_error_line(err, "demo")
        assert code == 2 and line.endswith(f"{tmp_path}/f.txt is a file, not a folder"), line


def test_explore_prints_the_counts_the_page_holds(vit, cifar_zip, tmp_path, capsys):
    """A split of 3 images: the page holds 3 (not the 4 shown, 6 averaged asked for)."""
    data = tmp_path / "three"
    with zipfile.ZipFile(cifar_zip) as z:
        names = [n for n in z.namelist() if n.startswith("test/cat/") and n.endswith(".jpg")][:2]
        names += [n for n in z.namelist() if n.startswith("test/dog/") and n.endswith(".jpg")][:1]
        for n in names:
            (data / n).parent.mkdir(parents=True, exist_ok=True)
            (data / n).write_bytes(z.read(n))
    page = tmp_path / "p.html"
    argv = ["explore", vit, "--data", str(data), "--out", str(page), "--images", "4"]
    code, out, err = run_cli([*argv, "--num-images", "6"], capsys)
    assert code == 0, err
    assert out.strip().endswith("MB, 3 images, average of 3)"), out
    html = page.read_text()
    assert '"num_average":3' in html and html.count('"pixels"') == 3


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _suite_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """A benchmark suite's own parser, caught at its parse_args (nothing runs)."""
    real = argparse.ArgumentParser.parse_args

    def catch(self, *a, **k):
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(_Captured) as e:
        importlib.import_module(f"attnconv.bench.{name}").main([])
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", real)
    return e.value.parser


@pytest.mark.parametrize(
    "suite, argv, message",
    [
        ("layers", ["--threads", "0"], "argument --threads: must be >= 1, got 0"),
        ("local", ["--repeats", "-2"], "argument --repeats: must be >= 1, got -2"),
        ("layers", ["--budget-gb", "nan"], "argument --budget-gb: must be a finite number > 0"),
        ("models", ["--batch-cpu", "2", "0"], "argument --batch-cpu: must be >= 1, got 0"),
        ("convert", ["--net-size", "-3"], "argument --net-size: must be >= 1, got -3"),
        ("cuda", ["--inner", "0"], "argument --inner: must be >= 1, got 0"),
    ],
)
def test_suite_options_after_the_separator_are_checked(suite, argv, message, monkeypatch, capsys):
    parser = _suite_parser(suite, monkeypatch)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith(f"attnconv bench --suite {suite}: error: ")
    assert message in err[-1], err


def test_bench_out_that_is_a_file_is_refused_before_the_casesrun_cli(tmp_path, capsys, monkeypatch):
    import attnconv.bench.layers as layers

    def never(argv):
        raise AssertionError("the suite ran before --out was checked")

    monkeypatch.setattr(layers, "main", never)
    (tmp_path / "f.txt").write_text("mine")
    for out in ("f.txt", "f.txt/b"):
        code, _, err = run_cli(["bench", "--quick", "--out", str(tmp_path / out)], capsys)
        line = _one_error_line(err, "bench")
        assert code == 2 and line.endswith(f"{tmp_path}/f.txt is a file, not a folder"), line


def test_demo_into_a_folder_of_other_files_says_not_empty(tmp_path, capsys):
    """It said "a run is already there" of any non-empty folder."""
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = run_cli(["demo", "--out", str(tmp_path)], capsys)
    assert code == 2 and "not empty" in err and "a run is already there" not in err
    assert (tmp_path / "notes.txt").read_text() == "mine"
