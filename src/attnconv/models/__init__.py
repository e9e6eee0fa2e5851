"""Paper models behind one registry. Each model module registers its factories on import."""

from . import resnet, sa_cifar, sasa, tiny, transformer, vit  # noqa: F401 (register the models)
from .registry import create_model, list_models, register_model

__all__ = ["create_model", "list_models", "register_model"]
