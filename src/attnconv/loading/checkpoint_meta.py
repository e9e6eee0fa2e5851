"""The structure of a checkpoint's ``checkpoint.json``, checked before anything uses it.

A crafted or damaged metadata file (wrong types, shapes that are not lists of sizes, deep
nesting, a config whose dataset is not a string) is refused with one line naming the key, never
an AttributeError / KeyError / RecursionError later. Older checkpoints keep loading: only what
the loaders read is required, the rest is optional.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

MAX_META_BYTES = 64 << 20  # a checkpoint.json is kilobytes; the index of a huge model is MBs
MAX_DIM = 2**40  # one tensor dimension (sizes beyond any real tensor are refused)


class MetaError(ValueError):
    """checkpoint.json has the wrong structure; the message names the key."""


def _fail(key: str, want: str, got: Any) -> MetaError:
    shown = repr(got)
    return MetaError(f"{key} must be {want}, got {shown[:60]}{'...' if len(shown) > 60 else ''}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _mapping(v: Any, key: str, optional: bool = False) -> dict:
    if v is None and optional:
        return {}
    if not isinstance(v, dict):
        raise _fail(key, "a mapping", v)
    return v


def _numbers(v: Any, key: str, n: int | None = None, *, ints: bool = False) -> None:
    ok = _is_int if ints else _is_num
    if not isinstance(v, list) or (n is not None and len(v) != n) or not all(ok(x) for x in v):
        size = f"{n} " if n is not None else ""
        raise _fail(key, f"a list of {size}{'integers' if ints else 'finite numbers'}", v)


MAX_DEPTH = 8  # nesting of model kwargs (lists / mappings)


def plain_value(key: str, v: Any, depth: int = 0) -> None:
    """Model kwargs (a config's ``model.kwargs``, a checkpoint's ``model_kwargs``): plain YAML /
    JSON values (numbers finite), nested at most MAX_DEPTH deep; else one error naming ``key``."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{key!r} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{key!r} must be a finite number, got {v}")
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        raise ValueError(f"{key!r}: integer out of range, got {str(v)[:40]}...")
    if isinstance(v, dict):
        if len(v) > 4096:
            raise ValueError(f"{key!r}: a mapping of {len(v)} keys (at most 4096)")
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"{key!r}: key {k!r} is not a string")
            plain_value(f"{key}.{k}", x, depth + 1)
    elif isinstance(v, list):
        if len(v) > 4096:
            raise ValueError(f"{key!r}: a list of {len(v)} values (at most 4096)")
        for i, x in enumerate(v):
            plain_value(f"{key}[{i}]", x, depth + 1)
    elif v is not None and not isinstance(v, (bool, int, float, str)):
        raise TypeError(f"{key!r}: {type(v).__name__} is not a plain value")


def parse_meta(text: bytes) -> Any:
    """JSON of a checkpoint.json (size- and nesting-bounded); ValueError if unreadable."""
    if len(text) > MAX_META_BYTES:
        raise MetaError(f"{len(text)} bytes (at most {MAX_META_BYTES})")
    try:
        return json.loads(text)
    except RecursionError:
        raise MetaError("JSON nested too deeply") from None


def check_meta(meta: dict) -> None:
    """Raise MetaError unless ``meta`` (already format/version-checked) has a sound structure."""
    if not isinstance(meta.get("model"), str):
        raise _fail("model", "a model name", meta.get("model"))
    kwargs = _mapping(meta.get("model_kwargs"), "model_kwargs", optional=True)
    try:
        plain_value("model_kwargs", kwargs)
    except (TypeError, ValueError) as e:
        raise MetaError(str(e)) from None
    files = _mapping(meta.get("files"), "files")
    for name, f in files.items():
        f = _mapping(f, f"files.{name}")
        sha, size = f.get("sha256"), f.get("bytes")
        if not isinstance(sha, str) or len(sha) != 64:
            raise _fail(f"files.{name}.sha256", "a sha256 hex digest", sha)
        if not _is_int(size) or size < 0:
            raise _fail(f"files.{name}.bytes", "a size in bytes", size)
    tensors = _mapping(meta.get("tensors"), "tensors")
    for name, index in tensors.items():
        for t, entry in _mapping(index, f"tensors.{name}").items():
            key = f"tensors.{name}.{t}"
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                raise _fail(key, "[dtype, shape]", entry)
            _numbers(entry[1], key + " shape", ints=True)
            if any(not 0 <= d <= MAX_DIM for d in entry[1]):
                raise _fail(key + " shape", f"sizes in [0, {MAX_DIM}]", entry[1])
    cfg = _mapping(meta.get("config"), "config", optional=True)
    data_cfg = _mapping(cfg.get("data"), "config.data", optional=True)
    if data_cfg.get("dataset") is not None and not isinstance(data_cfg["dataset"], str):
        raise _fail("config.data.dataset", "a dataset name or path", data_cfg["dataset"])
    data = _mapping(meta.get("data"), "data", optional=True)
    if "classes" in data and not (
        isinstance(data["classes"], list) and all(isinstance(c, str) for c in data["classes"])
    ):
        raise _fail("data.classes", "a list of class names", data["classes"])
    for k in ("mean", "std"):
        if data.get(k) is not None:
            _numbers(data[k], f"data.{k}", 3)
    if data.get("std") is not None and not all(x > 0 for x in data["std"]):
        raise _fail("data.std", "positive numbers (images are divided by them)", data["std"])
    if data.get("image_size") is not None:
        _numbers(data["image_size"], "data.image_size", 2, ints=True)
    conv = _mapping(meta.get("converted"), "converted", optional=True)
    if conv.get("alpha") is not None and not (_is_num(conv["alpha"]) and conv["alpha"] > 0):
        raise _fail("converted.alpha", "a positive number or null", conv["alpha"])
    head_dim = conv.get("head_dim")
    if head_dim is not None and not (_is_int(head_dim) and head_dim > 0):
        raise _fail("converted.head_dim", "a positive integer or null", conv["head_dim"])
    if not isinstance(conv.get("on_unsupported", "error"), str):
        raise _fail("converted.on_unsupported", "a string", conv["on_unsupported"])
    state = _mapping(meta.get("state"), "state", optional=True)
    if "step" in state and not (_is_int(state["step"]) and state["step"] >= 0):
        raise _fail("state.step", "a step number", state["step"])
    if "seconds" in state and not (_is_num(state["seconds"]) and state["seconds"] >= 0):
        raise _fail("state.seconds", "a number of seconds", state["seconds"])
    sums = _mapping(state.get("sums"), "state.sums", optional=True)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in sums.values()):
        raise _fail("state.sums", "a mapping of numbers", sums)
    opt = _mapping(meta.get("optimizer"), "optimizer", optional=True)
    if opt:
        groups = opt.get("param_groups")
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise _fail("optimizer.param_groups", "a list of mappings", groups)
        for pid, d in _mapping(opt.get("scalars"), "optimizer.scalars", optional=True).items():
            if not pid.isdigit():
                raise _fail("optimizer.scalars", "keyed by parameter number", pid)
            _mapping(d, f"optimizer.scalars.{pid}")


def tensor_index(tensors: dict) -> dict[str, list]:
    """name -> [dtype, shape] of each tensor: the index checkpoint.json keeps."""
    return {k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in tensors.items()}


META_HASH = "meta_sha256"


def meta_digest(meta: dict) -> str:
    """sha256 of the metadata's canonical JSON, without its own digest (and the reader's
    ``path``): covers the normalization, config and state that the file hashes do not."""
    body = {k: v for k, v in meta.items() if k not in (META_HASH, "path")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
