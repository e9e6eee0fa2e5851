"""attnconv checkpoints: the format, and loading them defensively.

A checkpoint is a folder::

    model.safetensors   the model's state_dict (plain tensors, no pickle)
    state.safetensors   optional training state tensors (optimizer, RNG)
    checkpoint.json     format + version, model name + kwargs, config, step, names / shapes /
                        dtypes of every tensor and the sha256 + size of each .safetensors file

``attnconv.train.checkpoint`` writes them. Loading checks everything before building the model
and fails with a one-line :class:`CheckpointError` saying which problem (missing, pickle,
truncated, corrupted, foreign) and why. Nothing is ever unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from attnconv import __version__
from attnconv.convert import convert_model
from attnconv.layers.encodings.upgrade import upgrade_state_dict
from attnconv.memory import memory_bytes
from attnconv.models import create_model, list_models
from attnconv.models.budget import construction_budget
from attnconv.models.vit import VisionTransformer

from .checkpoint_meta import META_HASH, MetaError, check_meta, meta_digest, parse_meta, tensor_index
from .weights_check import check_finite

FORMAT = "attnconv-checkpoint"
VERSION = 1
META = "checkpoint.json"
WEIGHTS = "model.safetensors"
STATE = "state.safetensors"
LATEST = "latest"  # pointer file in a folder of step checkpoints


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says which problem and why.

    A ValueError whose message names the file and the problem: missing, pickle, truncated,
    corrupted or foreign.
    """


def _is_pickle(p: Path) -> bool:
    """A pickle (protocol >= 2) or torch.save zip, and not a safetensors file."""
    with open(p, "rb") as f:
        head = f.read(9)
    size = p.stat().st_size
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size:
        return False  # safetensors: u64 header length, then the JSON header
    pickled = len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5  # PROTO opcode
    return pickled or head[:4] == b"PK\x03\x04"  # torch.save zip


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder that ``path`` names: a run folder, a folder of step checkpoints
    (``latest`` pointer), that pointer, a checkpoint folder, or its checkpoint.json /
    model.safetensors.

    Args:
        path: a run folder, a checkpoints folder, a checkpoint folder, or a file in one.

    Returns:
        The checkpoint folder (the one ``latest`` names, or the last step folder written).

    Raises:
        CheckpointError: nothing there, a pickle file, a training config, or a folder without
            checkpoint metadata.
    """
    p = Path(path)
    if not p.exists():
        old = p.with_name(f".{p.name}.old")
        if old.is_dir():  # killed between the two renames of save_checkpoint's replacement
            raise CheckpointError(
                f"{p}: missing checkpoint; an interrupted save left the previous one at {old} "
                f"(rename it back to use it)"
            )
        raise CheckpointError(f"{p}: missing checkpoint (no such file or folder)")
    if p.is_file():
        if p.name in (META, WEIGHTS, STATE):
            return find_checkpoint(p.parent)
        if p.name == LATEST:  # a folder of step checkpoints' pointer: the step it names
            return find_checkpoint(follow_latest(p.parent))
        if _is_pickle(p):
            raise CheckpointError(
                f"{p}: pickle checkpoint (torch.save format); attnconv never unpickles files "
                f"(unsafe) - re-save the weights as an attnconv safetensors checkpoint"
            )
        if p.suffix in (".yaml", ".yml"):
            raise CheckpointError(
                f"{p}: a training config, not a checkpoint (train it: attnconv train {p})"
            )
        raise CheckpointError(f"{p}: foreign checkpoint (expected a folder with {META}, {WEIGHTS})")
    for sub in (p / "checkpoints", p):
        if (sub / LATEST).exists() and not (sub / META).exists():
            return find_checkpoint(follow_latest(sub))
        if sub.name == "checkpoints" and sub.is_dir() and not (sub / META).exists():
            steps = sorted(
                d
                for d in sub.glob("step-*")
                if d.is_dir() and not d.is_symlink() and (d / META).is_file()
            )
            if steps:  # killed after a step folder was written, before `latest` named it
                return steps[-1]
    if not (p / META).is_file():
        pickles = [f.name for f in p.iterdir() if f.suffix in (".pt", ".pth", ".pkl", ".bin")]
        why = f"holds {', '.join(pickles)} (pickle, never loaded)" if pickles else f"has no {META}"
        raise CheckpointError(f"{p}: missing checkpoint: the folder {why}")
    return p


def follow_latest(folder: Path) -> Path:
    """The step folder that ``folder/latest`` names. The pointer must be a regular file holding
    a plain step name inside ``folder`` (never a symlink, an absolute path or ``..``)."""
    pointer = folder / LATEST
    if pointer.is_symlink() or not pointer.is_file():
        raise CheckpointError(f"{pointer}: not a regular file (a symlink is never followed)")
    name = pointer.read_bytes()[:256].decode(errors="replace").strip()
    target = folder / name
    if not re.fullmatch(r"step-\d{1,12}", name) or target.is_symlink():
        raise CheckpointError(f"{pointer}: names {name[:40]!r}, not a step folder inside {folder}")
    return target


def read_checkpoint(path: str | Path, *, with_state: bool = False) -> tuple[dict, dict, dict]:
    """Verified (meta, weights, state_tensors) of a checkpoint; raises CheckpointError. A step
    folder removed while it is read (a training pruning its old checkpoints beside a reader
    that followed ``latest`` just before) is read again from where ``latest`` points now.

    Args:
        path: anything ``find_checkpoint`` takes.
        with_state: also read the training state tensors (optimizer, RNG).

    Returns:
        ``(meta, weights, state_tensors)``: the metadata dict (with the folder as ``path``),
        the model's state dict, and the state tensors (empty without ``with_state``).

    Raises:
        CheckpointError: missing, pickle, truncated, corrupted (a size or sha256 that differs
            from the metadata) or foreign.
    """
    for attempt in range(3):
        try:
            return _read_checkpoint(path, with_state)
        except FileNotFoundError as e:
            if attempt == 2:
                raise CheckpointError(
                    f"{path}: the checkpoint was removed while it was read, three times (a "
                    f"training pruning its checkpoints?): {e.filename}"
                ) from None
    raise AssertionError("unreachable")


def read_meta(path: str | Path) -> tuple[Path, dict]:
    """(checkpoint folder, its verified metadata) without reading a tensor.

    Args:
        path: anything ``find_checkpoint`` takes.

    Returns:
        ``(folder, meta)``: the checkpoint folder and its metadata (format, version, model
        name and arguments, config, state, file digests).

    Raises:
        CheckpointError: no checkpoint there, metadata that is not attnconv's, of a newer
            format version, or modified since it was written.
    """
    d = find_checkpoint(path)
    try:
        meta = parse_meta((d / META).read_bytes())
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, MetaError
        raise CheckpointError(
            f"{d / META}: corrupted checkpoint: metadata is not JSON ({e})"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{d}: foreign checkpoint: {META} is not attnconv metadata")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise CheckpointError(
            f"{d}: foreign checkpoint: format version {meta.get('version')!r}, this attnconv "
            f"({__version__}) reads versions <= {VERSION}"
        )
    try:
        check_meta(meta)
    except MetaError as e:
        raise CheckpointError(f"{d / META}: corrupted checkpoint: {e}") from None
    if META_HASH in meta and meta[META_HASH] != meta_digest(meta):  # older files have none
        raise CheckpointError(
            f"{d / META}: corrupted checkpoint: metadata sha256 differs (the file was modified)"
        )
    return d, meta


def _read_checkpoint(path: str | Path, with_state: bool) -> tuple[dict, dict, dict]:
    d, meta = read_meta(path)
    out = []
    for name in (WEIGHTS, STATE) if with_state else (WEIGHTS,):
        expect = meta.get("files", {}).get(name)
        f = d / name
        if expect is None:
            out.append({})
            continue
        if not f.is_file():
            raise CheckpointError(f"{f}: missing checkpoint file (listed in {META})")
        if _is_pickle(f):  # its first bytes only
            raise CheckpointError(f"{f}: pickle checkpoint file; attnconv never unpickles (unsafe)")
        size = f.stat().st_size  # before reading: never read a file whole to learn its size
        if size < expect["bytes"]:
            raise CheckpointError(f"{f}: truncated checkpoint: {size} of {expect['bytes']} bytes")
        if size != expect["bytes"]:
            raise CheckpointError(
                f"{f}: corrupted checkpoint: sha256/size differ from {META} (file was modified)"
            )
        if size > memory_bytes() // 2:
            raise CheckpointError(
                f"{f}: {size / 2**30:.1f} GiB, more than half this machine's memory"
            )
        data = f.read_bytes()  # its size was checked above; a change since is caught here
        if len(data) != expect["bytes"] or hashlib.sha256(data).hexdigest() != expect["sha256"]:
            raise CheckpointError(
                f"{f}: corrupted checkpoint: sha256/size differ from {META} (file was modified)"
            )
        try:
            tensors = st_load(data)
        except (SafetensorError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"{f}: corrupted checkpoint: unreadable safetensors ({e})"
            ) from None
        index = tensor_index(tensors)
        if index != meta["tensors"].get(name):
            raise CheckpointError(
                f"{f}: corrupted checkpoint: tensors differ from the index in {META}"
            )
        out.append(tensors)
    if not with_state:
        out.append({})
    meta["path"] = str(d)
    return meta, out[0], out[1]


def _resampled(model: nn.Module, key: str, w: torch.Tensor, own: torch.Tensor) -> bool:
    """A ViT's learned position embeddings of another square grid: loading resamples them
    (``VisionTransformer._load_from_state_dict``), as ``img_size=`` asks."""
    if key != "pos_embed" or not isinstance(model, VisionTransformer) or w.dim() != 3:
        return False
    n = w.shape[1] - model.num_prefix_tokens
    square = n > 0 and math.isqrt(n) ** 2 == n
    return square and (w.shape[0], w.shape[2], w.dtype) == (own.shape[0], own.shape[2], own.dtype)


def check_fits(model: nn.Module, weights: dict[str, torch.Tensor], where: str, name: str) -> None:
    """Names, shapes and dtypes of ``weights`` must match ``model`` exactly (a ViT's
    ``pos_embed`` may be of another grid: it is resampled)."""
    own = {k: v for k, v in model.state_dict().items()}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = [
        f"{k} {tuple(weights[k].shape)}/{weights[k].dtype} vs {tuple(v.shape)}/{v.dtype}"
        for k, v in own.items()
        if k in weights
        and (weights[k].shape != v.shape or weights[k].dtype != v.dtype)
        and not _resampled(model, k, weights[k], v)
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
        if unexpected:
            more = " ..." if len(unexpected) > 3 else ""
            parts.append(f"unexpected {', '.join(unexpected[:3])}{more}")
        if wrong:
            parts.append(f"shape/dtype {'; '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}")
        raise CheckpointError(
            f"{where}: foreign checkpoint: weights don't fit model {name!r} ({'; '.join(parts)})"
        )


def _first_line(e: BaseException) -> str:
    """An exception's message as one line of at most 200 characters (its type if empty)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def stored_dtype(weights: dict[str, torch.Tensor]) -> torch.dtype | None:
    """The one floating dtype of all floating ``weights`` (a model saved after ``.to(dtype)``),
    None if they mix several or hold none."""
    dtypes = {t.dtype for t in weights.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _build(
    meta: dict,
    overrides: dict,
    on_meta: bool,
    max_bytes: int | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """The model ``meta`` describes (converted if it was), cast to ``dtype`` if given (the
    weights'); ``on_meta``: shapes only, on the meta device, and never converted (the
    conversion reads weight values), its parameters and modules counted as they are
    registered and refused past ``max_bytes`` (models/budget.py). Any failure to build (a bad
    model_kwargs value) is one CheckpointError."""
    name, where = meta["model"], meta["path"]
    budget = (
        construction_budget(max_bytes, f"its config ({name!r})")
        if on_meta and max_bytes is not None
        else contextlib.nullcontext()
    )
    try:
        with torch.device("meta") if on_meta else contextlib.nullcontext(), budget:
            model = create_model(name, **{**(meta.get("model_kwargs") or {}), **overrides})
        conv = meta.get("converted")  # written by `attnconv convert --out`
        if isinstance(conv, dict) and not on_meta:
            model = convert_model(
                model,
                alpha=conv.get("alpha"),
                head_dim=conv.get("head_dim"),
                on_unsupported=conv.get("on_unsupported", "error"),
                inplace=True,
            )
        if dtype is not None and dtype != torch.float32:
            model = model.to(dtype)
    except Exception as e:  # noqa: BLE001 - a crafted config fails anywhere in a constructor
        raise CheckpointError(
            f"{where}: foreign checkpoint: cannot build {name!r} from its model_kwargs "
            f"({type(e).__name__}: {_first_line(e)})"
        ) from None
    return model


def _check_size(
    meta: dict, overrides: dict, weights: dict[str, torch.Tensor], dtype: torch.dtype | None
) -> None:
    """Before allocating: the model ``meta`` declares, built on the meta device, must fit the
    weight file (exactly; a converted model's base within 8x its size), so a crafted config
    (a huge width) is refused without allocating it."""
    have = sum(t.numel() * t.element_size() for t in weights.values())
    probe = _build(meta, overrides, True, max_bytes=memory_bytes() // 2, dtype=dtype)
    if not isinstance(meta.get("converted"), dict):
        return check_fits(probe, weights, meta["path"], meta["model"])
    need = sum(t.numel() * t.element_size() for t in probe.state_dict().values())
    if need > 8 * have + (1 << 20):
        raise CheckpointError(
            f"{meta['path']}: foreign checkpoint: its config declares a {need / 2**20:.1f} MiB "
            f"model, the weight file holds {have / 2**20:.1f} MiB"
        )


def load_model(
    path: str | Path, *, model_name: str | None = None, **overrides
) -> tuple[nn.Module, dict]:
    """Rebuild the model a checkpoint was saved from and load its weights; returns (model, info).

    ``model_name``, if given, must match the stored one. ``overrides`` are extra
    ``create_model`` arguments that don't change the weights (e.g. ``backend``, or ``img_size``
    for a ViT: its position embeddings are resampled); one given as None is the checkpoint's.
    The model comes back in the weights' dtype (a bfloat16 checkpoint as a bfloat16 model).

    Args:
        path: anything ``find_checkpoint`` takes.
        model_name: the model the checkpoint must hold (None: whichever it holds).
        **overrides (Any): extra ``create_model`` arguments that leave the weights' shapes
            as they are.

    Returns:
        ``(model, meta)``: the model with the checkpoint's weights, in eval mode, and the
        checkpoint's metadata.

    Raises:
        CheckpointError: the checkpoint cannot be read, holds another or an unknown model,
            non-finite weights, or weights that do not fit the model built.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}  # None: the checkpoint's
    meta, weights, _ = read_checkpoint(path)
    where = meta["path"]
    name = meta.get("model")
    if model_name is not None and name != model_name:
        raise CheckpointError(f"{where}: foreign checkpoint: it holds {name!r}, not {model_name!r}")
    if name not in list_models():
        raise CheckpointError(
            f"{where}: foreign checkpoint: model {name!r} is not in this attnconv"
        )
    try:
        weights = upgrade_state_dict(weights)  # quadratic alpha -> spread (older checkpoints)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    check_finite(weights, where, CheckpointError)  # what every command loads is finite
    dtype = stored_dtype(weights)
    _check_size(meta, overrides, weights, dtype)  # on the meta device, before allocating
    model = _build(meta, overrides, False, dtype=dtype)
    check_fits(model, weights, where, name)
    try:
        model.load_state_dict(weights, strict=True)
    except (RuntimeError, ValueError) as e:  # e.g. a pos_embed that cannot be resampled
        raise CheckpointError(f"{where}: foreign checkpoint: {_first_line(e)}") from None
    model.eval()
    return model, meta
