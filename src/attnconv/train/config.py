"""Experiment configs: dataclasses, YAML with ``base:`` inheritance, ``key=value`` overrides.

Each field carries its rule (``checked(default, rule)``, rules in ``rules.py``); ``SCHEMA`` is
read from the fields. An unknown key anywhere is an error listing the close matches
(``optim.lr`` for ``optim.lrr``).
``model.kwargs`` is free-form: it goes to ``create_model`` (which rejects what it doesn't take).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnconv.device import FLUSH_SUBNORMALS
from attnconv.layers.kernels.plan import BACKENDS as MHSA_BACKENDS
from attnconv.layers.kernels.plan import LOCAL_BACKENDS, STEM_BACKENDS

from .config_yaml import safe_yaml
from .rules import (
    COUNT,
    FRACTION,
    NONNEG,
    NUMBER,
    POSITIVE,
    ListOf,
    Name,
    OneOf,
    Plain,
    Range,
    Rule,
    as_float,
)

BACKENDS = tuple(sorted({*MHSA_BACKENDS, *LOCAL_BACKENDS, *STEM_BACKENDS}))


def checked(default: Any, rule: Rule) -> Any:
    """A config field and its rule, in one place (``SCHEMA`` collects the rules); a list or
    mapping default is copied for each config."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


@dataclass
class ModelConfig:
    name: str = checked("sa_quadratic", Name())
    kwargs: dict = checked({}, Plain())  # create_model(name, num_classes=..., **kwargs)
    # the attention layers' kernel (attnconv.set_backend; None: the plan's), e.g. "triton"
    backend: str | None = checked(None, OneOf(BACKENDS))


@dataclass
class DataConfig:
    # cifar10 | cifar100 | sample | PATH (folder, .zip, .tar.gz)
    dataset: str = checked("cifar10", Name())
    root: str | None = None  # where cifar10/cifar100 live or are downloaded (default: cache)
    download: bool = False
    cache_dir: str | None = None
    train_split: str = checked("train", Name(plain=True))
    eval_split: str = checked("test", Name(plain=True))
    max_per_class: int | None = checked(None, COUNT)  # training subset (CPU-scale runs)
    eval_max_per_class: int | None = checked(None, COUNT)
    augment: bool = True  # random crop (zero padding) + horizontal flip
    crop_padding: int = checked(4, Range(0, 1024))
    flip: bool = True
    mean: list = checked([0.4914, 0.4822, 0.4465], ListOf(float, Range(-1e6, 1e6), length=3))
    std: list = checked(
        [0.2470, 0.2435, 0.2616], ListOf(float, Range(0, 1e6, lo_open=True), length=3)
    )


@dataclass
class OptimConfig:
    name: str = checked("sgd", OneOf(("sgd", "adamw")))
    lr: float = checked(0.1, Range(0, 1e6, lo_open=True))
    momentum: float = checked(0.9, Range(0, 1))
    nesterov: bool = False
    betas: list = checked([0.9, 0.999], ListOf(float, FRACTION, length=2))
    eps: float = checked(1e-8, Range(0, 1, lo_open=True))
    weight_decay: float = checked(1e-4, Range(0, 1e6))
    # parameters without weight decay: names as named_parameters() prints them, or dotted parts
    # ("rel_row"); one naming nothing is an error (the Gaussian centres and spreads never are:
    # their modules declare them)
    no_decay: list = checked([], ListOf(str))
    decay_1d: bool = False  # decay norms and biases too (the reference code does)


@dataclass
class ScheduleConfig:
    name: str = checked("cosine", OneOf(("cosine", "multistep", "constant")))
    warmup: float = checked(0.05, FRACTION)  # fraction of all steps with linear warm-up from 0
    # epochs where multistep multiplies by gamma
    milestones: list = checked([], ListOf(int, Range(0, 2**31)))
    gamma: float = checked(0.1, Range(0, 1e6, lo_open=True))
    min_lr: float = checked(0.0, NONNEG)
    per_epoch: bool = False  # cosine stepped once per epoch, staircase warm-up (reference code)


@dataclass
class TrainConfig:
    epochs: int = checked(300, COUNT)
    batch_size: int = checked(100, COUNT)  # global (all ranks together)
    eval_batch_size: int = checked(500, COUNT)
    # cap (CPU-scale runs); None = the whole split
    steps_per_epoch: int | None = checked(None, COUNT)
    label_smoothing: float = checked(0.0, FRACTION)
    # max global gradient norm
    grad_clip: float | None = checked(None, Range(0, 1e30, lo_open=True))
    bf16: bool = False  # autocast to bfloat16
    compile: bool = False  # torch.compile the model
    seed: int = checked(0, Range(0, 2**63 - 1))
    eval_every: int = checked(1, COUNT)  # epochs
    # steps between checkpoints (0: end of each epoch only)
    checkpoint_every: int = checked(0, Range(0, 2**31))
    keep_checkpoints: int = checked(2, COUNT)
    # also keep the checkpoints of every multiple of this step (a run's milestones; 0: none)
    keep_every: int = checked(0, Range(0, 2**31))
    log_every: int = checked(10, COUNT)  # steps between metrics rows
    tensorboard: bool = False
    progress: bool = True
    deterministic: bool = True
    # CPU: subnormal floats read and written as zero on every thread (device.flush_subnormals):
    # the quadratic encoding's far-off probabilities are subnormal, slow on some CPUs
    flush_subnormals: bool = FLUSH_SUBNORMALS
    # torch.set_num_threads (torch aborts far above the core count)
    threads: int | None = checked(None, Range(1, 1024))
    # seconds of training; then eval + checkpoint and finish
    time_limit: float | None = checked(None, POSITIVE)


@dataclass
class Config:
    """One training run's settings, section by section (the YAML's top-level keys).

    Args:
        model: the model's registered name and its ``create_model`` keyword arguments.
        data: the dataset, its splits, augmentation and normalization.
        optim: the optimizer (sgd or adamw), learning rate, momentum and weight decay.
        schedule: the learning-rate schedule (cosine, multistep or constant) and its warm-up.
        train: epochs, batch sizes, precision, seed, evaluation and checkpoint periods.
        out_dir: the run folder (None: ``runs/<config name>`` from ``attnconv train``).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str | None = None  # default: runs/<config name>

    def to_dict(self) -> dict:
        """The config as plain nested dicts (what a checkpoint stores)."""
        return asdict(self)


def _section(f: dataclasses.Field) -> type | None:
    """The dataclass type of a nested section field, else None."""
    sub = f.default_factory
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


SECTIONS = {f.name for f in dataclasses.fields(Config) if _section(f) is not None}


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        out.append(prefix + f.name)
        if (sub := _section(f)) is not None:
            out += _all_keys(sub, prefix + f.name + ".")
    return out


def _unknown(key: str) -> ValueError:
    keys = _all_keys(Config)
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    if not close:  # try the last component alone (e.g. 'lrr' -> optim.lr)
        last = {k.rsplit(".", 1)[-1]: k for k in keys}
        close = [last[m] for m in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(last))]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"unknown config key {key!r}{hint}")


def _not_a_mapping(key: str, v: Any) -> str:
    return f"config section {key!r} must be a mapping, got {v!r}"


def _build(cls: type, d: dict | None, prefix: str = ""):
    if d is None:  # an empty section (``train:`` with nothing under it): no change
        d = {}
    if not isinstance(d, dict):
        raise TypeError(_not_a_mapping(prefix.rstrip(".") or "root", d))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in d.items():
        if k not in fields:
            raise _unknown(prefix + str(k))
        f = fields[k]
        if (sub := _section(f)) is not None:
            kw[k] = _build(sub, v, prefix + k + ".")
        else:
            kw[k] = _check_type(prefix + k, v, f)
    return cls(**kw)


def _check_type(key: str, v: Any, f: dataclasses.Field) -> Any:
    t = str(f.type)
    if v is None:
        if "None" in t:
            return None
        raise TypeError(f"config key {key!r} cannot be null")
    if t.startswith("int") and isinstance(v, int) and not isinstance(v, bool):
        return v
    if t.startswith("float"):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return as_float(key, v)
        if isinstance(v, str) and NUMBER.fullmatch(v.strip()):
            return as_float(key, v)  # YAML 1.1 reads 1e-3 (no dot in the mantissa) as a string
        raise TypeError(f"config key {key!r} must be a number, got {v!r}")
    if t.startswith("int"):
        raise TypeError(f"config key {key!r} must be an integer, got {v!r}")
    if t.startswith("bool") and not isinstance(v, bool):
        raise TypeError(f"config key {key!r} must be true or false, got {v!r}")
    if t.startswith("str") and not isinstance(v, str):
        raise TypeError(f"config key {key!r} must be a string, got {v!r}")
    if t == "list" and not isinstance(v, list):
        raise TypeError(f"config key {key!r} must be a list, got {v!r}")
    if t == "dict" and not isinstance(v, dict):
        raise TypeError(f"config key {key!r} must be a mapping, got {v!r}")
    return v


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if v is None and isinstance(out.get(k), dict) and k != "kwargs":
            continue  # an empty section changes nothing (never resets the base's to defaults)
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "kwargs":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path, _seen: tuple = ()) -> dict:
    """A config file as a dict, with ``base: other.yaml`` (relative to the file) merged under it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    if path.resolve() in _seen:
        raise ValueError(f"{path}: circular 'base:' chain")
    try:
        d = safe_yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a config must be a mapping at the top level")
    _check_sections(d, str(path))
    base = d.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ValueError(f"{path}: 'base' must be the path of a config file, got {base!r}")
        d = _merge(read_yaml(path.parent / base, _seen + (path.resolve(),)), d)
    return d


def _check_sections(d: dict, where: str) -> None:
    """A section in ``d`` must be a mapping or empty (None: no change); ValueError at ``where``."""
    for k, v in d.items():
        if k in SECTIONS and v is not None and not isinstance(v, dict):
            raise ValueError(f"{where}: {_not_a_mapping(k, v)}")


def apply_overrides(d: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` strings (values parsed as YAML: 0.1, true, [80, 150], null)."""
    d = _merge({}, d)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value (e.g. optim.lr=0.05)")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = safe_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except ValueError as e:
            raise ValueError(f"override {item!r}: {e}") from None
        parts = key.split(".")
        node = d
        for p in parts[:-1]:
            if node.get(p) is None:  # absent or empty
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {p!r} is not a section")
        if key in SECTIONS:  # a whole section: merged, never replaced
            _check_sections({key: value}, f"override {item!r}")
            value = _merge(node.get(parts[-1]) or {}, value or {})
        node[parts[-1]] = value
    return d


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read ``path`` (YAML; None = defaults), apply overrides, validate every key.

    Args:
        path: a YAML config (its ``base:`` files merged under it); None for the defaults.
        overrides: ``section.key=value`` strings, the values parsed as YAML.

    Returns:
        The validated config.

    Raises:
        FileNotFoundError: no such config file.
        ValueError: invalid YAML, an unknown key (with the close matches), or a value outside
            its rule.
        TypeError: a value of the wrong type (a string for a number, null where not allowed).
    """
    d = read_yaml(path) if path is not None else {}
    cfg = _build(Config, apply_overrides(d, list(overrides)))
    validate(cfg)
    return cfg


def config_from_dict(d: dict) -> Config:
    """A config from nested dicts (a checkpoint's stored config, ``Config.to_dict()``).

    Args:
        d: sections as dicts; missing keys take their defaults.

    Returns:
        The validated config.

    Raises:
        ValueError: an unknown key or a value outside its rule.
        TypeError: a value of the wrong type, or a section that is not a mapping.
    """
    cfg = _build(Config, d)
    validate(cfg)
    return cfg


def check_training_size(cfg: Config) -> int:
    """The bytes one training step of ``cfg``'s model holds (``models.budget.training_bytes``,
    on the meta device: nothing allocated); one-line ValueError past half the machine's memory.
    The one bound for every command that builds the model (the trainer, the demo's probe)."""
    from attnconv.memory import memory_bytes
    from attnconv.models.budget import training_bytes

    m, state = cfg.model, 2 if cfg.optim.name == "adamw" else 1 if cfg.optim.momentum else 0
    half = memory_bytes() // 2
    return training_bytes(
        m.name, dict(m.kwargs), cfg.train.batch_size, state, half, f"model {m.name!r}"
    )


# The one schema, read from the fields: every value's rule (types come from the fields' types;
# a float is always finite). ``validate`` checks each key of a Config against it.
SCHEMA: dict[str, Rule] = {
    f"{section.name}.{f.name}": f.metadata["rule"]
    for section in dataclasses.fields(Config)
    if (sub := _section(section)) is not None
    for f in dataclasses.fields(sub)
    if "rule" in f.metadata
}


def validate(cfg: Config) -> None:
    """Every value against SCHEMA (ranges, choices, finite numbers); one-line errors."""
    for key, rule in SCHEMA.items():
        section, name = key.split(".")
        v = getattr(getattr(cfg, section), name)
        if v is not None:
            rule.check(key, v)
