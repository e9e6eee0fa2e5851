"""Experiment configs: dataclasses, YAML with ``base:`` inheritance, ``key=value`` overrides.

An unknown key anywhere is an error listing the close matches (``optim.lr`` for ``optim.lrr``).
``model.kwargs`` is free-form: it goes to ``create_model`` (which rejects what it doesn't take).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ModelConfig:
    name: str = "sa_quadratic"
    kwargs: dict = field(default_factory=dict)  # create_model(name, num_classes=..., **kwargs)


@dataclass
class DataConfig:
    dataset: str = "cifar10"  # cifar10 | cifar100 | sample | PATH (folder, .zip, .tar.gz)
    root: str | None = None  # where cifar10/cifar100 live or are downloaded (default: cache)
    download: bool = False
    cache_dir: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    max_per_class: int | None = None  # training subset (CPU-scale runs)
    eval_max_per_class: int | None = None
    augment: bool = True  # random crop (zero padding) + horizontal flip
    crop_padding: int = 4
    flip: bool = True
    mean: list = field(default_factory=lambda: [0.4914, 0.4822, 0.4465])
    std: list = field(default_factory=lambda: [0.2470, 0.2435, 0.2616])


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adamw
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 1e-4
    # parameter names without weight decay (the Gaussian centres and spreads never are: their
    # modules declare them)
    no_decay: list = field(default_factory=list)
    decay_1d: bool = False  # decay norms and biases too (the reference code does)


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | multistep | constant
    warmup: float = 0.05  # fraction of all steps with linear warm-up from 0
    milestones: list = field(default_factory=list)  # epochs where multistep multiplies by gamma
    gamma: float = 0.1
    min_lr: float = 0.0
    per_epoch: bool = False  # cosine stepped once per epoch, staircase warm-up (reference code)


@dataclass
class TrainConfig:
    epochs: int = 300
    batch_size: int = 100  # global (all ranks together)
    eval_batch_size: int = 500
    steps_per_epoch: int | None = None  # cap (CPU-scale runs); None = the whole split
    label_smoothing: float = 0.0
    grad_clip: float | None = None  # max global gradient norm
    bf16: bool = False  # autocast to bfloat16
    compile: bool = False  # torch.compile the model
    seed: int = 0
    eval_every: int = 1  # epochs
    checkpoint_every: int = 0  # steps between checkpoints (0: end of each epoch only)
    keep_checkpoints: int = 2
    log_every: int = 10  # steps between metrics rows
    tensorboard: bool = False
    progress: bool = True
    deterministic: bool = True
    threads: int | None = None  # torch.set_num_threads
    time_limit: float | None = None  # seconds of training; then eval + checkpoint and finish


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str | None = None  # default: runs/<config name>

    def to_dict(self) -> dict:
        return asdict(self)


def _section(f: dataclasses.Field) -> type | None:
    """The dataclass type of a nested section field, else None."""
    sub = f.default_factory
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


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


def _build(cls: type, d: dict, prefix: str = ""):
    if not isinstance(d, dict):
        raise TypeError(f"config section {prefix.rstrip('.') or 'root'!r} must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in d.items():
        if k not in fields:
            raise _unknown(prefix + str(k))
        f = fields[k]
        if (sub := _section(f)) is not None:
            kw[k] = _build(sub, v or {}, prefix + k + ".")
        else:
            kw[k] = _check_type(prefix + k, v, f)
    return cls(**kw)


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


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
            return float(v)
        if isinstance(v, str) and _NUMBER.fullmatch(v.strip()):
            return float(v)  # YAML 1.1 reads 1e-3 (no dot in the mantissa) as a string
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
        d = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a config must be a mapping at the top level")
    base = d.pop("base", None)
    if base is not None:
        d = _merge(read_yaml(path.parent / base, _seen + (path.resolve(),)), d)
    return d


def apply_overrides(d: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` strings (values parsed as YAML: 0.1, true, [80, 150], null)."""
    d = _merge({}, d)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value (e.g. optim.lr=0.05)")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        parts = key.split(".")
        node = d
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {p!r} is not a section")
        node[parts[-1]] = value
    return d


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read ``path`` (YAML; None = defaults), apply overrides, validate every key."""
    d = read_yaml(path) if path is not None else {}
    cfg = _build(Config, apply_overrides(d, list(overrides)))
    validate(cfg)
    return cfg


def config_from_dict(d: dict) -> Config:
    cfg = _build(Config, d)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    if cfg.optim.name not in ("sgd", "adamw"):
        raise ValueError(f"optim.name must be 'sgd' or 'adamw', got {cfg.optim.name!r}")
    if cfg.schedule.name not in ("cosine", "multistep", "constant"):
        raise ValueError(
            f"schedule.name must be 'cosine', 'multistep' or 'constant', got {cfg.schedule.name!r}"
        )
    if not 0 <= cfg.schedule.warmup < 1:
        raise ValueError(
            f"schedule.warmup is a fraction of the steps in [0, 1), got {cfg.schedule.warmup}"
        )
    t = cfg.train
    for key in (
        "epochs",
        "batch_size",
        "eval_batch_size",
        "eval_every",
        "log_every",
        "keep_checkpoints",
    ):
        if getattr(t, key) < 1:
            raise ValueError(f"train.{key} must be >= 1, got {getattr(t, key)}")
    if t.checkpoint_every < 0:
        raise ValueError(f"train.checkpoint_every must be >= 0, got {t.checkpoint_every}")
    if t.threads is not None and t.threads < 1:
        raise ValueError(f"train.threads must be >= 1 or null, got {t.threads}")
    if not 0 <= t.label_smoothing < 1:
        raise ValueError(f"train.label_smoothing must be in [0, 1), got {t.label_smoothing}")
    if t.grad_clip is not None and t.grad_clip <= 0:
        raise ValueError(f"train.grad_clip must be > 0 or null, got {t.grad_clip}")
    if cfg.optim.lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {cfg.optim.lr}")
