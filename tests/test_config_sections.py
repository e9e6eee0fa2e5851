"""Config sections and ``base:``: an empty section (``train:`` with everything under it commented
out) changes nothing, a section that is not a mapping and a ``base:`` that is not a path are one
line naming the file or the ``--set`` (they used to reset the section to the built-in defaults
silently, or fail with a Python TypeError)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnconv.catalog import RECIPES
from attnconv.train.config import config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
BASE = RECIPES / "cpu" / "sa_quadratic.yaml"  # train: epochs 3, batch_size 50; data sample


def _yaml(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("{base}", str(BASE)))
    return path


def _kept(cfg) -> None:
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.data.dataset) == (3, 50, "sample")


def test_an_empty_section_keeps_the_base(tmp_path):
    _kept(load_config(_yaml(tmp_path, "base: {base}\ntrain:\n#  epochs: 5\ndata:\n")))


def test_an_empty_section_in_a_middle_file_keeps_the_base(tmp_path):
    _yaml(tmp_path, "base: {base}\ntrain:\n", "mid.yaml")
    cfg = load_config(_yaml(tmp_path, "base: mid.yaml\ntrain:\n  epochs: 4\n"))
    assert (cfg.train.epochs, cfg.train.batch_size) == (4, 50)


def test_an_empty_section_without_a_base_is_the_defaults_and_takes_overrides(tmp_path):
    path = _yaml(tmp_path, "train:\n")
    assert load_config(path).train.epochs == 300
    cfg = load_config(path, ["train.epochs=4"])
    assert (cfg.train.epochs, cfg.train.batch_size) == (4, 100)
    assert config_from_dict({"train": None}).train.epochs == 300


@pytest.mark.parametrize("value", ["0", "false", "5", "[1]", "abc", "''"])
def test_a_section_that_is_not_a_mapping_names_the_file(tmp_path, value):
    path = _yaml(tmp_path, "base: {base}\ntrain: " + value + "\n")
    with pytest.raises(ValueError, match=r"run\.yaml: config section 'train' must be a mapping"):
        load_config(path)


@pytest.mark.parametrize("item", ["train=", "train=0", "data=false", "optim=[1]", "model=x"])
def test_a_section_override_that_is_not_a_mapping_names_the_override(item):
    section = item.split("=")[0]
    with pytest.raises(ValueError) as e:
        load_config(BASE, [item])
    msg = str(e.value)
    assert msg.startswith(f"override {item!r}: config section {section!r} must be a mapping, got")
    assert "\n" not in msg


def test_a_section_override_merges_into_the_base():
    _kept(load_config(BASE, ["train=null"]))
    cfg = load_config(BASE, ["train={epochs: 7}"])
    assert (cfg.train.epochs, cfg.train.batch_size) == (7, 50)
    # model.kwargs is not a section: an override of it replaces it whole (as before)
    assert load_config(BASE, ["model.kwargs={hidden_size: 32}"]).model.kwargs == {"hidden_size": 32}


def test_a_stored_section_that_is_not_a_mapping_is_refused():
    with pytest.raises(TypeError, match=r"config section 'train' must be a mapping, got 0"):
        config_from_dict({"train": 0})


@pytest.mark.parametrize("value", ["5", "[a]", "{x: 1}", "true", "''"])
def test_a_base_that_is_not_a_path_names_the_key_and_the_file(tmp_path, value):
    path = _yaml(tmp_path, "base: " + value + "\n")
    with pytest.raises(ValueError, match=r"run\.yaml: 'base' must be the path of a config file"):
        load_config(path)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("base: 5\n", r"run\.yaml: 'base' must be the path of a config file, got 5"),
        ("base: {base}\ntrain: 0\n", r"run\.yaml: config section 'train' must be a mapping"),
    ],
)
def test_train_says_it_in_one_line(tmp_path, capsys, text, pattern):
    from attnconv.cli import main

    path = _yaml(tmp_path, text)
    # refused while reading the config: the missing dataset is never looked at (and a config
    # that is wrongly accepted fails there at once instead of training 300 default epochs)
    data = f"data.dataset={tmp_path / 'none.zip'}"
    assert main(["train", str(path), "--set", data, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("attnconv train: error: ") and re.search(pattern, err)
    assert not (tmp_path / "run").exists()  # refused before anything is written
