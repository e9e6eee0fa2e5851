"""Training configs, optimizer groups and schedules: unknown keys, bases and overrides, one-line
CLI errors, weight decay groups, the schedules, every shipped config valid, YAML numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import yaml

from attnconv.catalog import RECIPES
from attnconv.layers.encodings.centers import center_layers
from attnconv.train.config import Config, ScheduleConfig, load_config
from attnconv.train.optim import lr_at, no_decay_names


def test_unknown_config_key_lists_close_matches(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown config key 'optim.lrr'; did you mean optim.lr"):
        load_config(f)
    with pytest.raises(ValueError, match=r"'train.epoch'; did you mean train.epochs"):
        load_config(None, ["train.epoch=3"])
    with pytest.raises(TypeError, match="train.epochs' must be an integer"):
        load_config(None, ["train.epochs=1.5"])
    with pytest.raises(ValueError, match="must look like key=value"):
        load_config(None, ["optim.lr"])


def test_config_base_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("optim: {lr: 0.1, momentum: 0.8}\ntrain: {epochs: 300}\n")
    (tmp_path / "cpu.yaml").write_text("base: base.yaml\ntrain: {epochs: 2}\n")
    c = load_config(tmp_path / "cpu.yaml", ["optim.lr=0.05", "schedule.milestones=[1, 2]"])
    assert (c.optim.lr, c.optim.momentum, c.train.epochs) == (0.05, 0.8, 2)
    assert c.schedule.milestones == [1, 2]


def test_cli_bad_config_and_data_one_line(tmp_path, capsys, cifar_zip):
    from attnconv.cli import main

    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"train": {"epochs": 1}, "data": {"dataset": "sample"}}))
    assert main(["train", str(f), "--set", "optim.weight_decy=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean optim.weight_decay" in err
    assert main(["train", str(f), "--set", f"data.dataset={tmp_path / 'gone.zip'}"]) == 2
    assert "gone.zip: no such dataset" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such config file" in capsys.readouterr().err


class _Quadratic(nn.Module):
    def __init__(self):
        super().__init__()
        self.centers = nn.Parameter(torch.randn(4, 2))
        self.alpha = nn.Parameter(torch.ones(4))
        self.proj = nn.Linear(3, 3)

    def attention_centers(self) -> torch.Tensor:
        return self.centers


def test_no_weight_decay_on_norms_biases_centres():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), _Quadratic(), nn.LayerNorm(3))
    names = set(no_decay_names(m, ["centers", "alpha"]))  # names given in the config
    assert names == {
        "0.bias",
        "1.weight",
        "1.bias",
        "2.centers",
        "2.alpha",
        "2.proj.bias",
        "3.weight",
        "3.bias",
    }
    assert center_layers(m) == [m[2]]


def test_schedules():
    cos = ScheduleConfig(name="cosine", warmup=0.1)
    lrs = [lr_at(s, 1.0, cos, 100, 10) for s in range(100)]
    assert lrs[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])  # linear warm-up
    assert lrs[10] == 1.0 and lrs[55] == pytest.approx(0.5, abs=0.02) and lrs[-1] < 1e-3
    ms = ScheduleConfig(name="multistep", warmup=0.0, milestones=[2, 4], gamma=0.1)
    assert [lr_at(s, 1.0, ms, 60, 10) for s in (0, 19, 20, 39, 40)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01]
    )


@pytest.mark.parametrize("path", sorted((RECIPES).rglob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_are_valid(path):
    from attnconv.models import list_models

    cfg = load_config(path)
    assert isinstance(cfg, Config) and cfg.model.name in list_models()
    if path.parent.name == "cpu":  # the small models build and run with these kwargs
        from attnconv import create_model

        model = create_model(cfg.model.name, num_classes=10, **cfg.model.kwargs)
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_numbers_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads 1e-3 as a string; a float option takes it (users type it daily)."""
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 1e-3\n")
    cfg = load_config(f, ["optim.weight_decay=5E-4", "schedule.min_lr=+.5e-4"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.schedule.min_lr) == (1e-3, 5e-4, 5e-5)
    with pytest.raises(TypeError, match="'optim.lr' must be a number, got '1e-3x'"):
        load_config(f, ["optim.lr=1e-3x"])


def test_no_decay_takes_full_names_and_dotted_parts_and_refuses_what_names_nothing():
    """A full name as named_parameters() prints it excluded nothing before (entries matched one
    dotted component only), and a typo was silently ignored: weight decay stayed on."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3), _Quadratic())
    assert "1.proj.weight" in no_decay_names(m, ["1.proj.weight"])
    assert "1.proj.weight" in no_decay_names(m, ["proj.weight"])
    assert "0.weight" not in no_decay_names(m, ["proj.weight"])
    assert "1.proj.weight" in no_decay_names(m, ["1"])  # a module's prefix: all its parameters
    with pytest.raises(ValueError, match=r"optim.no_decay: 'cetners' names no parameter"):
        no_decay_names(m, ["centers", "cetners"])
