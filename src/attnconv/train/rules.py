"""What a config value may be: the rule each field of the config dataclasses carries.

Every rule checks one value and raises one line naming the config key: a range (every float
also finite), choices, a list of checked items, a name, or plain model kwargs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from attnconv.loading.checkpoint_meta import plain_value

NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def as_float(key: str, v: Any) -> float:
    """float(v), or one ValueError naming the key (a 400-digit integer overflows a float)."""
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise ValueError(f"config key {key!r} must be a finite number, got {str(v)[:40]!r}")
    return x


def _g(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


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
            if self.kind is float and isinstance(x, str) and NUMBER.fullmatch(x.strip()):
                x = v[i] = as_float(f"{key}[{i}]", x)  # YAML 1.1 reads 1e-3 as a string
            ok = isinstance(x, self.kind) and not isinstance(x, bool)
            if self.kind is float and isinstance(x, int) and not isinstance(x, bool):
                ok = True
                x = v[i] = as_float(f"{key}[{i}]", x)
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


@dataclass(frozen=True)
class Plain:
    """Model kwargs: plain YAML values, as a checkpoint stores them (``plain_value``)."""

    def check(self, key: str, v: Any) -> None:
        try:
            plain_value(key, v)
        except (TypeError, ValueError) as e:
            raise type(e)(f"config key {e}") from None


Rule = Range | OneOf | ListOf | Name | Plain
POSITIVE, NONNEG, FRACTION = Range(0, lo_open=True), Range(0), Range(0, 1, hi_open=True)
COUNT = Range(1, 2**31)  # an integer count (at least 1)
