"""Training: YAML configs, the resumable loop (one process or torchrun), safetensors checkpoints
(written here, read by ``attnconv.loading``).

    from attnconv.train import load_config, train, load_model
    cfg = load_config(find_recipe("cpu/sa_quadratic"), ["train.epochs=1"])
    train(cfg)                      # writes runs/... (checkpoints, metrics.csv, centers.jsonl)
    model, info = load_model(cfg.out_dir)
"""

from attnconv.loading import CheckpointError, load_model

from .checkpoint import save_checkpoint
from .config import Config, config_from_dict, load_config
from .evaluation import evaluate
from .loop import Trainer
from .run import train
from .stopping import Interrupted, NonFiniteLoss

__all__ = [
    "CheckpointError",
    "Config",
    "Interrupted",
    "NonFiniteLoss",
    "Trainer",
    "config_from_dict",
    "evaluate",
    "load_config",
    "load_model",
    "save_checkpoint",
    "train",
]
