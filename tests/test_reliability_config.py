"""Issue 15, items 6 and 7: one config schema (types, ranges, finite numbers for every value),
YAML alias bombs and deep nesting refused, `train.threads` bounded, and a class name with `$...$`
drawn as text (never parsed as matplotlib math). Each bad value is a one-line error."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from attnconv.analysis import figures as F
from attnconv.cli import main
from attnconv.train.config import SCHEMA, Config, load_config

BAD = [
    ("optim.lr=.nan", "'optim.lr' must be a finite number"),
    ("optim.lr=.inf", "'optim.lr' must be a finite number"),
    ("optim.lr=1e300", "'optim.lr' must be in (0, 1000000]"),
    ("optim.lr=0", "'optim.lr' must be in (0, 1000000]"),
    ("optim.weight_decay=-1e-4", "'optim.weight_decay' must be in [0, 1000000]"),
    ("optim.momentum=1.5", "'optim.momentum' must be in [0, 1]"),
    ("optim.betas=[0.9, 1.0]", "'optim.betas[1]' must be in [0, 1)"),
    ("optim.betas=[0.9]", "'optim.betas' needs 2 values"),
    ("optim.eps=0", "'optim.eps' must be in (0, 1]"),
    ("optim.no_decay=[1]", "'optim.no_decay': item 0 must be a str"),
    ("schedule.min_lr=-0.1", "'schedule.min_lr' must be >= 0"),
    ("schedule.gamma=.nan", "'schedule.gamma' must be a finite number"),
    ("schedule.milestones=[-1]", "'schedule.milestones[0]' must be in [0, 2147483648]"),
    ("schedule.milestones=[1.5]", "'schedule.milestones': item 0 must be a int"),
    ("schedule.warmup=1", "'schedule.warmup' must be in [0, 1)"),
    ("schedule.name=linear", "'schedule.name' must be one of cosine, multistep, constant"),
    ("train.time_limit=.nan", "'train.time_limit' must be a finite number"),
    ("train.time_limit=0", "'train.time_limit' must be > 0"),
    ("train.steps_per_epoch=0", "'train.steps_per_epoch' must be in [1, 2147483648]"),
    ("train.grad_clip=.nan", "'train.grad_clip' must be a finite number"),
    ("train.threads=100000", "'train.threads' must be in [1, 1024]"),
    ("train.seed=-1", "'train.seed' must be in [0, 9223372036854775807]"),
    ("train.label_smoothing=1", "'train.label_smoothing' must be in [0, 1)"),
    ("data.crop_padding=-5", "'data.crop_padding' must be in [0, 1024]"),
    ("data.std=[0.2, 0, 0.2]", "'data.std[1]' must be in (0, 1000000]"),
    ("data.mean=[0.5, .nan, 0.5]", "'data.mean[1]' must be a finite number"),
    ("data.max_per_class=0", "'data.max_per_class' must be in [1, 2147483648]"),
    ("data.eval_split=../../etc", "'data.eval_split' must be a plain name (no path)"),
    ("data.dataset=''", "'data.dataset' must be a non-empty name"),
    ("model.kwargs={width: .inf}", "'model.kwargs.width' must be a finite number"),
]


@pytest.mark.parametrize("override, message", BAD)
def test_every_bad_value_is_one_clear_line(override, message):
    with pytest.raises((ValueError, TypeError), match="^config key " + _re(message)) as e:
        load_config(None, [override])
    assert "\n" not in str(e.value)


def _re(s: str) -> str:
    import re

    return re.escape(s.removeprefix("config key "))


def test_the_schema_covers_every_number_and_list():
    """One schema: every int / float / list option has a rule (ranges, lengths, finiteness)."""
    for section in dataclasses.fields(Config):
        sub = section.default_factory
        if sub is dataclasses.MISSING:
            continue
        for f in dataclasses.fields(sub):
            t = str(f.type)
            if t.startswith(("int", "float", "list")):
                assert f"{section.name}.{f.name}" in SCHEMA, f"{section.name}.{f.name}"


def test_cli_bad_value_exit_2_one_line(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  epochs: 1\n")
    for bad in ("data.crop_padding=-5", "train.threads=100000", "train.time_limit=.nan"):
        assert main(["train", str(cfg), "--set", bad, "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnconv train: error: config key") and "\n" not in err, err
    assert not (tmp_path / "r").exists()  # nothing created for a refused config


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """A billion-laughs config (9 levels of 9 aliases: 9**9 items once expanded) is refused while
    parsing, never expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("optim:\n  no_decay: *a8")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"YAML aliases \(\*a0\) are not allowed in a config"):
        load_config(f)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ValueError, match=r"override 'optim.no_decay=&a \[x, \*a\]': YAML alias"):
        load_config(None, ["optim.no_decay=&a [x, *a]"])


def test_a_key_written_twice_is_refused(tmp_path):
    """YAML keeps the last of two equal keys silently: a second ``train:`` section dropped the
    first one's settings. Refused with the key and its line, in a file, a section and --set."""
    f = tmp_path / "twice.yaml"
    f.write_text("train:\n  epochs: 2\nmodel:\n  name: tiny_cnn\ntrain:\n  batch_size: 4\n")
    with pytest.raises(ValueError, match=r"twice.yaml: key 'train' is written twice \(line 5\)"):
        load_config(f)
    f.write_text("train:\n  epochs: 2\n  epochs: 3\n")
    with pytest.raises(ValueError, match=r"key 'epochs' is written twice \(line 3\)"):
        load_config(f)
    with pytest.raises(ValueError, match=r"key 'a' is written twice"):
        load_config(None, ["model.kwargs={a: 1, a: 2}"])


def test_deep_nesting_is_refused(tmp_path):
    f = tmp_path / "deep.yaml"
    f.write_text("model:\n  kwargs:\n    x: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ValueError, match="YAML nested too deeply|nested more than 8 levels"):
        load_config(f)
    with pytest.raises(ValueError, match=r"'model.kwargs.x\[0\].*' is nested more than 8 levels"):
        load_config(None, ["model.kwargs.x=" + "[" * 12 + "]" * 12])


@pytest.mark.parametrize("text", [r"class $\x$", r"$\frac{$", "a $b$ c $"])
def test_class_names_with_dollars_are_drawn_as_text(tmp_path, text):
    """analyze puts class names and folder names into titles: `$...$` is text, never math."""
    maps = [torch.softmax(torch.randn(2, 16), -1).reshape(2, 4, 4)]
    out = F.plot_query_maps(maps, (1, 1), (4, 4), tmp_path / "q.png", title=text)
    assert out.is_file()
    out = F.plot_mean_distance([torch.rand(2)], tmp_path / "d.png", title=text)
    assert out.is_file()
