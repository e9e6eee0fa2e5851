"""What ships in the package beside the code: the training recipes and the pretrained weights.

- ``configs/``: the recipes, by name (their path under configs/ without ``.yaml``:
  ``cpu/sa_quadratic``, ``sa_quadratic``, ``experiments/grid_long``); files starting with ``_``
  are the bases other recipes build on (``base:``), not recipes.
- ``weights/MODEL.TAG/``: a trained paper model, MODEL a registry name: an attnconv checkpoint
  (``checkpoint.json`` + ``model.safetensors``, weights only) and its card (``card.json``: the
  test accuracy, steps, seed, parameters, recipe, hardware, where the weights came from and
  their sha256).

Torch-free on purpose: the command line looks names up here before it imports torch, so a
wrong name is said at once, with the closest ones.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPES = HERE / "configs"
WEIGHTS = HERE / "weights"
MODEL_NAMES = HERE / "models" / "names.txt"  # the registry's names, for the checks before torch
# the datasets data.resolve knows by name; any other --data / data.dataset is a path
NAMED_DATASETS = ("sample", "cifar10", "cifar100")
CARD, WEIGHT_FILE = "card.json", "model.safetensors"
# the full CIFAR-10 as JPEGs (split/class/img.jpg in one zip): the name the recipes give it,
# and the environment variable that says where it is when no --data is given
CIFAR_ZIP, CIFAR_ZIP_ENV = "cifar10-jpeg.zip", "ATTNCONV_CIFAR_ZIP"
CIFAR_ZIP_HINT = f"pass --data PATH or set {CIFAR_ZIP_ENV}=PATH (PATH: the full CIFAR-10 JPEG zip)"


class PretrainedError(ValueError):
    """A pretrained name that is not shipped, or shipped weights that differ from their card."""


def closest(name: str, names: list[str], n: int = 3) -> str:
    """' (did you mean a, b?)' for the names closest to ``name``, else ''."""
    near = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
    if not near:  # a prefix or a part of a name: `grid` finds experiments/grid_long
        near = [m for m in names if name and name in m][:n]
    return f" (did you mean {', '.join(near)}?)" if near else ""


# ---------------------------------------------------------------- recipes


def recipe_names() -> list[str]:
    """Every shipped recipe's name, sorted (the ``_`` bases left out)."""
    return sorted(
        p.relative_to(RECIPES).with_suffix("").as_posix()
        for p in RECIPES.rglob("*.yaml")
        if not p.name.startswith("_")
    )


def recipe_summary(path: Path, width: int = 96) -> str:
    """A recipe's first comment line (what it reproduces), cut to ``width`` characters."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").strip()
            return text if len(text) <= width else text[: width - 3].rstrip() + "..."
        if line.strip():
            break
    return ""


def list_recipes() -> dict[str, str]:
    """{recipe name: one line on what it reproduces}, in name order."""
    return {n: recipe_summary(RECIPES / f"{n}.yaml") for n in recipe_names()}


def find_recipe(arg: str) -> Path:
    """The YAML file ``arg`` names: a path to a file, or a shipped recipe's name (its path under
    configs/ with or without ``.yaml``, or ``configs/NAME.yaml`` as a checkout spells it).

    Raises:
        FileNotFoundError: neither, with the closest recipe names.
    """
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    name = arg[len("configs/") :] if arg.startswith("configs/") else arg
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name
    if not name.startswith("_") and (RECIPES / f"{name}.yaml").is_file():
        return RECIPES / f"{name}.yaml"
    if p.is_dir():
        return p  # a folder: the train command says what to do with it
    names = recipe_names()
    hint = closest(name, names) or f" ({len(names)} recipes: attnconv train --list)"
    raise FileNotFoundError(f"{arg}: no such config file or recipe{hint}")


# ---------------------------------------------------------------- pretrained weights


def list_pretrained(pattern: str | None = None) -> list[str]:
    """The shipped pretrained names ``MODEL.TAG``, sorted; ``pattern`` (shell-style, e.g.
    ``sa_quadratic.*``) filters them."""
    names = sorted(p.name for p in WEIGHTS.glob("*.*") if (p / CARD).is_file())
    return [n for n in names if pattern is None or fnmatch.fnmatchcase(n, pattern)]


def _default_for(model: str) -> str | None:
    """The pretrained name a bare model name stands for: the card marked ``default``, else the
    first of its tags (None: no weights of ``model`` ship)."""
    names = list_pretrained(f"{model}.*")
    for n in names:
        if json.loads((WEIGHTS / n / CARD).read_text()).get("default"):
            return n
    return names[0] if names else None


def pretrained_name(name: str) -> str:
    """``name`` as a shipped ``MODEL.TAG`` (a bare MODEL: its default tag).

    Raises:
        PretrainedError: not shipped, with the closest names.
    """
    names = list_pretrained()
    if name in names:
        return name
    if "." not in name and (default := _default_for(name)):
        return default
    some = closest(name, names) or f" (shipped: {', '.join(names) or 'none'})"
    raise PretrainedError(f"{name}: no such pretrained model{some}")


def pretrained_info(name: str) -> dict:
    """The card of a shipped model: ``name``, ``model``, ``test_accuracy`` (a fraction, on the
    10,000 CIFAR-10 test images), ``steps``, ``seed``, ``params``, ``recipe``, ``hardware``,
    ``source`` (where the weights came from), ``claims``, ``reproduce`` and ``sha256``.

    Raises:
        PretrainedError: ``name`` is not shipped.
    """
    name = pretrained_name(name)
    return json.loads((WEIGHTS / name / CARD).read_text())


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of a file, read in 1 MiB blocks (a weight file, a downloaded archive)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pretrained_folder(name: str) -> Path:
    """The checkpoint folder of a shipped model, its weights checked against the card's
    sha256 (never a silent load of other weights).

    Raises:
        PretrainedError: not shipped, or its weight file missing or not the card's.
    """
    card = pretrained_info(name)
    folder = WEIGHTS / card["name"]
    weights = folder / WEIGHT_FILE
    if not weights.is_file():
        raise PretrainedError(f"{weights}: the weight file of {card['name']} is missing")
    if file_digest(weights) != card["sha256"]:
        raise PretrainedError(
            f"{weights}: sha256 differs from the card of {card['name']} (the file was modified "
            "or damaged; reinstall attnconv)"
        )
    return folder


def resolve_checkpoint(arg: str, bare: bool = False) -> str:
    """A command's CHECKPOINT argument as a path: an existing file or folder as given, a
    pretrained ``MODEL.TAG`` as its checked folder. ``bare``: a registry name MODEL stands for
    its default pretrained tag, said in one line on stderr (eval, analyze, explore; not
    `convert`, which builds a bare MODEL with fresh weights).

    Raises:
        FileNotFoundError: neither a path nor a shipped name (with the closest names).
        PretrainedError: a shipped name whose weights differ from its card.
    """
    if Path(arg).expanduser().exists():
        return arg
    names = list_pretrained()
    if arg in names:
        return str(pretrained_folder(arg))
    if bare and "." not in arg and (default := _default_for(arg)):
        print(f"attnconv: {arg}: the pretrained {default} (its default tag)", file=sys.stderr)
        return str(pretrained_folder(default))
    hint = closest(arg, names).replace(" (", "; ").rstrip(")") or (
        f"; pretrained: attnconv.list_pretrained(), e.g. {names[0]}" if names else ""
    )
    raise FileNotFoundError(
        f"{arg}: missing checkpoint (no such file or folder, nor a pretrained name{hint})"
    )


def cifar_zip() -> str | None:
    """``$ATTNCONV_CIFAR_ZIP`` when it is set (the full CIFAR-10 JPEG zip), else None."""
    return os.environ.get(CIFAR_ZIP_ENV) or None


def dataset_path(spec: str) -> Path | None:
    """The file or folder a ``--data`` / ``data.dataset`` path names (None for a named dataset,
    NAMED_DATASETS): ``cifar10-jpeg.zip`` where no such file is here is the one
    ``$ATTNCONV_CIFAR_ZIP`` names.

    Raises:
        FileNotFoundError: no such path, said in one line (before torch is imported).
    """
    if spec in NAMED_DATASETS:
        return None
    path = Path(spec).expanduser()
    if not path.exists() and path.name == CIFAR_ZIP:  # the recipes' name for the full set
        env = cifar_zip()
        if env is None:
            raise FileNotFoundError(f"{spec}: the full CIFAR-10 is not here; {CIFAR_ZIP_HINT}")
        path = Path(env).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{CIFAR_ZIP_ENV}={env}: no such file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such dataset file or folder")
    return path


# ---------------------------------------------------------------- model names


def model_names() -> list[str]:
    """The registry's model names (``attnconv.list_models()``), read from models/names.txt
    without importing torch (tests/test_catalog.py checks the file against the registry)."""
    lines = MODEL_NAMES.read_text().splitlines()
    return [ln for ln in lines if ln and not ln.startswith("#")]


def check_model_name(name: str) -> None:
    """ValueError for a name that is no registry model, with the closest names (torch-free:
    models/names.txt; the live registry where it is already imported, which also holds the
    models a program registered itself)."""
    registry = sys.modules.get("attnconv.models.registry")
    names = registry.list_models() if registry is not None else model_names()
    if name not in names:
        hint = closest(name, names) or f" (e.g. {', '.join(names[:3])})"
        raise ValueError(
            f"unknown model {name!r}{hint}; {len(names)} models in all: attnconv.list_models()"
        )
