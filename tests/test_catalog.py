"""What ships beside the code (attnconv.catalog): recipes by name, pretrained weights with cards.

The pretrained tests run on the weights the package ships (every name list_pretrained() gives)
and, for what must be refused (a damaged weight file, an unknown name), on a real checkpoint of a
small model written into a catalog of the test's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

import attnconv
from attnconv import catalog
from attnconv.catalog import RECIPES, PretrainedError
from attnconv.models import create_model as build_model
from attnconv.train.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = catalog.list_pretrained()


# ---------------------------------------------------------------- recipes


def test_every_recipe_has_a_name_and_a_line():
    recipes = catalog.list_recipes()
    assert "cpu/sa_quadratic" in recipes and "experiments/grid_long" in recipes
    assert "sa_quadratic" in recipes and not any(n.split("/")[-1][0] == "_" for n in recipes)
    assert all(line for line in recipes.values()), [n for n, v in recipes.items() if not v]
    assert len(recipes) == len([p for p in RECIPES.rglob("*.yaml") if p.name[0] != "_"])


@pytest.mark.parametrize(
    "arg", ["cpu/sa_quadratic", "cpu/sa_quadratic.yaml", "configs/cpu/sa_quadratic.yaml"]
)
def test_a_recipe_by_name_or_as_the_checkout_spells_it(arg):
    assert catalog.find_recipe(arg) == RECIPES / "cpu" / "sa_quadratic.yaml"


def test_a_yaml_path_is_taken_as_it_is(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("model: {name: tiny_cnn}\n")
    assert catalog.find_recipe(str(p)) == p


def test_an_unknown_recipe_names_the_closest():
    with pytest.raises(FileNotFoundError, match=r"did you mean cpu/sa_quadratic"):
        catalog.find_recipe("cpu/sa_quadratc")
    with pytest.raises(FileNotFoundError, match=r"experiments/grid_long"):
        catalog.find_recipe("grid_lon")


def test_no_recipe_nor_shipped_code_names_the_checkouts_data_folder():
    """The recipes say how to point at the full CIFAR-10 (--data, ATTNCONV_CIFAR_ZIP); none
    refers to a development checkout's sibling folder."""
    src = ROOT / "src" / "attnconv"
    files = [*RECIPES.rglob("*.yaml"), *src.rglob("*.py")]
    bad = [str(p.relative_to(src)) for p in files if "shared/data" in p.read_text()]
    assert bad == []


def test_the_full_cifar_zip_is_found_through_the_environment(monkeypatch, cifar_zip, tmp_path):
    from attnconv.data.datasets import resolve

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(catalog.CIFAR_ZIP_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match="ATTNCONV_CIFAR_ZIP=PATH"):
        resolve(catalog.CIFAR_ZIP)
    monkeypatch.setenv(catalog.CIFAR_ZIP_ENV, str(cifar_zip))
    assert resolve(catalog.CIFAR_ZIP) == cifar_zip


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command line in a fresh process, and whether it imported torch (printed last)."""
    code = (
        "import sys; from attnconv.cli import main; rc = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["train", "cpu/sa_quadratc"], "did you mean cpu/sa_quadratic"),
        (["eval", "sa_quadratic.cifar10_grid_lng"], "missing checkpoint"),
        (["explore", "runs/nothing_here", "--out", "x.html"], "missing checkpoint"),
        (["convert", "resnet18_cifar.nosuch"], "missing checkpoint"),
        (["convert", "resnet18_cifr"], "did you mean resnet18_cifar"),
        (["convert", "resnet18_cifar", "--alpha", "-1"], "--alpha must be > 0"),
        (["convert", "resnet18_cifar", "--num-images", "0"], "--num-images must be >= 1"),
        (["eval", "sa_quadratic.cifar10_grid_long", "--batch-size", "0"], "--batch-size must"),
        (["eval", "sa_quadratic.cifar10_grid_long", "--data", "nope.zip"], "no such dataset"),
        (["analyze", "sa_quadratic.cifar10_grid_long", "--out", "a", "--zoom", "-1"], "--zoom"),
        (["analyze", "--model", "vit_bse", "--checkpoint", "x", "--out", "a"], "did you mean"),
        (["explore", "sa_quadratic.cifar10_grid_long", "--out", "x"], "an .html file"),
        (
            ["explore", "sa_quadratic.cifar10_grid_long", "--out", "x.html", "--data", "no"],
            "no such",
        ),
    ],
)
def test_a_wrong_name_is_one_line_before_torch_is_imported(args, said, tmp_path):
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "no torch"


def test_a_listing_read_no_further_ends_quietly():
    """`attnconv train --list | head -1`: the reader gone, the listing stops without an error
    line and exits as a tool stopped by SIGPIPE does (141)."""
    r, w = os.pipe()
    os.close(r)  # nobody reads: the first write fails at once
    try:
        done = subprocess.run(
            [sys.executable, "-m", "attnconv.cli", "train", "--list"],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(w)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_train_list_names_every_recipe():
    r = _cli("train", "--list")
    assert r.returncode == 0, r.stderr
    for name in catalog.recipe_names():
        assert f"  {name} " in r.stdout
    assert "ATTNCONV_CIFAR_ZIP" in r.stdout


def test_list_models_filters():
    assert attnconv.list_models("sasa_*") == [m for m in attnconv.list_models() if "sasa_" == m[:5]]
    assert attnconv.list_models("no_such_*") == []


# ---------------------------------------------------------------- pretrained


@pytest.fixture
def own_catalog(tmp_path, monkeypatch) -> Path:
    """A catalog of one real (untrained) tiny_cnn checkpoint with its card."""
    weights = tmp_path / "weights"
    torch.manual_seed(0)
    model = build_model("tiny_cnn", num_classes=10)
    folder = save_checkpoint(weights / "tiny_cnn.test", model, "tiny_cnn", {"num_classes": 10})
    card = {
        "name": "tiny_cnn.test",
        "model": "tiny_cnn",
        "default": True,
        "sha256": catalog.file_digest(folder / catalog.WEIGHT_FILE),
    }
    (folder / catalog.CARD).write_text(json.dumps(card))
    monkeypatch.setattr(catalog, "WEIGHTS", weights)
    return folder


def test_a_pretrained_name_loads_in_eval_mode_with_its_weights(own_catalog):
    model = attnconv.create_model("tiny_cnn.test", pretrained=True)
    assert not model.training
    torch.manual_seed(0)
    fresh = build_model("tiny_cnn", num_classes=10)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    bare = attnconv.create_model("tiny_cnn", pretrained=True)  # the card marked default
    assert torch.equal(next(bare.parameters()), next(model.parameters()))


def test_a_modified_weight_file_is_refused_naming_it(own_catalog):
    w = own_catalog / catalog.WEIGHT_FILE
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match=r"model\.safetensors: sha256 differs from the card"):
        attnconv.create_model("tiny_cnn.test", pretrained=True)


def test_an_unknown_pretrained_name_names_the_closest(own_catalog):
    with pytest.raises(PretrainedError, match=r"did you mean tiny_cnn\.test"):
        attnconv.pretrained_info("tiny_cnn.tset")
    with pytest.raises(ValueError, match="pretrained=True"):
        attnconv.create_model("tiny_cnn.test")
    with pytest.raises(ValueError, match="not both"):
        attnconv.create_model("tiny_cnn.test", pretrained=True, checkpoint="x")


def test_a_bare_model_name_is_its_default_checkpoint_for_eval_but_not_for_convert(
    own_catalog, capsys
):
    path = catalog.resolve_checkpoint("tiny_cnn", bare=True)  # eval, analyze, explore
    assert Path(path) == own_catalog
    assert capsys.readouterr().err.strip() == (
        "attnconv: tiny_cnn: the pretrained tiny_cnn.test (its default tag)"
    )
    with pytest.raises(FileNotFoundError, match="tiny_cnn: missing checkpoint"):
        catalog.resolve_checkpoint("tiny_cnn")  # convert: a bare name is fresh weights
    with pytest.raises(FileNotFoundError, match="did you mean tiny_cnn.test"):
        catalog.resolve_checkpoint("tiny_cnn.tset", bare=True)


CARD_KEYS = {"name", "model", "model_kwargs", "params", "test_accuracy", "test_images", "steps"}
CARD_KEYS |= {"seed", "recipe", "reproduce", "hardware", "source", "claims", "sha256"}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_model_matches_its_card(name):
    card = attnconv.pretrained_info(name)
    assert CARD_KEYS <= set(card), CARD_KEYS - set(card)
    assert card["name"] == name and name.split(".")[0] == card["model"]
    assert card["recipe"] in catalog.list_recipes() and card["test_images"] == 10_000
    model = attnconv.create_model(name, pretrained=True)
    assert sum(p.numel() for p in model.parameters()) == card["params"]
    assert not model.training


def test_a_bare_model_name_takes_its_default_tag():
    for m in {n.split(".")[0] for n in SHIPPED}:
        tags = catalog.list_pretrained(f"{m}.*")
        defaults = [n for n in tags if catalog.pretrained_info(n)["default"]]
        assert len(defaults) <= 1, (m, defaults)
        bare = attnconv.create_model(m, pretrained=True)  # the marked one, else the first tag
        tagged = attnconv.create_model((defaults or tags)[0], pretrained=True)
        assert all(torch.equal(a, b) for a, b in zip(bare.parameters(), tagged.parameters()))


def test_the_wheel_budget_holds():
    """The wheel is at most 25 MB: every file of the package (code, recipes, the sample, the
    weights) deflated as a wheel's zip stores it, with each entry's headers and name. CI builds
    the wheel itself and checks its size too (.ci/wheel_smoke.sh)."""
    src = ROOT / "src" / "attnconv"
    files = [p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    deflated = sum(len(zlib.compress(p.read_bytes(), 6)) + 100 + 2 * len(str(p)) for p in files)
    assert deflated <= 25e6, f"{deflated / 1e6:.1f} MB"


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_model_reaches_its_cards_accuracy(name, cifar_zip, tmp_path):
    """`attnconv eval NAME` on the 10,000 real test images, as a user runs it: within 0.2 points
    of the card."""
    out = tmp_path / "eval.json"
    r = _cli("eval", name, "--data", str(cifar_zip), "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    card = attnconv.pretrained_info(name)
    assert res["images"] == 10_000
    assert abs(res["accuracy"] - card["test_accuracy"]) <= 0.002, (res, card["test_accuracy"])


@pytest.mark.slow
def test_explore_opens_the_pretrained_grid_model_offline(tmp_path, monkeypatch):
    names = catalog.list_pretrained("sa_quadratic.*")
    if not names:
        pytest.skip("no pretrained sa_quadratic shipped")
    env = {k: v for k, v in os.environ.items() if k != catalog.CIFAR_ZIP_ENV}
    r = subprocess.run(
        [sys.executable, "-m", "attnconv.cli", "explore", names[0], "--out", "grid.html"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "embedded sample" in r.stderr and (tmp_path / "grid.html").stat().st_size > 10_000


def test_shipped_folders_hold_only_weights_and_cards():
    for name in SHIPPED:
        files = sorted(p.name for p in (catalog.WEIGHTS / name).iterdir())
        assert files == ["card.json", "checkpoint.json", "model.safetensors"], (name, files)
        meta = json.loads((catalog.WEIGHTS / name / "checkpoint.json").read_text())
        assert meta["config"]["data"]["dataset"] == catalog.CIFAR_ZIP
        assert "../" not in json.dumps(meta), name


def test_copying_a_shipped_folder_keeps_it_loadable(tmp_path):
    for name in SHIPPED[:1]:
        shutil.copytree(catalog.WEIGHTS / name, tmp_path / name)
        model, info = attnconv.load_model(tmp_path / name)
        assert info["model"] == name.split(".")[0]


def test_the_model_names_file_is_the_registry():
    """models/names.txt (the names the command line checks before torch is imported) equals
    the registry; after adding a model, write it with the registry's names."""
    from attnconv.models import list_models

    assert catalog.model_names() == list_models(), (
        f"{catalog.MODEL_NAMES} differs from attnconv.list_models(): write the registry's names "
        "into it, one per line, after its comment lines"
    )


def test_named_datasets_are_the_ones_resolve_knows_by_name():
    from attnconv.data.cifar import ARCHIVES

    assert set(catalog.NAMED_DATASETS) == {"sample", *ARCHIVES}
