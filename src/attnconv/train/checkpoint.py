"""Writing checkpoints: safetensors weights + JSON metadata, written atomically.

The format, and loading, are ``attnconv.loading.checkpoint`` (its names are importable from here
too). Each file goes through temp file + fsync + rename, the folder is assembled under a
temporary name and renamed into place, so a crash never leaves a half-written checkpoint under
the real name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save as st_save

from attnconv import __version__

# the format; the reading side (LATEST, CheckpointError, find / follow / read, load_model) stays
# importable from here, where it is documented
from attnconv.loading.checkpoint import (  # noqa: F401
    FORMAT,
    LATEST,
    META,
    META_HASH,
    STATE,
    VERSION,
    WEIGHTS,
    CheckpointError,
    find_checkpoint,
    follow_latest,
    load_model,
    meta_digest,
    read_checkpoint,
    tensor_index,
)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask (read, not changed: /proc where it says, else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, fsync, rename; the
    file's mode follows the umask, as a plain open() would (mkstemp's is 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk says which file it failed to write
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(path.parent)


def _plain(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in tensors.items()}


def optimizer_to_tensors(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Split an optimizer state_dict into safetensors-able tensors and JSON-able rest."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"optim.{pid}.{k}"] = v
            else:
                scalars.setdefault(str(pid), {})[k] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_tensors(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    """Load the optimizer state split by :func:`optimizer_to_tensors`; a state that does not fit
    ``opt`` (parameter count, a buffer's shape) is a CheckpointError, never loaded."""
    params = [p for g in opt.param_groups for p in g["params"]]
    state: dict[int, dict] = {}
    for name, v in tensors.items():
        if name.startswith("optim."):
            _, pid, k = name.split(".", 2)
            i = int(pid) if pid.isdigit() else -1
            if not 0 <= i < len(params) or (v.dim() > 0 and v.shape != params[i].shape):
                want = tuple(params[i].shape) if 0 <= i < len(params) else "no such parameter"
                raise CheckpointError(
                    f"optimizer state {name} has shape {tuple(v.shape)}, the parameter {want}"
                )
            state.setdefault(i, {})[k] = v
    for pid, d in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(d)
    groups = [
        {k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]
    ]
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"optimizer state does not fit this optimizer ({e})") from None


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    model_name: str,
    model_kwargs: dict,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    state: dict | None = None,
    state_tensors: dict[str, torch.Tensor] | None = None,
    config: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Write a checkpoint folder ``path`` (replacing an existing one atomically).

    ``state`` (JSON) and ``state_tensors`` hold the training state (step, RNG, ...) and
    ``optimizer`` its state; ``extra`` is merged into the metadata (e.g. data mean/std, classes).

    Args:
        path: the checkpoint folder to write (not a ``.safetensors`` file).
        model: the model (a DDP or ``torch.compile`` wrapper is unwrapped).
        model_name: its registered name, which ``load_model`` rebuilds.
        model_kwargs: its ``create_model`` keyword arguments.
        optimizer: its state goes into ``state.safetensors`` too.
        state: JSON training state (step, epoch, ...).
        state_tensors: training state tensors (RNG states, ...).
        config: the run's config as a dict (``Config.to_dict()``).
        extra: more metadata (the data's mean and std, the class names, ...).

    Returns:
        The checkpoint folder.

    Raises:
        ValueError: ``path`` names a ``.safetensors`` file.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        raise ValueError(f"{path}: save_checkpoint writes a folder, give a folder path")
    path.parent.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # DDP
    model = getattr(model, "_orig_mod", model)  # torch.compile
    weights = _plain(model.state_dict())
    st_tensors = dict(state_tensors or {})
    opt_meta = None
    if optimizer is not None:
        t, opt_meta = optimizer_to_tensors(optimizer)
        st_tensors.update(t)
    st_tensors = _plain(st_tensors)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~umask())  # as mkdir would (mkdtemp's is 0700)
    try:
        files = {WEIGHTS: st_save(weights)}
        if st_tensors:
            files[STATE] = st_save(st_tensors)
        for name, data in files.items():
            atomic_write(tmp / name, data)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "attnconv_version": __version__,
            "model": model_name,
            "model_kwargs": model_kwargs,
            "config": config,
            "state": state or {},
            "optimizer": opt_meta,
            "tensors": {WEIGHTS: tensor_index(weights), STATE: tensor_index(st_tensors)},
            "files": {
                n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
                for n, d in files.items()
            },
            **(extra or {}),
        }
        meta[META_HASH] = meta_digest(meta)  # the metadata itself (normalization, config)
        atomic_write(tmp / META, json.dumps(meta, indent=1).encode())
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # put the previous checkpoint back
                os.replace(old, path)
            raise
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def prune_checkpoints(ckdir: Path, current: Path, keep: int, every: int | None) -> None:
    """Remove all but the newest ``keep`` step folders of ``ckdir``, never ``current`` nor a
    milestone (step-N with N a multiple of ``every``)."""
    steps = sorted(p for p in ckdir.glob("step-*") if p.is_dir())
    for old in steps[:-keep]:
        n = old.name[5:]
        if old != current and not (every and n.isdigit() and int(n) % every == 0):
            shutil.rmtree(old, ignore_errors=True)
