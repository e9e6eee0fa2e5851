"""Experiment configs: dataclasses, YAML with ``base:`` inheritance, ``key=value`` overrides.

An unknown key anywhere is an error listing the close matches (``optim.lr`` for ``optim.lrr``).
``model.kwargs`` is free-form: it goes to ``create_model`` (which rejects what it doesn't take).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
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


def _as_float(key: str, v: Any) -> float:
    """float(v), or one ValueError naming the key (a 400-digit integer overflows a float)."""
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise ValueError(f"config key {key!r} must be a finite number, got {str(v)[:40]!r}")
    return x


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
            return _as_float(key, v)
        if isinstance(v, str) and _NUMBER.fullmatch(v.strip()):
            return _as_float(key, v)  # YAML 1.1 reads 1e-3 (no dot in the mantissa) as a string
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


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases: ``*name`` could expand a few lines into billions of items (an
    alias bomb); a config never needs one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise ValueError(
                f"YAML aliases (*{self.peek_event().anchor}) are not allowed in a config "
                f"(line {mark.line + 1}); write the value out"
            )
        return super().compose_node(parent, index)


def safe_yaml(text: str):
    """Parse config YAML (plain values, no aliases; nesting bounded) or raise ValueError."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ValueError("YAML nested too deeply") from None


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
            value = safe_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except ValueError as e:
            raise ValueError(f"override {item!r}: {e}") from None
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


@dataclass(frozen=True)
class Range:
    """A number in [lo, hi] (``lo_open``: lo excluded); every float is also finite."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def check(self, key: str, v: Any) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"config key {key!r} must be a finite number, got {v}")
        low = self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo)
        high = self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi)
        if low or high:
            if self.hi is None:
                span = f"{'>' if self.lo_open else '>='} {_g(self.lo)}"
            else:
                lo, hi = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
                span = f"in {lo}{_g(self.lo)}, {_g(self.hi)}{hi}"
            raise ValueError(f"config key {key!r} must be {span}, got {v}")


@dataclass(frozen=True)
class OneOf:
    choices: tuple[str, ...]

    def check(self, key: str, v: Any) -> None:
        if v not in self.choices:
            choices = ", ".join(self.choices)
            raise ValueError(f"config key {key!r} must be one of {choices}, got {v!r}")


@dataclass(frozen=True)
class ListOf:
    """A list of ``kind`` (int | float | str) items, each checked by ``item``."""

    kind: type
    item: Range | None = None
    length: int | None = None

    def check(self, key: str, v: list) -> None:
        if self.length is not None and len(v) != self.length:
            raise ValueError(f"config key {key!r} needs {self.length} values, got {len(v)}")
        if len(v) > 4096:
            raise ValueError(f"config key {key!r}: a list of {len(v)} values (at most 4096)")
        for i, x in enumerate(v):
            if self.kind is float and isinstance(x, str) and _NUMBER.fullmatch(x.strip()):
                x = v[i] = _as_float(f"{key}[{i}]", x)  # YAML 1.1 reads 1e-3 as a string
            ok = isinstance(x, self.kind) and not isinstance(x, bool)
            if self.kind is float and isinstance(x, int) and not isinstance(x, bool):
                ok = True
                x = v[i] = _as_float(f"{key}[{i}]", x)
            if not ok:
                raise TypeError(
                    f"config key {key!r}: item {i} must be a {self.kind.__name__}, got {x!r}"
                )
            if self.item is not None:
                self.item.check(f"{key}[{i}]", x)


@dataclass(frozen=True)
class Name:
    """A non-empty string; ``plain``: also a single file-name component (no '/', not '..')."""

    plain: bool = False

    def check(self, key: str, v: str) -> None:
        if not v.strip() or "\x00" in v:
            raise ValueError(f"config key {key!r} must be a non-empty name, got {v!r}")
        if self.plain and ("/" in v or "\\" in v or v in (".", "..")):
            raise ValueError(f"config key {key!r} must be a plain name (no path), got {v!r}")


def _g(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


POSITIVE, NONNEG, FRACTION = Range(0, lo_open=True), Range(0), Range(0, 1, hi_open=True)
COUNT = Range(1, 2**31)  # an integer count (at least 1)
# The one schema: every value's range or choices (types come from the dataclass fields; a float
# is always finite). ``validate`` checks each key of a Config against it.
SCHEMA: dict[str, Range | OneOf | ListOf | Name] = {
    "model.name": Name(),
    "data.dataset": Name(),
    "data.train_split": Name(plain=True),
    "data.eval_split": Name(plain=True),
    "data.max_per_class": COUNT,
    "data.eval_max_per_class": COUNT,
    "data.crop_padding": Range(0, 1024),
    "data.mean": ListOf(float, Range(-1e6, 1e6), length=3),
    "data.std": ListOf(float, Range(0, 1e6, lo_open=True), length=3),
    "optim.name": OneOf(("sgd", "adamw")),
    "optim.lr": Range(0, 1e6, lo_open=True),
    "optim.momentum": Range(0, 1),
    "optim.betas": ListOf(float, FRACTION, length=2),
    "optim.eps": Range(0, 1, lo_open=True),
    "optim.weight_decay": Range(0, 1e6),
    "optim.no_decay": ListOf(str),
    "schedule.name": OneOf(("cosine", "multistep", "constant")),
    "schedule.warmup": FRACTION,
    "schedule.milestones": ListOf(int, Range(0, 2**31)),
    "schedule.gamma": Range(0, 1e6, lo_open=True),
    "schedule.min_lr": NONNEG,
    "train.epochs": COUNT,
    "train.batch_size": COUNT,
    "train.eval_batch_size": COUNT,
    "train.steps_per_epoch": COUNT,
    "train.label_smoothing": FRACTION,
    "train.grad_clip": Range(0, 1e30, lo_open=True),
    "train.seed": Range(0, 2**63 - 1),
    "train.eval_every": COUNT,
    "train.checkpoint_every": Range(0, 2**31),
    "train.keep_checkpoints": COUNT,
    "train.log_every": COUNT,
    "train.threads": Range(1, 1024),  # torch aborts far above the core count
    "train.time_limit": POSITIVE,
}
MAX_DEPTH = 8  # nesting of model.kwargs values (lists / mappings)


def _plain_value(key: str, v: Any, depth: int = 0) -> None:
    """model.kwargs: plain YAML values (numbers finite), nested at most MAX_DEPTH deep."""
    if depth > MAX_DEPTH:
        raise ValueError(f"config key {key!r} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"config key {key!r} must be a finite number, got {v}")
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        raise ValueError(f"config key {key!r}: integer out of range, got {str(v)[:40]}...")
    if isinstance(v, dict):
        if len(v) > 4096:
            raise ValueError(f"config key {key!r}: a mapping of {len(v)} keys (at most 4096)")
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"config key {key!r}: key {k!r} is not a string")
            _plain_value(f"{key}.{k}", x, depth + 1)
    elif isinstance(v, list):
        if len(v) > 4096:
            raise ValueError(f"config key {key!r}: a list of {len(v)} values (at most 4096)")
        for i, x in enumerate(v):
            _plain_value(f"{key}[{i}]", x, depth + 1)
    elif v is not None and not isinstance(v, (bool, int, float, str)):
        raise TypeError(f"config key {key!r}: {type(v).__name__} is not a plain value")


def validate(cfg: Config) -> None:
    """Every value against SCHEMA (ranges, choices, finite numbers); one-line errors."""
    for section in dataclasses.fields(cfg):
        sub = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(sub):
            continue
        for f in dataclasses.fields(sub):
            key, v = f"{section.name}.{f.name}", getattr(sub, f.name)
            rule = SCHEMA.get(key)
            if key == "model.kwargs":
                _plain_value(key, v)
            elif v is not None and rule is not None:
                rule.check(key, v)
