"""What ``--resume`` accepts: the same run (model, config up to the keys that may change) and a
complete, well-formed training state. Anything else is one line naming the key or the state."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from attnconv.loading.checkpoint import CheckpointError, check_fits, read_checkpoint

from .checkpoint import optimizer_from_tensors
from .config import Config

# config keys that may change on --resume without changing the run. Not bit for bit in every
# case: train.threads changes how CPU kernels split their sums (gradients differ in float32
# roundoff, 3e-6 between 1 and 2 threads); data.dataset may name the same file at another path.
RESUME_FREE = {
    "train.progress",
    "train.log_every",
    "train.tensorboard",
    "train.threads",
    "train.flush_subnormals",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.keep_every",
    "out_dir",
    "data.root",
    "data.cache_dir",
    "data.download",
    "data.dataset",
}


def flat(d: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` (model.kwargs stays one value)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "kwargs":
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def check_same_config(meta: dict, cfg: Config) -> None:
    """Raise unless ``cfg`` is checkpoint ``meta``'s config up to the keys that may change
    (checked from the metadata alone, before any data or weights are read)."""
    old, new = flat(meta.get("config") or {}), flat(cfg.to_dict())
    # a key a later version added is not in an older run's config: the run had its default
    default = flat(Config().to_dict())
    changed = sorted(
        k
        for k in set(old) | set(new)
        if old.get(k, default.get(k)) != new.get(k) and k not in RESUME_FREE
    )
    # the dataset may move (another machine's path to it), not change: the same file name
    a, b = old.get("data.dataset"), new.get("data.dataset")
    if a != b and Path(str(a)).name != Path(str(b)).name:
        changed = sorted([*changed, "data.dataset"])
    if changed:
        raise ValueError(
            f"--resume: config differs from the checkpoint's in {', '.join(changed)} "
            "(resuming would not continue the same run; use a new out_dir)"
        )


def check_resumable(
    meta: dict, state_tensors: dict, cfg: Config, model_kwargs: dict, sums: set[str]
) -> torch.Tensor:
    """Raise unless checkpoint ``meta`` continues the run ``cfg`` describes and holds a complete
    training state (step, running sums, optimizer, RNG of this torch's size); returns the RNG
    state to restore."""
    where = meta["path"]
    if meta["model"] != cfg.model.name or meta.get("model_kwargs") != model_kwargs:
        raise CheckpointError(
            f"{where}: foreign checkpoint for this run: it holds {meta['model']} "
            f"{meta.get('model_kwargs')}, the config asks for {cfg.model.name} {model_kwargs}"
        )
    check_same_config(meta, cfg)
    rng, want, state = state_tensors.get("rng.torch"), torch.get_rng_state(), meta["state"]
    if rng is None or rng.dtype != want.dtype or rng.shape != want.shape:
        got = "none" if rng is None else f"{rng.dtype} {tuple(rng.shape)}"
        raise CheckpointError(
            f"{where}: corrupted checkpoint: RNG state rng.torch is {got}, expected "
            f"{want.dtype} {tuple(want.shape)}"
        )
    if not isinstance(state.get("step"), int) or set(state.get("sums", {})) != sums:
        raise CheckpointError(f"{where}: corrupted checkpoint: no resumable training state")
    if not isinstance(meta.get("optimizer"), dict):
        raise CheckpointError(f"{where}: corrupted checkpoint: no optimizer state")
    return rng


def restore(
    ckdir: Path,
    cfg: Config,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    model_kwargs: dict,
    sums: set[str],
) -> dict:
    """Load the newest checkpoint of ``ckdir`` into ``model`` and ``opt`` and restore torch's RNG,
    after checking that it continues the run ``cfg`` (``check_resumable``), fits the model and
    holds only finite weights (never resumed from, never called "last good"); returns its meta
    (``meta["state"]``: step, evaluated, sums)."""
    meta, weights, st = read_checkpoint(ckdir, with_state=True)
    rng = check_resumable(meta, st, cfg, model_kwargs, sums)
    check_fits(model, weights, meta["path"], meta["model"])
    try:
        optimizer_from_tensors(opt, st, meta["optimizer"])
    except CheckpointError as e:
        raise CheckpointError(f"{meta['path']}: corrupted checkpoint: {e}") from None
    model.load_state_dict(weights)
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise CheckpointError(
            f"{meta['path']}: checkpoint holds non-finite weights ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}); resume from an earlier checkpoint"
        )
    torch.set_rng_state(rng)
    return meta
