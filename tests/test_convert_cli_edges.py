"""`attnconv convert` edge cases that once went wrong (each test failed before its fix): a
--json report inside --out was dropped by the save, an --out the save cannot write failed only
after all the work (with a raw errno line), and --keep-unsupported failed whenever it kept one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch.nn as nn

from attnconv.cli import main
from attnconv.commands import convert as convert_cmd
from attnconv.convert import CONV_RULES
from attnconv.convert.rules import plain_spec


@pytest.mark.parametrize(
    "out, report, message",
    [
        ("o", "o/report.json", "--json o/report.json is inside --out o"),
        ("o", "o", "--json o is inside --out o"),
        ("../f.txt/o", None, "--out ../f.txt/o: ../f.txt is a file, not a folder"),
        ("model.safetensors", None, "saved as a folder; name a folder"),
        (".", None, "--out . is the current folder or one above it"),  # an empty one
    ],
    ids=["report-inside", "report-is-out", "under-a-file", "safetensors", "cwd"],
)
def test_out_that_saving_cannot_honour_is_refused_before_any_work(
    tmp_path, monkeypatch, capsys, out, report, message
):
    (tmp_path / "f.txt").write_text("mine")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(convert_cmd, "_load", never)
    argv = ["convert", "tiny_cnn", "--out", out] + (["--json", report] if report else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "f.txt"]  # nothing written
    assert not any((tmp_path / "cwd").iterdir())
    assert (tmp_path / "f.txt").read_text() == "mine"


def test_keep_unsupported_reports_the_converted_layers(monkeypatch, capsys):
    def rule(conv):  # misreads the 3-channel stem (drops its bias): the check refuses it
        spec = plain_spec(conv)
        return replace(spec, bias=None) if conv.in_channels == 3 else spec

    monkeypatch.setitem(CONV_RULES, nn.Conv2d, rule)
    assert main(["convert", "tiny_cnn", "--keep-unsupported", "--num-images", "4"]) == 0
    text = capsys.readouterr().out
    assert "1 convolutions -> self-attention" in text
    assert "kept as it is: conv1 (Conv2d)" in text and "\nconv2 " in text
