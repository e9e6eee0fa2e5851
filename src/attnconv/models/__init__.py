"""Paper models behind one registry. Each model module registers its factories on import.

This package builds modules only; ``attnconv.loading`` loads weights into them."""

from . import resnet, sa_cifar, sasa, tiny, transformer, vit, vit_zoo  # noqa: F401 (register the models)
from .registry import check_model_args, create_model, list_models, register_model

__all__ = ["check_model_args", "create_model", "list_models", "register_model"]
