"""The tiny training run the reliability tests start from: tiny_cnn on 20 real CIFAR-10 images,
a checkpoint every step (2 steps an epoch)."""

from __future__ import annotations

from pathlib import Path

import yaml


def tiny_config(
    tmp_path: Path, cifar_zip: Path, *, epochs: int, max_per_class: int = 2, **top
) -> str:
    """Write the run's YAML config into ``tmp_path``; ``top`` adds top-level keys (out_dir)."""
    d = {
        "model": {"name": "tiny_cnn", "kwargs": {"width": 4}},
        "data": {
            "dataset": str(cifar_zip),
            "max_per_class": max_per_class,
            "eval_max_per_class": 1,
            "cache_dir": str(tmp_path / "cache"),
        },
        "train": {
            "epochs": epochs,
            "batch_size": 10,
            "threads": 1,
            "progress": False,
            "checkpoint_every": 1,
        },
        **top,
    }
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(d))
    return str(f)
